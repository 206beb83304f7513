// Package claimspec keeps the per-claim CDI specs of shared claims: one
// small transient spec per claim UID in the node's CDI spec dir, beside
// the node's spec, holding the claim's own device <vendor>/claim=<UID>.
// Its annotations tell nvinject-nri which claim shares which GPUs; its
// edits are what every container of the claim gets besides the GPUs.
package claimspec

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvinject/nvinject/dra/internal/claimconfig"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/durable"
)

// Dir is the spec dir the per-claim specs go to.
type Dir struct {
	dir, vendor string
}

// New returns the per-claim specs of vendor in dir (the node's CDI spec
// dir, which containerd and nvinject-nri read).
func New(dir, vendor string) Dir { return Dir{dir: dir, vendor: vendor} }

// Device is claim uid's own CDI device name.
func (d Dir) Device(uid string) string { return contract.SharedClaimDevice(d.vendor, uid) }

// prefix starts every per-claim spec's file name; the claim UID follows.
func (d Dir) prefix() string {
	return cdi.GenerateTransientSpecName(d.vendor, contract.CDIClaimClass, "")
}

func (d Dir) path(uid string) string { return filepath.Join(d.dir, d.prefix()+uid+".json") }

// Edits are what each container of a claim shared by s gets from the
// claim's own device whatever the strategy: the claim's UID in its
// environment (the driver adds an MPS daemon's pipe directory).
func Edits(uid string, s claimconfig.Strategy) (specs.ContainerEdits, error) {
	switch s {
	case claimconfig.TimeSlicing, claimconfig.MPS:
		return specs.ContainerEdits{Env: []string{contract.EnvSharedClaim + "=" + uid}}, nil
	}
	return specs.ContainerEdits{}, fmt.Errorf("sharing strategy %s is not served; use %s", contract.Quote(string(s)), claimconfig.TimeSlicing)
}

// ValidUID refuses a claim UID that cannot name a CDI device, and so
// cannot be one file or directory name either: the UID names the claim's
// spec file and its MPS daemon's directories on the host.
func ValidUID(uid string) error {
	if err := parser.ValidateDeviceName(uid); err != nil {
		return fmt.Errorf("claim UID %s cannot name a CDI device or a file: %w", contract.Quote(uid), err)
	}
	return nil
}

// Write stores claim uid's spec atomically: its device shares uuids with
// edits, and carries extra annotations besides the claim's and the UUIDs'.
func (d Dir) Write(uid string, uuids []string, edits specs.ContainerEdits, extra map[string]string) error {
	if err := ValidUID(uid); err != nil {
		return err
	}
	annotations := maps.Clone(extra)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[contract.SharedClaimAnnotation] = uid
	annotations[contract.SharedClaimUUIDsAnnotation] = contract.SharedClaimUUIDs(uuids)
	s := specs.Spec{Kind: contract.CDIKind(d.vendor, contract.CDIClaimClass), Devices: []specs.Device{{
		Name: uid, Annotations: annotations, ContainerEdits: edits,
	}}}
	v, err := specs.MinimumRequiredVersion(&s)
	if err != nil {
		return fmt.Errorf("determine the CDI version of claim %s's spec: %w", uid, err)
	}
	s.Version = v
	data, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode the CDI spec of claim %s: %w", uid, err)
	}
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return fmt.Errorf("create CDI spec dir %s: %w; check --cdi-spec-dir", d.dir, err)
	}
	if err := durable.WriteFile(d.path(uid), data); err != nil {
		return fmt.Errorf("write the CDI spec of claim %s: %w; check that --cdi-spec-dir is writable", uid, err)
	}
	return nil
}

// Remove deletes claim uid's spec; a spec that is not there is no error.
func (d Dir) Remove(uid string) error {
	if err := ValidUID(uid); err != nil {
		return err
	}
	if err := os.Remove(d.path(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the CDI spec of claim %s: %w", uid, err)
	}
	return nil
}

// Prune removes the per-claim specs of claims keep does not know (left by
// a claim unprepared while nvinject-dra was down) and returns their UIDs.
func (d Dir) Prune(keep func(uid string) bool) ([]string, error) {
	entries, err := os.ReadDir(d.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list CDI spec dir %s: %w", d.dir, err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		uid, pre := strings.CutPrefix(e.Name(), d.prefix())
		uid, suf := strings.CutSuffix(uid, ".json")
		if !pre || !suf || e.IsDir() || keep(uid) {
			continue
		}
		if err := d.Remove(uid); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, uid)
	}
	return removed, errors.Join(errs...)
}
