// Package checkpoint keeps the DRA driver's prepared claims in its state
// directory, so NodeUnprepareResources and a repeated NodePrepareResources
// answer the same after the driver or kubelet restarts.
//
// A change is durable before the call that made it returns, at the cost of
// one fdatasync: it is appended as one line to a journal beside the
// snapshot. The snapshot is rewritten atomically (temp file, fsync, rename,
// fsync of the directory) only when the store opens over a non-empty
// journal and when the journal reaches its record limit, which then starts
// empty again.
package checkpoint

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/durable"
)

// FileName is the snapshot's name in the state directory.
const FileName = "prepared-claims.json"

// JournalName is the journal's name in the state directory: the changes
// since the snapshot, one JSON record a line.
const JournalName = "prepared-claims.journal"

// journalLimit is how many records the journal takes before the snapshot
// is rewritten: the rewrite's two fsyncs spread over that many changes.
const journalLimit = 256

// Version is the file format this package writes and reads.
const Version = 1

// Device is one prepared device of a claim.
type Device struct {
	// Requests are the claim's request names the device serves.
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	UUID         string   `json:"uuid"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	AdminAccess  bool     `json:"adminAccess,omitempty"`
	// Sharing is the claim's sharing strategy for this device (its
	// GpuConfig); empty for a device the claim holds alone. Absent in
	// checkpoints written before sharing, which read as unshared.
	Sharing string `json:"sharing,omitempty"`
	// MPS are the limits of the claim's MPS daemon (strategy MPS), kept so
	// a restarted nvinject-dra runs the daemon again as it was.
	MPS *MPSLimits `json:"mps,omitempty"`
	// ShareID is the allocation's share of a device that allows multiple
	// allocations (a GPU's share device); kubelet gets it back in every
	// answer for the claim.
	ShareID string `json:"shareID,omitempty"`
	// MIG is the placement a MIG device was made at for this claim (MIG on
	// demand): unprepare destroys the instance there.
	MIG *MIGSlot `json:"mig,omitempty"`
}

// MIGSlot is where a MIG device made on demand sits: its parent GPU, its
// profile and the GPU instance's placement.
type MIGSlot struct {
	ParentUUID  string `json:"parentUUID"`
	ParentIndex int    `json:"parentIndex"`
	Profile     string `json:"profile"`
	GIProfile   int    `json:"giProfile"`
	Start       int    `json:"start"`
	Size        int    `json:"size"`
}

// MPSLimits are an MPS daemon's default client limits.
type MPSLimits struct {
	ActiveThreadPercentage int    `json:"activeThreadPercentage"`
	PinnedMemoryMiB        uint64 `json:"pinnedMemoryMiB,omitempty"`
}

// Claim is one prepared ResourceClaim.
type Claim struct {
	UID       string   `json:"uid"`
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Devices   []Device `json:"devices"`
	// Pending marks an intent: written before the claim's MIG devices are
	// made, never answered to kubelet. A pending claim found at start was
	// cut off mid-prepare: what it names is destroyed and it is forgotten.
	Pending bool `json:"pending,omitempty"`
}

// String names the claim as users know it.
func (c Claim) String() string { return c.Namespace + "/" + c.Name }

type file struct {
	Version int              `json:"version"`
	Claims  map[string]Claim `json:"claims"`
}

// record is one journal line: a claim put, or the UID of a claim deleted.
type record struct {
	Put    *Claim `json:"put,omitempty"`
	Delete string `json:"delete,omitempty"`
}

// Store is the checkpoint of one driver instance.
type Store struct {
	path    string
	journal string
	mu      sync.Mutex
	claims  map[string]Claim
	log     *os.File
	records int
}

// Open reads dir's checkpoint (the snapshot, then the journal's changes),
// or starts an empty one when there is none. Close releases the journal.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the DRA state dir %s: %w; check --state-dir", dir, err)
	}
	s := &Store{path: filepath.Join(dir, FileName), journal: filepath.Join(dir, JournalName), claims: map[string]Claim{}}
	if err := s.readSnapshot(); err != nil {
		return nil, err
	}
	replayed, err := s.replay()
	if err != nil {
		return nil, err
	}
	if replayed {
		// The journal's changes go into the snapshot, so the journal the
		// store appends to starts empty.
		if err := s.writeSnapshot(s.claims); err != nil {
			return nil, err
		}
	}
	log, err := os.OpenFile(s.journal, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the DRA checkpoint journal %s: %w; check that --state-dir is writable", s.journal, err)
	}
	if err := syncNew(log, dir); err != nil {
		log.Close()
		return nil, err
	}
	s.log = log
	return s, nil
}

func (s *Store) readSnapshot() error {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the DRA checkpoint %s: %w", s.path, err)
	}
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return fmt.Errorf("DRA checkpoint %s is corrupt (%w); it lists the claims prepared on this node: move it away only after deleting the node's pods with GPU claims", s.path, err)
	}
	if f.Version != Version {
		return fmt.Errorf("DRA checkpoint %s has version %d; this nvinject-dra reads version %d: run a matching nvinject-dra", s.path, f.Version, Version)
	}
	for uid, c := range f.Claims {
		if uid == "" || c.UID != uid {
			return fmt.Errorf("DRA checkpoint %s is corrupt: entry %q holds claim UID %q; move it away only after deleting the node's pods with GPU claims", s.path, uid, c.UID)
		}
		s.claims[uid] = c
	}
	return nil
}

// replay applies the journal's records over the snapshot. A last line
// without its newline is a write that never returned (the driver died in
// it), so nobody was told it is prepared: it is dropped. Replaying records
// the snapshot already holds is harmless: each sets a claim's last state.
func (s *Store) replay() (bool, error) {
	data, err := os.ReadFile(s.journal)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the DRA checkpoint journal %s: %w", s.journal, err)
	}
	if i := bytes.LastIndexByte(data, '\n'); i+1 < len(data) {
		data = data[:i+1]
	}
	n := 0
	for line := range bytes.Lines(data) {
		n++
		var r record
		if err := json.Unmarshal(line, &r); err != nil || (r.Put == nil) == (r.Delete == "") || (r.Put != nil && r.Put.UID == "") {
			return false, fmt.Errorf("DRA checkpoint journal %s is corrupt at line %d (%s); it lists claims prepared on this node: move it away only after deleting the node's pods with GPU claims", s.journal, n, contract.Quote(string(bytes.TrimSpace(line))))
		}
		if r.Put != nil {
			s.claims[r.Put.UID] = *r.Put
		} else {
			delete(s.claims, r.Delete)
		}
	}
	return n > 0, nil
}

// Close releases the journal; the store is not used after.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return nil
	}
	err := s.log.Close()
	s.log = nil
	return err
}

// Path is the checkpoint file.
func (s *Store) Path() string { return s.path }

// Get returns the prepared claim with uid.
func (s *Store) Get(uid string) (Claim, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.claims[uid]
	return c, ok
}

// All returns every prepared claim, ordered by UID.
func (s *Store) All() []Claim {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Claim, 0, len(s.claims))
	for _, c := range s.claims {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Claim) int { return cmp.Compare(a.UID, b.UID) })
	return out
}

// Len is the number of prepared claims.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.claims)
}

// Put records c durably; on a write error the store keeps its previous
// content.
func (s *Store) Put(c Claim) error {
	if c.UID == "" {
		return errors.New("checkpoint a claim without a UID: the ResourceClaim has no metadata.uid")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next := maps.Clone(s.claims)
	next[c.UID] = c
	if err := s.appendLocked(record{Put: &c}, next); err != nil {
		return err
	}
	s.claims = next
	return nil
}

// Delete forgets the claim with uid and reports whether it was there.
func (s *Store) Delete(uid string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.claims[uid]; !ok {
		return false, nil
	}
	next := maps.Clone(s.claims)
	delete(next, uid)
	if err := s.appendLocked(record{Delete: uid}, next); err != nil {
		return true, err
	}
	s.claims = next
	return true, nil
}

// appendLocked makes r durable: one line and one fdatasync, or, when the
// journal is full, next written as the snapshot and the journal emptied.
func (s *Store) appendLocked(r record, next map[string]Claim) error {
	if s.log == nil {
		return errors.New("the DRA checkpoint is closed")
	}
	if s.records >= journalLimit {
		if err := s.writeSnapshot(next); err != nil {
			return err
		}
		if err := s.log.Truncate(0); err != nil {
			return fmt.Errorf("empty the DRA checkpoint journal %s: %w", s.journal, err)
		}
		if err := syscall.Fdatasync(int(s.log.Fd())); err != nil {
			return fmt.Errorf("sync the DRA checkpoint journal %s: %w", s.journal, err)
		}
		s.records = 0
		return nil
	}
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode a DRA checkpoint record: %w", err)
	}
	if _, err := s.log.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("append to the DRA checkpoint journal %s: %w; check that --state-dir is writable and not full", s.journal, err)
	}
	if err := syscall.Fdatasync(int(s.log.Fd())); err != nil {
		return fmt.Errorf("sync the DRA checkpoint journal %s: %w", s.journal, err)
	}
	s.records++
	return nil
}

func (s *Store) writeSnapshot(claims map[string]Claim) error {
	data, err := json.MarshalIndent(file{Version: Version, Claims: claims}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the DRA checkpoint: %w", err)
	}
	if err := durable.WriteFile(s.path, data); err != nil {
		return fmt.Errorf("write the DRA checkpoint: %w; check that --state-dir is writable", err)
	}
	return nil
}

// syncNew makes a just-created (or truncated) file and its directory
// entry durable, once, so later appends need only fdatasync.
func syncNew(f *os.File, dir string) error {
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", f.Name(), err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s to sync the journal's entry: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
