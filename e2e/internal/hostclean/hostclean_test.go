package hostclean

import (
	"os"
	"path/filepath"
	"testing"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", "/plain": "/plain", `/t\011x`: "/t\tx"} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMountsUnderNothing(t *testing.T) {
	mounts, err := MountsUnder(t.TempDir())
	if err != nil || len(mounts) != 0 {
		t.Errorf("MountsUnder(fresh dir) = %v, %v", mounts, err)
	}
}

func TestRemoveRunDirKeepsLogs(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"logs/kubelet.log", "containerd/state/x", "pki/ca.crt"} {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := RemoveRunDir(dir); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "logs" {
		t.Fatalf("left %v, want only logs", entries)
	}
	if _, err := os.Stat(filepath.Join(dir, "logs/kubelet.log")); err != nil {
		t.Fatal(err)
	}
}
