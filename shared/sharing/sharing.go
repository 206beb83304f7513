// Package sharing reads GPU sharing configuration in NVIDIA's device
// plugin format (version v1, sharing.timeSlicing): how many replicas each
// GPU of a resource is published as, and under which resource name. It
// only parses and validates; the device plugin publishes the replicas and
// the CDI spec records the count for nvinject-nri's check.
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

// MaxConfigBytes bounds the configuration read from a ConfigMap.
const MaxConfigBytes = 64 << 10

// Config is the parsed file.
type Config struct {
	Version string  `json:"version"`
	Sharing Sharing `json:"sharing"`
}

// Sharing holds the sharing modes; only time-slicing is implemented.
type Sharing struct {
	TimeSlicing TimeSlicing `json:"timeSlicing"`
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

// Resource shares every GPU (or MIG device) of one published resource.
type Resource struct {
	Name     string `json:"name"`
	Rename   string `json:"rename,omitempty"`
	Replicas int    `json:"replicas"`
}

// Replicated is what one published resource becomes.
type Replicated struct {
	// Name is the resource the replicas are published as.
	Name     string
	Replicas int
	// FailRequestsGreaterThanOne as configured.
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
		return Config{}, contract.Bound(fmt.Errorf("sharing configuration: %w; the format is NVIDIA's device plugin config (version: v1, sharing.timeSlicing.resources[].name/replicas/rename; MPS is not supported by nvinject yet)", err))
	}
	if c.Version != "v1" {
		return Config{}, fmt.Errorf("sharing configuration: version %s is not supported; write version: v1", contract.Quote(c.Version))
	}
	var errs []error
	seen := map[string]bool{}
	for i, r := range c.Sharing.TimeSlicing.Resources {
		at := fmt.Sprintf("sharing.timeSlicing.resources[%d]", i)
		if r.Name == "" {
			errs = append(errs, fmt.Errorf("%s: name is empty; give the resource to share, such as %s", at, contract.ResourceName))
			continue
		}
		if seen[r.Name] {
			errs = append(errs, fmt.Errorf("%s: %s is listed twice; list each resource once", at, contract.Quote(r.Name)))
		}
		seen[r.Name] = true
		if r.Replicas < 2 || r.Replicas > MaxReplicas {
			errs = append(errs, fmt.Errorf("%s (%s): replicas %d is not between 2 and %d; 1 shares nothing (remove the entry)", at, r.Name, r.Replicas, MaxReplicas))
		}
		if r.Rename != "" && !strings.Contains(r.Rename, "/") {
			errs = append(errs, fmt.Errorf("%s (%s): rename %s is not a resource name; give domain/name, such as %s.shared", at, r.Name, contract.Quote(r.Rename), r.Name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, contract.Bound(err)
	}
	return c, nil
}

// For says how resource is published: shared (ok) with its replicas and
// name, or not shared.
func (c Config) For(resource string) (Replicated, bool) {
	ts := c.Sharing.TimeSlicing
	for _, r := range ts.Resources {
		if r.Name != resource {
			continue
		}
		name := r.Name
		switch {
		case r.Rename != "":
			name = r.Rename
		case ts.RenameByDefault:
			name = r.Name + ".shared"
		}
		return Replicated{Name: name, Replicas: r.Replicas, FailRequestsGreaterThanOne: ts.FailRequestsGreaterThanOne}, true
	}
	return Replicated{}, false
}

// Unused lists the configured resources not among published, so a typo in
// a name is reported rather than silently sharing nothing.
func (c Config) Unused(published []string) []string {
	var out []string
	for _, r := range c.Sharing.TimeSlicing.Resources {
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
