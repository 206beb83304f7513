package durable

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, path string)
		data  string
	}{
		{"new file", func(*testing.T, string) {}, "one"},
		{"replaces the old content", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("a much longer old content"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "new"},
		{"empty content", func(*testing.T, string) {}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state.json")
			tc.setup(t, path)
			if err := WriteFile(path, []byte(tc.data)); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != tc.data {
				t.Fatalf("content = %q, %v; want %q", got, err, tc.data)
			}
			st, err := os.Stat(path)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("mode = %v, %v; want 0600", st.Mode().Perm(), err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Errorf("dir holds %d entries, want only the file: a temporary file was left", len(ents))
			}
		})
	}
}

// A failed write leaves the target as it was and no temporary file.
func TestWriteFileFailureKeepsTheOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A directory in the target's place: the rename fails after the write.
	target := filepath.Join(dir, "sub")
	if err := os.MkdirAll(filepath.Join(target, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(target, []byte("new")); err == nil {
		t.Fatal("WriteFile over a non-empty directory succeeded")
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Errorf("other file changed: %q", got)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("dir holds %d entries, want 2: a temporary file was left", len(ents))
	}
	if err := WriteFile(filepath.Join(dir, "missing", "f"), []byte("x")); err == nil {
		t.Error("WriteFile into a missing directory succeeded")
	}
}
