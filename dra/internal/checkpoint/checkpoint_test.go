package checkpoint_test

import (
	"encoding/json"
	"fmt"
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
	s.Close()
	r, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := r.All(); !reflect.DeepEqual(got, []checkpoint.Claim{claim("a")}) {
		t.Errorf("after reopen: %+v, want claim a only", got)
	}
	var names []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{checkpoint.JournalName, checkpoint.FileName}; !reflect.DeepEqual(names, want) {
		t.Errorf("state dir holds %v, want %v (temp files left behind?)", names, want)
	}
	if fi, err := os.Stat(filepath.Join(dir, checkpoint.JournalName)); err != nil || fi.Size() != 0 {
		t.Errorf("journal after reopen: %v, %v; want it folded into the snapshot and empty", fi, err)
	}
}

// A crash can leave a half-written last line (its call never returned, so
// no one was told) or a journal the snapshot already holds (the driver died
// between rewriting the snapshot and emptying the journal): both reopen to
// the state the returned calls made.
func TestJournalRecovery(t *testing.T) {
	a, b := claim("a"), claim("b")
	line := func(r string) string { return r + "\n" }
	put := func(c checkpoint.Claim) string {
		data, _ := json.Marshal(map[string]any{"put": c})
		return string(data)
	}
	for _, tc := range []struct {
		name, snapshot, journal string
		want                    []checkpoint.Claim
	}{
		{"torn last line", "", line(put(a)) + put(b)[:20], []checkpoint.Claim{a}},
		{"journal over an empty dir", "", line(put(a)) + line(put(b)) + line(`{"delete":"a"}`), []checkpoint.Claim{b}},
		{"snapshot already holds the journal", `{"version":1,"claims":{"b":` + mustJSON(b) + `}}`, line(put(a)) + line(put(b)) + line(`{"delete":"a"}`), []checkpoint.Claim{b}},
		{"only a torn line", `{"version":1,"claims":{"a":` + mustJSON(a) + `}}`, `{"put":{"ui`, []checkpoint.Claim{a}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.snapshot != "" {
				if err := os.WriteFile(filepath.Join(dir, checkpoint.FileName), []byte(tc.snapshot), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, checkpoint.JournalName), []byte(tc.journal), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := checkpoint.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.All(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("reopened to %+v, want %+v", got, tc.want)
			}
			s.Close()
			again, err := checkpoint.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer again.Close()
			if got := again.All(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("second reopen: %+v, want %+v", got, tc.want)
			}
		})
	}
}

// A complete line that is not a record is corruption, not a torn write:
// the store refuses to open and names the journal and the line.
func TestJournalCorruptLine(t *testing.T) {
	for name, journal := range map[string]string{
		"not json":        "{\"put\":{\"uid\":\"a\"}}\nnot json\n",
		"neither op":      "{}\n",
		"both ops":        "{\"put\":{\"uid\":\"a\"},\"delete\":\"a\"}\n",
		"put without uid": "{\"put\":{\"name\":\"x\"}}\n",
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, checkpoint.JournalName)
			if err := os.WriteFile(p, []byte(journal), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := checkpoint.Open(dir)
			if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "line") {
				t.Fatalf("Open = %v, want an error naming %s and the line", err, p)
			}
		})
	}
}

// Many changes keep the journal bounded: it is folded into the snapshot
// when full, and everything reopens.
func TestJournalCompacts(t *testing.T) {
	dir := t.TempDir()
	s, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var want []checkpoint.Claim
	for i := range 700 {
		c := claim(fmt.Sprintf("%04d", i))
		if err := s.Put(c); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := s.Delete(c.UID); err != nil {
				t.Fatal(err)
			}
		} else {
			want = append(want, c)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, checkpoint.JournalName))
	if err != nil {
		t.Fatal(err)
	}
	if one := len(mustJSON(map[string]any{"put": claim("0000")})) + 1; fi.Size() > int64(300*one) {
		t.Errorf("journal is %d bytes after 1050 changes, want it emptied into the snapshot every few hundred records (~%d bytes each)", fi.Size(), one)
	}
	s.Close()
	r, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := r.All(); !reflect.DeepEqual(got, want) {
		t.Errorf("reopened with %d claims, want %d", len(got), len(want))
	}
}

func mustJSON(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(data)
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

// A failed write keeps the previous content: once the journal is full the
// snapshot is rewritten, and a directory where it belongs makes the rename
// fail, even for root.
func TestWriteFailureKeepsState(t *testing.T) {
	dir := t.TempDir()
	s, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := os.MkdirAll(filepath.Join(s.Path(), "blocker"), 0o700); err != nil {
		t.Fatal(err)
	}
	var failed string
	for i := 0; failed == "" && i < 1000; i++ {
		uid := fmt.Sprint(i)
		if err := s.Put(claim(uid)); err != nil {
			failed = uid
		}
	}
	if failed == "" {
		t.Fatal("1000 Puts succeeded although the snapshot path is a directory: the journal is never folded into the snapshot")
	}
	if _, ok := s.Get(failed); ok {
		t.Error("the claim is recorded although its write failed")
	}
	if err := s.Put(claim(failed)); err == nil {
		t.Error("a Put after a failed fold succeeded: the journal must not grow past its limit while the snapshot cannot be written")
	}
}

// A closed store refuses changes instead of losing them.
func TestClosedStoreRefusesChanges(t *testing.T) {
	s, err := checkpoint.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := s.Put(claim("a")); err == nil {
		t.Fatal("Put on a closed store succeeded")
	}
	if s.Len() != 0 {
		t.Errorf("Len = %d after a refused Put", s.Len())
	}
}
