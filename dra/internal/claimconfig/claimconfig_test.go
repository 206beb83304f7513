package claimconfig

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

const head = `"apiVersion":"gpu.nvinject.io/v1alpha1","kind":"GpuConfig"`

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Strategy
		// err: words the error must hold; "" parses.
		err []string
	}{
		{name: "no sharing", in: `{` + head + `}`},
		{name: "time-slicing", in: `{` + head + `,"sharing":{"strategy":"TimeSlicing"}}`, want: TimeSlicing},
		{name: "time-slicing default interval", in: `{` + head + `,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Default"}}}`, want: TimeSlicing},
		{name: "MPS full", in: `{` + head + `,"sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi"}}}`, want: MPS},
		{name: "MPS bare", in: `{` + head + `,"sharing":{"strategy":"MPS"}}`, want: MPS},
		{name: "long interval", in: `{` + head + `,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`,
			err: []string{"ResourceClaim ns/c", "interval Long", "does not set the compute time-slice yet", "interval: Default"}},
		{name: "unknown interval", in: `{` + head + `,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"5ms"}}}`,
			err: []string{"not an interval", "Default"}},
		{name: "unknown field", in: `{` + head + `,"sharing":{"strategy":"TimeSlicing","replicas":4}}`, err: []string{"unknown field", "replicas"}},
		{name: "field case", in: `{` + head + `,"Sharing":{"strategy":"TimeSlicing"}}`, err: []string{"unknown field", "Sharing"}},
		{name: "duplicate field", in: `{` + head + `,"sharing":{"strategy":"MPS","strategy":"TimeSlicing"}}`, err: []string{"duplicate field"}},
		{name: "wrong kind", in: `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"}`, err: []string{"resource.nvidia.com/v1beta1", "gpu.nvinject.io/v1alpha1"}},
		{name: "no strategy", in: `{` + head + `,"sharing":{}}`, err: []string{"sharing.strategy is missing"}},
		{name: "unknown strategy", in: `{` + head + `,"sharing":{"strategy":"Fabric"}}`, err: []string{"Fabric", "TimeSlicing or MPS"}},
		{name: "MPS with time-slicing settings", in: `{` + head + `,"sharing":{"strategy":"MPS","timeSlicingConfig":{}}}`, err: []string{"timeSlicingConfig is set with strategy MPS"}},
		{name: "time-slicing with MPS settings", in: `{` + head + `,"sharing":{"strategy":"TimeSlicing","mpsConfig":{}}}`, err: []string{"mpsConfig is set with strategy TimeSlicing"}},
		{name: "thread percentage 0", in: `{` + head + `,"sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":0}}}`, err: []string{"defaultActiveThreadPercentage 0", "1 to 100"}},
		{name: "thread percentage 101", in: `{` + head + `,"sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":101}}}`, err: []string{"101"}},
		{name: "pinned limit tiny", in: `{` + head + `,"sharing":{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"1k"}}}`, err: []string{"under 1Mi"}},
		{name: "pinned limit not a quantity", in: `{` + head + `,"sharing":{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"lots"}}}`, err: []string{"not a GpuConfig"}},
		{name: "empty", in: ` `, err: []string{"empty"}},
		{name: "too big", in: `{` + head + strings.Repeat(" ", MaxBytes) + `}`, err: []string{"over the 16384-byte limit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("ns/c", []byte(tc.in))
			if tc.err != nil {
				if err == nil {
					t.Fatalf("parsed %+v; want an error", c)
				}
				for _, w := range tc.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Strategy(); got != tc.want {
				t.Errorf("strategy %q, want %q", got, tc.want)
			}
		})
	}
}

func opaque(src resourceapi.AllocationConfigSource, driver, strategy string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	raw := `{` + head + `,"sharing":{"strategy":"` + strategy + `"}}`
	return resourceapi.DeviceAllocationConfiguration{Source: src, Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}
}

