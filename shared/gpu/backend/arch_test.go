package backend_test

import (
	"context"
	"testing"

	"github.com/nvinject/nvinject/shared/gpu/backend"
)

// The DRA driver publishes architecture and compute capability as device
// attributes; the simulated A100 must carry NVML's values for them.
func TestSimReportsArchitecture(t *testing.T) {
	b, err := backend.Open("sim:a100-80gb", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n, err := b.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d := n.Devices[0]; d.Architecture != "Ampere" || d.ComputeCapability != "8.0" {
		t.Errorf("architecture %q, compute capability %q; want Ampere, 8.0 (the A100's)", d.Architecture, d.ComputeCapability)
	}
}
