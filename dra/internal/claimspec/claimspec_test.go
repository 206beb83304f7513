package claimspec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvinject/nvinject/dra/internal/claimconfig"
)

// A UID that cannot name a CDI device writes nothing; removing a spec that
// is not there is no error; the MPS seam refuses with what to use.
func TestWriteRemoveEdits(t *testing.T) {
	dir := t.TempDir()
	d := New(dir, "nvidia.com")
	if err := d.Write("bad/uid", []string{"GPU-1"}, specs.ContainerEdits{Env: []string{"A=1"}}, nil); err == nil || !strings.Contains(err.Error(), "cannot name a CDI device") {
		t.Errorf("bad UID: err = %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("files %v after a refused write", entries)
	}
	edits, err := Edits("u1", claimconfig.TimeSlicing)
	if err != nil || len(edits.Env) != 1 || edits.Env[0] != "NVINJECT_SHARED_CLAIM=u1" {
		t.Fatalf("time-slicing edits %+v, %v", edits, err)
	}
	if err := d.Write("u1", []string{"GPU-2", "GPU-1"}, edits, nil); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "nvidia.com-claim_u1.json"))
	if err != nil || !strings.Contains(string(data), `"nvinject.io/shared-claim-uuids":"GPU-1,GPU-2"`) {
		t.Errorf("spec %s, %v; want the sorted UUIDs", data, err)
	}
	if err := d.Remove("u1"); err != nil {
		t.Fatal(err)
	}
	if err := d.Remove("u1"); err != nil {
		t.Errorf("second remove: %v", err)
	}
	if e, err := Edits("u1", claimconfig.MPS); err != nil || len(e.Env) != 1 {
		t.Errorf("MPS edits %+v, %v; want the claim's UID (the driver adds the daemon's)", e, err)
	}
	if _, err := Edits("u1", "Other"); err == nil {
		t.Error("an unknown strategy has edits")
	}
}

// A claim UID names files on the host: one that is not a single name is
// refused by Write and Remove alike, and nothing outside the dir changes.
func TestUIDThatIsNoFileName(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "cdi")
	victim := filepath.Join(parent, "victim.json")
	if err := os.WriteFile(victim, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := New(dir, "nvidia.com")
	for _, uid := range []string{"../../victim", "a/b", "..", ""} {
		if err := d.Write(uid, []string{"GPU-a"}, specs.ContainerEdits{}, nil); err == nil {
			t.Errorf("Write(%q) succeeded", uid)
		}
		// "../../victim" would be parent/cdi/<prefix>../../victim.json.
		if err := d.Remove(uid); err == nil || !strings.Contains(err.Error(), "cannot name a CDI device or a file") {
			t.Errorf("Remove(%q) = %v", uid, err)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("the file beside the spec dir is gone: %v", err)
	}
}
