// Package sharing reads GPU sharing configuration in NVIDIA's device
// plugin format (version v1, sharing.timeSlicing and sharing.mps): how many
// replicas each GPU of a resource is published as, under which resource
// name, and by which strategy. It only parses and validates; the device
// plugin publishes the replicas, the GPU node runs the MPS control daemons
// and the CDI spec records the count for nvinject-nri's check.
package sharing

import (
	"errors"
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/nvinject/nvinject/shared/contract"
)

// MaxReplicas bounds a GPU's replicas: kubelet holds every device ID in
// memory and the scheduler in its node info; past this it is a typo.
const MaxReplicas = 64

// MaxMPSReplicas is MPS's own bound: an MPS server takes at most 48 client
// CUDA contexts per GPU (Volta and later).
const MaxMPSReplicas = 48

// MaxConfigBytes bounds the configuration read from a ConfigMap.
const MaxConfigBytes = 64 << 10

// Config is the parsed file.
type Config struct {
	Version string  `json:"version"`
	Sharing Sharing `json:"sharing"`
}

// Sharing holds the sharing modes.
type Sharing struct {
	TimeSlicing TimeSlicing `json:"timeSlicing"`
	MPS         MPS         `json:"mps"`
}

// TimeSlicing is NVIDIA's sharing.timeSlicing.
type TimeSlicing struct {
	// RenameByDefault publishes each shared resource as <name>.shared
	// unless the resource gives its own Rename.
	RenameByDefault bool `json:"renameByDefault,omitempty"`
	// FailRequestsGreaterThanOne refuses a container asking for more than
	// one replica: two replicas of one GPU are not twice the GPU.
	FailRequestsGreaterThanOne bool       `json:"failRequestsGreaterThanOne,omitempty"`
	Resources                  []Resource `json:"resources"`
}

// MPS is NVIDIA's sharing.mps: each GPU of a resource gets an MPS control
// daemon, and each replica a 1/replicas share of its threads and memory. A
// container takes one replica (NVIDIA's failRequestsGreaterThanOne is
// implied), since two clients of one daemon are not twice the GPU.
type MPS struct {
	RenameByDefault bool       `json:"renameByDefault,omitempty"`
	Resources       []Resource `json:"resources"`
}

// Resource shares every GPU (or MIG device) of one published resource.
type Resource struct {
	Name     string `json:"name"`
	Rename   string `json:"rename,omitempty"`
	Replicas int    `json:"replicas"`
}

// Strategy is how a resource's GPUs are shared.
type Strategy string

const (
	TimeSliced Strategy = "time-slicing"
	MPSShared  Strategy = "mps"
)

// Replicated is what one published resource becomes.
type Replicated struct {
	// Name is the resource the replicas are published as.
	Name     string
	Replicas int
	Strategy Strategy
	// FailRequestsGreaterThanOne as configured; always true under MPS.
	FailRequestsGreaterThanOne bool
}

// Parse reads and validates a configuration; errors name the field and the
// fix. An empty document shares nothing.
func Parse(data []byte) (Config, error) {
	if len(data) > MaxConfigBytes {
		return Config{}, fmt.Errorf("sharing configuration is %d bytes, over the %d-byte limit; it holds a few resources only", len(data), MaxConfigBytes)
	}
	var c Config
	if len(strings.TrimSpace(string(data))) == 0 {
		return c, nil
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return Config{}, contract.Bound(fmt.Errorf("sharing configuration: %w; the format is NVIDIA's device plugin config (version: v1, sharing.timeSlicing or sharing.mps: resources[].name/replicas/rename)", err))
	}
	if c.Version != "v1" {
		return Config{}, fmt.Errorf("sharing configuration: version %s is not supported; write version: v1", contract.Quote(c.Version))
	}
	seen := map[string]string{}
	errs := validate("sharing.timeSlicing", c.Sharing.TimeSlicing.Resources, MaxReplicas, seen)
	errs = append(errs, validate("sharing.mps", c.Sharing.MPS.Resources, MaxMPSReplicas, seen)...)
	if err := errors.Join(errs...); err != nil {
		return Config{}, contract.Bound(err)
	}
	return c, nil
}

// validate checks one section's resources; seen maps each resource already
// listed to where, so one resource is never shared two ways.
func validate(section string, rs []Resource, maxReplicas int, seen map[string]string) []error {
	var errs []error
	for i, r := range rs {
		at := fmt.Sprintf("%s.resources[%d]", section, i)
		if r.Name == "" {
			errs = append(errs, fmt.Errorf("%s: name is empty; give the resource to share, such as %s", at, contract.ResourceName))
			continue
		}
		if where, dup := seen[r.Name]; dup {
			errs = append(errs, fmt.Errorf("%s: %s is already listed at %s; share each resource once, one way", at, contract.Quote(r.Name), where))
		}
		seen[r.Name] = at
		if r.Replicas < 2 || r.Replicas > maxReplicas {
			errs = append(errs, fmt.Errorf("%s (%s): replicas %d is not between 2 and %d; 1 shares nothing (remove the entry)", at, r.Name, r.Replicas, maxReplicas))
		}
		if r.Rename != "" && !strings.Contains(r.Rename, "/") {
			errs = append(errs, fmt.Errorf("%s (%s): rename %s is not a resource name; give domain/name, such as %s.shared", at, r.Name, contract.Quote(r.Rename), r.Name))
		}
	}
	return errs
}

// For says how resource is published: shared (ok) with its replicas, name
// and strategy, or not shared.
func (c Config) For(resource string) (Replicated, bool) {
	ts := c.Sharing.TimeSlicing
	if r, ok := find(ts.Resources, resource); ok {
		return Replicated{Name: r.publishedAs(ts.RenameByDefault), Replicas: r.Replicas, Strategy: TimeSliced, FailRequestsGreaterThanOne: ts.FailRequestsGreaterThanOne}, true
	}
	if r, ok := find(c.Sharing.MPS.Resources, resource); ok {
		return Replicated{Name: r.publishedAs(c.Sharing.MPS.RenameByDefault), Replicas: r.Replicas, Strategy: MPSShared, FailRequestsGreaterThanOne: true}, true
	}
	return Replicated{}, false
}

// Any says whether the configuration shares anything.
func (c Config) Any() bool {
	return len(c.Sharing.TimeSlicing.Resources)+len(c.Sharing.MPS.Resources) > 0
}

func find(rs []Resource, name string) (Resource, bool) {
	for _, r := range rs {
		if r.Name == name {
			return r, true
		}
	}
	return Resource{}, false
}

func (r Resource) publishedAs(renameByDefault bool) string {
	switch {
	case r.Rename != "":
		return r.Rename
	case renameByDefault:
		return r.Name + ".shared"
	}
	return r.Name
}

// Unused lists the configured resources not among published, so a typo in
// a name is reported rather than silently sharing nothing.
func (c Config) Unused(published []string) []string {
	var out []string
	for _, r := range append(append([]Resource(nil), c.Sharing.TimeSlicing.Resources...), c.Sharing.MPS.Resources...) {
		found := false
		for _, p := range published {
			found = found || p == r.Name
		}
		if !found {
			out = append(out, r.Name)
		}
	}
	return out
}

// ReplicaID is the device ID of replica n of the device with id, NVIDIA's
// "<id>::<n>".
func ReplicaID(id string, n int) string { return fmt.Sprintf("%s::%d", id, n) }

// DeviceOf returns the device ID a replica ID stands for, and whether it
// is a replica ID at all.
func DeviceOf(replicaID string) (string, bool) {
	id, _, ok := strings.Cut(replicaID, "::")
	return id, ok
}
