// Package claimconfig reads the opaque driver config of nvinject-dra's
// claims (spec.devices.config[].opaque with driver gpu.nvinject.io, as the
// scheduler copies it into status.allocation.devices.config): a GpuConfig
// saying how the claim's GPUs are shared, in the shape of NVIDIA's DRA
// driver (sharing.strategy TimeSlicing or MPS). It only parses, validates
// and picks the config each request gets; prepare acts on it.
package claimconfig

import (
	"errors"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	sigsjson "sigs.k8s.io/json"

	"github.com/nvinject/nvinject/shared/contract"
)

// MaxBytes bounds one config's parameters: a GpuConfig is a few lines.
const MaxBytes = 16 << 10

// Strategy is how a claim's GPUs are shared.
type Strategy string

// Sharing strategies, NVIDIA's names.
const (
	TimeSlicing Strategy = "TimeSlicing"
	MPS         Strategy = "MPS"
)

// DefaultInterval is the one time-slice interval accepted: the driver's
// own, which nvinject leaves as it is.
const DefaultInterval = "Default"

// GpuConfig is the opaque config of driver gpu.nvinject.io.
type GpuConfig struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Sharing    *Sharing `json:"sharing,omitempty"`
}

// Sharing says how the claim's GPUs are shared between its pods.
type Sharing struct {
	Strategy          Strategy           `json:"strategy"`
	TimeSlicingConfig *TimeSlicingConfig `json:"timeSlicingConfig,omitempty"`
	MpsConfig         *MpsConfig         `json:"mpsConfig,omitempty"`
}

// TimeSlicingConfig is the TimeSlicing strategy's settings.
type TimeSlicingConfig struct {
	Interval string `json:"interval,omitempty"`
}

// MpsConfig is the MPS strategy's settings, for the claim's MPS daemon.
type MpsConfig struct {
	DefaultActiveThreadPercentage  *int               `json:"defaultActiveThreadPercentage,omitempty"`
	DefaultPinnedDeviceMemoryLimit *resource.Quantity `json:"defaultPinnedDeviceMemoryLimit,omitempty"`
}

// Strategy is the config's sharing strategy; "" shares nothing.
func (c *GpuConfig) Strategy() Strategy {
	if c == nil || c.Sharing == nil {
		return ""
	}
	return c.Sharing.Strategy
}

// Parse decodes and validates one GpuConfig of claim (namespace/name, for
// errors): unknown or duplicate fields are refused, and every error names
// the field and the fix.
func Parse(claim string, data []byte) (GpuConfig, error) {
	c, err := parse(data)
	if err != nil {
		return GpuConfig{}, contract.Bound(fmt.Errorf("ResourceClaim %s: opaque config of driver %s: %w", claim, contract.DRADriver, err))
	}
	return c, nil
}

func parse(data []byte) (GpuConfig, error) {
	var c GpuConfig
	if len(data) > MaxBytes {
		return c, fmt.Errorf("parameters are %d bytes, over the %d-byte limit; a %s is a few lines", len(data), MaxBytes, contract.DRAConfigKind)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return c, fmt.Errorf("parameters are empty; give apiVersion: %s, kind: %s", contract.DRAConfigAPIVersion, contract.DRAConfigKind)
	}
	strict, err := sigsjson.UnmarshalStrict(data, &c)
	if err != nil {
		return GpuConfig{}, fmt.Errorf("parameters are not a %s (%w); see dra/README.md, \"Sharing a claim\"", contract.DRAConfigKind, err)
	}
	if len(strict) > 0 {
		return GpuConfig{}, fmt.Errorf("parameters: %w; remove the field (a %s has apiVersion, kind and sharing)", errors.Join(strict...), contract.DRAConfigKind)
	}
	if c.APIVersion != contract.DRAConfigAPIVersion || c.Kind != contract.DRAConfigKind {
		return GpuConfig{}, fmt.Errorf("apiVersion %s, kind %s are not served; write apiVersion: %s, kind: %s", contract.Quote(c.APIVersion), contract.Quote(c.Kind), contract.DRAConfigAPIVersion, contract.DRAConfigKind)
	}
	if c.Sharing != nil {
		if err := c.Sharing.validate(); err != nil {
			return GpuConfig{}, err
		}
	}
	return c, nil
}

func (s *Sharing) validate() error {
	switch s.Strategy {
	case TimeSlicing:
		if s.MpsConfig != nil {
			return fmt.Errorf("sharing.mpsConfig is set with strategy %s; remove it, or set strategy: %s", TimeSlicing, MPS)
		}
		if t := s.TimeSlicingConfig; t != nil && t.Interval != "" && t.Interval != DefaultInterval {
			switch t.Interval {
			case "Short", "Medium", "Long":
				return fmt.Errorf("sharing.timeSlicingConfig.interval %s: nvinject does not set the compute time-slice yet; write interval: %s or leave it out", t.Interval, DefaultInterval)
			}
			return fmt.Errorf("sharing.timeSlicingConfig.interval %s is not an interval; write interval: %s or leave it out", contract.Quote(t.Interval), DefaultInterval)
		}
	case MPS:
		if s.TimeSlicingConfig != nil {
			return fmt.Errorf("sharing.timeSlicingConfig is set with strategy %s; remove it, or set strategy: %s", MPS, TimeSlicing)
		}
		if m := s.MpsConfig; m != nil {
			if p := m.DefaultActiveThreadPercentage; p != nil && (*p < 1 || *p > 100) {
				return fmt.Errorf("sharing.mpsConfig.defaultActiveThreadPercentage %d is out of range; give 1 to 100 (percent of the GPU's threads each client may use)", *p)
			}
			if q := m.DefaultPinnedDeviceMemoryLimit; q != nil && q.Cmp(resource.MustParse("1Mi")) < 0 {
				return fmt.Errorf("sharing.mpsConfig.defaultPinnedDeviceMemoryLimit %s is under 1Mi; give a memory size such as 10Gi", q.String())
			}
		}
	case "":
		return fmt.Errorf("sharing.strategy is missing; write strategy: %s (or %s)", TimeSlicing, MPS)
	default:
		return fmt.Errorf("sharing.strategy %s is not known; write %s or %s", contract.Quote(string(s.Strategy)), TimeSlicing, MPS)
	}
	return nil
}

// ForRequests picks the GpuConfig that applies to each of requests (the
// allocation results' request names) from the claim's allocated configs:
// configs of other drivers are ignored, a config without requests applies
// to all, one naming a request also applies to its subrequests
// ("gpu/small"), and a later one wins: FromClass configs first, then
// FromClaim ones, each in order (NVIDIA's precedence). A request without
// config is absent from the map.
func ForRequests(claim string, configs []resourceapi.DeviceAllocationConfiguration, requests []string) (map[string]*GpuConfig, error) {
	out := map[string]*GpuConfig{}
	for _, src := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
		for _, cfg := range configs {
			if cfg.Source != src || cfg.Opaque == nil || cfg.Opaque.Driver != contract.DRADriver {
				continue
			}
			c, err := Parse(claim, cfg.Opaque.Parameters.Raw)
			if err != nil {
				return nil, err
			}
			for _, r := range requests {
				if appliesTo(cfg.Requests, r) {
					out[r] = &c
				}
			}
		}
	}
	return out, nil
}

// appliesTo reports whether a config for names applies to request r.
func appliesTo(names []string, r string) bool {
	if len(names) == 0 {
		return true
	}
	parent, _, _ := strings.Cut(r, "/")
	for _, n := range names {
		if n == r || n == parent {
			return true
		}
	}
	return false
}
