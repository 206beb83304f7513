package backend_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
)

// This machine has no NVIDIA driver: the real backend must say so and
// what to check, the seed's first troubleshooting row.
func TestRealWithoutDriver(t *testing.T) {
	_, err := backend.Open(backend.Real, backend.Options{DriverRoot: t.TempDir()})
	if err == nil {
		t.Skip("an NVIDIA driver is installed here")
	}
	if !errors.Is(err, nvmlinv.ErrLibraryNotFound) {
		t.Fatalf("err = %v, want ErrLibraryNotFound", err)
	}
	for _, hint := range []string{"nvidia-smi", "--driver-root", "sim:a100-80gb"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("error lacks hint %q: %v", hint, err)
		}
	}
}

func TestOpenRejects(t *testing.T) {
	for _, v := range []string{"nvml", "sim:", "sim:a100-80gb*99"} {
		if _, err := backend.Open(v, backend.Options{}); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
}
