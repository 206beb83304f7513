package health

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nvinject/nvinject/shared/durable"
)

// checkpointKind and checkpointVersion tell nvinject's health checkpoint
// from any other file at the same path.
const (
	checkpointKind    = "nvinject.io/device-plugin-health"
	checkpointVersion = 1
	// maxCheckpoint bounds what is read: a few hundred bytes per GPU.
	maxCheckpoint = 1 << 20
)

// mark is what lasts across restarts about one GPU.
type mark struct {
	Lost  string    `json:"lost,omitempty"`
	Xid   uint64    `json:"xid,omitempty"`
	XidAt time.Time `json:"xidAt,omitzero"`
}

type checkpointFile struct {
	Kind    string          `json:"kind"`
	Version int             `json:"version"`
	GPUs    map[string]mark `json:"gpus"`
}

func (t *Tracker) marks() map[string]mark {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.marksLocked()
}

func (t *Tracker) marksLocked() map[string]mark {
	out := map[string]mark{}
	for u, d := range t.devs {
		if m := (mark{Lost: d.lost, Xid: d.xid, XidAt: d.xidAt}); m.Lost != "" || !m.XidAt.IsZero() {
			if m.XidAt.IsZero() {
				m.Xid = 0
			}
			out[u] = m
		}
	}
	return out
}

// save writes the marks atomically: a temporary file in the same
// directory, synced, renamed over the checkpoint, the directory synced.
// A failure is logged: health still works, it only would not survive a
// restart.
func (t *Tracker) save(marks map[string]mark) {
	if t.checkpoint == "" {
		return
	}
	if err := writeCheckpoint(t.checkpoint, marks); err != nil {
		t.log.Warn("cannot write the health checkpoint; GPU health will not survive a plugin restart", "path", t.checkpoint, "error", err)
	}
}

func encodeCheckpoint(marks map[string]mark) ([]byte, error) {
	data, err := json.MarshalIndent(checkpointFile{Kind: checkpointKind, Version: checkpointVersion, GPUs: marks}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return append(data, '\n'), nil
}

func writeCheckpoint(path string, marks map[string]mark) error {
	data, err := encodeCheckpoint(marks)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w; check --state-dir", dir, err)
	}
	if err := durable.WriteFile(path, data); err != nil {
		return fmt.Errorf("write the health checkpoint: %w; check --state-dir is writable", err)
	}
	return nil
}

// readCheckpoint returns the marks in path; a missing file is no marks.
func readCheckpoint(path string) (map[string]mark, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return decodeCheckpoint(f)
}

// decodeCheckpoint reads at most maxCheckpoint bytes of a checkpoint and
// rejects anything but nvinject's own kind and version with valid entries.
func decodeCheckpoint(r io.Reader) (map[string]mark, error) {
	var cp checkpointFile
	dec := json.NewDecoder(&limited{r, maxCheckpoint})
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cp); err != nil {
		return nil, fmt.Errorf("not a readable health checkpoint: %w", err)
	}
	if cp.Kind != checkpointKind || cp.Version != checkpointVersion {
		return nil, fmt.Errorf("foreign checkpoint (kind %q version %d; want %q version %d)", bound(cp.Kind), cp.Version, checkpointKind, checkpointVersion)
	}
	for u, m := range cp.GPUs {
		if !strings.HasPrefix(u, "GPU-") || (m.Lost == "" && m.XidAt.IsZero()) || len(m.Lost) > 256 {
			return nil, fmt.Errorf("corrupt checkpoint: entry %q is not a GPU UUID with a lost or Xid mark", bound(u))
		}
	}
	return cp.GPUs, nil
}

func bound(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

type limited struct {
	r io.Reader
	n int64
}

func (l *limited) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, fmt.Errorf("larger than %d bytes", maxCheckpoint)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// restore applies the checkpoint's marks to the GPUs still published.
func (t *Tracker) restore() {
	marks, err := readCheckpoint(t.checkpoint)
	if err != nil {
		t.log.Warn("ignoring the health checkpoint; GPUs start from NVML's answer alone", "path", t.checkpoint, "error", err)
		return
	}
	t.apply(marks, "the health checkpoint of an earlier run")
}

// apply sets the marks of the GPUs still published; from says where they
// came from.
func (t *Tracker) apply(marks map[string]mark, from string) {
	for u, m := range marks {
		d, ok := t.devs[u]
		if !ok {
			t.log.Info("health marks name a GPU this plugin no longer publishes; dropping it", "uuid", u, "from", from)
			continue
		}
		d.lost, d.xid, d.xidAt = m.Lost, m.Xid, m.XidAt
		t.log.Warn("GPU Unhealthy from "+from, "uuid", u, "lost", m.Lost, "xid", m.Xid, "xid_at", m.XidAt)
		if d.lost == "" {
			t.restoreQuiet(d)
		}
	}
}

// restoreQuiet schedules the recheck of a restored Xid for what is left of
// its quiet period.
func (t *Tracker) restoreQuiet(d *device) {
	t.scheduleAfterLocked(d, max(t.quiet-time.Since(d.xidAt), 0))
}
