// Package checkpoint keeps the DRA driver's prepared claims in one file
// of its state directory, so NodeUnprepareResources and a repeated
// NodePrepareResources answer the same after the driver or kubelet
// restarts. Every change is written atomically (temp file, fsync, rename,
// fsync of the directory) before the call that made it returns.
package checkpoint

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/nvinject/nvinject/shared/durable"
)

// FileName is the checkpoint's name in the state directory.
const FileName = "prepared-claims.json"

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
}

// Claim is one prepared ResourceClaim.
type Claim struct {
	UID       string   `json:"uid"`
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Devices   []Device `json:"devices"`
}

// String names the claim as users know it.
func (c Claim) String() string { return c.Namespace + "/" + c.Name }

type file struct {
	Version int              `json:"version"`
	Claims  map[string]Claim `json:"claims"`
}

// Store is the checkpoint of one driver instance.
type Store struct {
	path   string
	mu     sync.Mutex
	claims map[string]Claim
}

// Open reads dir's checkpoint, or starts an empty one when there is none.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the DRA state dir %s: %w; check --state-dir", dir, err)
	}
	s := &Store{path: filepath.Join(dir, FileName), claims: map[string]Claim{}}
	data, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the DRA checkpoint %s: %w", s.path, err)
	}
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("DRA checkpoint %s is corrupt (%w); it lists the claims prepared on this node: move it away only after deleting the node's pods with GPU claims", s.path, err)
	}
	if f.Version != Version {
		return nil, fmt.Errorf("DRA checkpoint %s has version %d; this nvinject-dra reads version %d: run a matching nvinject-dra", s.path, f.Version, Version)
	}
	for uid, c := range f.Claims {
		if uid == "" || c.UID != uid {
			return nil, fmt.Errorf("DRA checkpoint %s is corrupt: entry %q holds claim UID %q; move it away only after deleting the node's pods with GPU claims", s.path, uid, c.UID)
		}
		s.claims[uid] = c
	}
	return s, nil
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

// Put records c and writes the checkpoint; on a write error the store
// keeps its previous content.
func (s *Store) Put(c Claim) error {
	if c.UID == "" {
		return errors.New("checkpoint a claim without a UID: the ResourceClaim has no metadata.uid")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next := maps.Clone(s.claims)
	next[c.UID] = c
	if err := s.writeLocked(next); err != nil {
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
	if err := s.writeLocked(next); err != nil {
		return true, err
	}
	s.claims = next
	return true, nil
}

func (s *Store) writeLocked(claims map[string]Claim) error {
	data, err := json.MarshalIndent(file{Version: Version, Claims: claims}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the DRA checkpoint: %w", err)
	}
	if err := durable.WriteFile(s.path, data); err != nil {
		return fmt.Errorf("write the DRA checkpoint: %w; check that --state-dir is writable", err)
	}
	return nil
}
