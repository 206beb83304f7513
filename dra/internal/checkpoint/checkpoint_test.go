package checkpoint_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
)

func claim(uid string) checkpoint.Claim {
	return checkpoint.Claim{UID: uid, Namespace: "default", Name: "c-" + uid, Devices: []checkpoint.Device{{
		Requests: []string{"gpu"}, Pool: "node", Device: "gpu-0", UUID: "GPU-1", CDIDeviceIDs: []string{"nvidia.com/gpu=GPU-1"},
	}}}
}

// Claims survive a reopen (a driver restart); Delete is idempotent.
func TestPersistsAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range []string{"b", "a"} {
		if err := s.Put(claim(uid)); err != nil {
			t.Fatal(err)
		}
	}
	if had, err := s.Delete("b"); !had || err != nil {
		t.Fatalf("Delete(b) = %v, %v", had, err)
	}
	if had, err := s.Delete("b"); had || err != nil {
		t.Fatalf("second Delete(b) = %v, %v; want false, nil", had, err)
	}
	r, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.All(); !reflect.DeepEqual(got, []checkpoint.Claim{claim("a")}) {
		t.Errorf("after reopen: %+v, want claim a only", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("state dir holds %d files, want the checkpoint only (temp files left behind?)", len(entries))
	}
}

func TestOpenRefusesBadFiles(t *testing.T) {
	for name, content := range map[string]string{
		"corrupt":      "{not json",
		"version":      `{"version": 7, "claims": {}}`,
		"mismatch uid": `{"version": 1, "claims": {"a": {"uid": "b"}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, checkpoint.FileName)
			if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := checkpoint.Open(dir)
			if err == nil || !strings.Contains(err.Error(), p) {
				t.Fatalf("Open = %v, want an error naming %s", err, p)
			}
		})
	}
}

func TestPutWithoutUID(t *testing.T) {
	s, err := checkpoint.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(checkpoint.Claim{Name: "x"}); err == nil {
		t.Fatal("a claim without UID was checkpointed")
	}
	if s.Len() != 0 {
		t.Errorf("Len = %d after a refused Put", s.Len())
	}
}

// A failed write keeps the previous content: a directory where the
// checkpoint belongs makes the rename fail, even for root.
func TestWriteFailureKeepsState(t *testing.T) {
	dir := t.TempDir()
	s, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.Path(), "blocker"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(claim("a")); err == nil {
		t.Fatal("Put succeeded although the checkpoint path is a directory")
	}
	if _, ok := s.Get("a"); ok {
		t.Error("the claim is recorded although its write failed")
	}
}