// FromClaim wins over FromClass for the same request, whatever their
// order; a later config of one source wins over an earlier; a config names
// a request and its subrequests; other drivers' configs are not read.
func TestForRequestsPrecedence(t *testing.T) {
	const class, claim = resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim
	for _, tc := range []struct {
		name     string
		configs  []resourceapi.DeviceAllocationConfiguration
		requests []string
		want     map[string]Strategy
	}{
		{name: "none", requests: []string{"gpu"}, want: map[string]Strategy{}},
		{name: "class only", configs: []resourceapi.DeviceAllocationConfiguration{opaque(class, "gpu.nvinject.io", "TimeSlicing")},
			requests: []string{"gpu"}, want: map[string]Strategy{"gpu": TimeSlicing}},
		{name: "claim wins over class, listed first", configs: []resourceapi.DeviceAllocationConfiguration{
			opaque(claim, "gpu.nvinject.io", "TimeSlicing"), opaque(class, "gpu.nvinject.io", "MPS")},
			requests: []string{"gpu"}, want: map[string]Strategy{"gpu": TimeSlicing}},
		{name: "class applies where the claim's names another request", configs: []resourceapi.DeviceAllocationConfiguration{
			opaque(class, "gpu.nvinject.io", "MPS"), opaque(claim, "gpu.nvinject.io", "TimeSlicing", "a")},
			requests: []string{"a", "b"}, want: map[string]Strategy{"a": TimeSlicing, "b": MPS}},
		{name: "later claim config wins", configs: []resourceapi.DeviceAllocationConfiguration{
			opaque(claim, "gpu.nvinject.io", "MPS"), opaque(claim, "gpu.nvinject.io", "TimeSlicing", "a")},
			requests: []string{"a", "b"}, want: map[string]Strategy{"a": TimeSlicing, "b": MPS}},
		{name: "subrequest", configs: []resourceapi.DeviceAllocationConfiguration{opaque(claim, "gpu.nvinject.io", "TimeSlicing", "gpu")},
			requests: []string{"gpu/small", "other"}, want: map[string]Strategy{"gpu/small": TimeSlicing}},
		{name: "other driver ignored", configs: []resourceapi.DeviceAllocationConfiguration{opaque(claim, "gpu.nvidia.com", "Bogus")},
			requests: []string{"gpu"}, want: map[string]Strategy{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ForRequests("ns/c", tc.configs, tc.requests)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("configs for %d requests (%v), want %d", len(got), got, len(tc.want))
			}
			for r, s := range tc.want {
				if got[r].Strategy() != s {
					t.Errorf("request %s: strategy %q, want %q", r, got[r].Strategy(), s)
				}
			}
		})
	}
	_, err := ForRequests("ns/c", []resourceapi.DeviceAllocationConfiguration{opaque(claim, "gpu.nvinject.io", "Bogus")}, []string{"gpu"})
	if err == nil || !strings.Contains(err.Error(), "ResourceClaim ns/c") {
		t.Fatalf("a bad config of this driver: err = %v, want an error naming the claim", err)
	}
}

// FuzzParse: any input parses to a valid config or fails with a bounded
// error naming the claim.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "{}", `{` + head + `}`, `{` + head + `,"sharing":{"strategy":"TimeSlicing"}}`,
		`{` + head + `,"sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"1Gi"}}}`, `{"a":`, `[1]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		c, err := Parse("ns/c", []byte(in))
		if err != nil {
			if len(err.Error()) > 2048 || !strings.Contains(err.Error(), "ResourceClaim ns/c") {
				t.Errorf("error %q: over the bound or not naming the claim", err)
			}
			return
		}
		if c.APIVersion != "gpu.nvinject.io/v1alpha1" || c.Kind != "GpuConfig" {
			t.Errorf("accepted %+v", c)
		}
		if s := c.Strategy(); s != "" && s != TimeSlicing && s != MPS {
			t.Errorf("accepted strategy %q", s)
		}
	})
}
