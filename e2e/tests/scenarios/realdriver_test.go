package scenarios

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/e2e/harness/driverroot"
	"github.com/nvinject/nvinject/e2e/harness/rig"
)

// smiNoDriver is what NVIDIA's nvidia-smi prints when its libraries load but
// the kernel module is not there.
const smiNoDriver = "couldn't communicate with the NVIDIA driver"

// probeReport is e2e/cmd/gpu-probe's --json output.
type probeReport struct {
	Libraries []struct {
		Name, Path, RealPath, Error string
		OK                          bool
	} `json:"libraries"`
	Calls []struct {
		Call, Name, Skipped string
		Code                int
		Value               *int
	} `json:"calls"`
	AllLoaded bool `json:"all_loaded"`
}

// On the REAL driver root (NVIDIA 535.261.03 user space, no kernel module),
// inside the vLLM stand-in's Debian bookworm container: the real nvidia-smi
// is on PATH and fails only for want of the kernel driver; the driver's
// libraries load as CUDA programs load them (cuInit 100 CUDA_ERROR_NO_DEVICE,
// nvmlInit 9 Driver Not Loaded); the update-ldcache hook made `ldconfig -p`
// list libcuda; and nvidia-smi-sim still answers the SIMULATED GPU's UUID.
func TestRealDriverInVLLMContainer(t *testing.T) {
	d := need(t)
	if !driver.Real() {
		t.Skip(driver.String())
	}
	ctx := testCtx(t)
	t.Logf("%s", driver)
	pod := runVLLMOnSelectedGPU(t, ctx, d)
	exec := func(script string) string {
		t.Helper()
		out, err := d.Kube().Exec(ctx, ns, pod.Name, "", "/bin/sh", "-c", script)
		if err != nil {
			t.Fatalf("%s in %s: %v", script, pod.Name, err)
		}
		t.Logf("$ %s\n%s", script, out)
		return out
	}

	// sh -c keeps nvidia-smi's exit status (9) from failing the exec.
	out := exec(`command -v nvidia-smi; nvidia-smi 2>&1; echo "exit=$?"`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if lines[0] != "/usr/bin/nvidia-smi" {
		t.Errorf("nvidia-smi on PATH is %q, want the driver root's /usr/bin/nvidia-smi", lines[0])
	}
	if !strings.Contains(out, smiNoDriver) || lines[len(lines)-1] != "exit=9" {
		t.Errorf("nvidia-smi: want exit 9 with %q, got:\n%s", smiNoDriver, out)
	}
	for _, bad := range []string{"error while loading shared libraries", "not found", "cannot open"} {
		if strings.Contains(out, bad) {
			t.Errorf("nvidia-smi failed for another reason than the missing kernel driver (%q):\n%s", bad, out)
		}
	}

	var r probeReport
	if err := json.Unmarshal([]byte(exec(`gpu-probe --json`)), &r); err != nil {
		t.Fatalf("gpu-probe --json: %v", err)
	}
	if !r.AllLoaded || len(r.Libraries) != 5 {
		t.Errorf("gpu-probe: all_loaded=%v with %d libraries, want the five loaded", r.AllLoaded, len(r.Libraries))
	}
	for _, l := range r.Libraries {
		if !l.OK || !strings.HasSuffix(l.RealPath, ".so."+driverroot.DriverVersion) {
			t.Errorf("gpu-probe: %s ok=%v path %s real %s: %s", l.Name, l.OK, l.Path, l.RealPath, l.Error)
		}
	}
	want := map[string]int{"cuDriverGetVersion": 0, "cuInit(0)": 100, "nvmlInit": 9}
	for _, c := range r.Calls {
		code, ok := want[c.Call]
		if !ok {
			continue
		}
		delete(want, c.Call)
		if c.Skipped != "" || c.Code != code {
			t.Errorf("gpu-probe: %s = %d %s (skipped %q), want %d", c.Call, c.Code, c.Name, c.Skipped, code)
		}
		if c.Call == "cuDriverGetVersion" && (c.Value == nil || *c.Value != driverroot.CUDADriverVersion) {
			t.Errorf("gpu-probe: cuDriverGetVersion value %v, want %d", c.Value, driverroot.CUDADriverVersion)
		}
	}
	if len(want) > 0 {
		t.Errorf("gpu-probe did not report %v", want)
	}

	checkLDCache(t, ctx, pod.Name)

	sim := exec(`nvidia-smi-sim --query-gpu=uuid,name,driver_version --format=csv,noheader`)
	if !strings.HasPrefix(sim, dep.UUID+", ") || !strings.Contains(sim, driverroot.DriverVersion) {
		t.Errorf("nvidia-smi-sim: %q, want the SIMULATED selected GPU %s with the real root's driver %s", sim, dep.UUID, driverroot.DriverVersion)
	}
	if m, err := d.Metrics(ctx, rig.DevicePlugin); err != nil || !strings.Contains(m, `uuid="`+dep.UUID+`"} 1`) {
		t.Errorf("device plugin does not report %s healthy on the real driver root: %v", dep.UUID, err)
	}
}

// checkLDCache asserts the container's ld.so.cache lists the driver's
// libraries: the CDI spec's update-ldcache hook ran (Triton, in vLLM, finds
// libcuda there).
func checkLDCache(t *testing.T, ctx context.Context, pod string) {
	t.Helper()
	const script = `ldconfig -p | grep -E 'libcuda|libnvidia-ml|libnvidia-ptxjitcompiler|libnvidia-nvvm' || echo "ldconfig -p lists no NVIDIA library"`
	ld, err := need(t).Kube().Exec(ctx, ns, pod, "", "/bin/sh", "-c", script)
	if err != nil {
		t.Fatalf("%s in %s: %v", script, pod, err)
	}
	for _, lib := range []string{"libcuda.so.1 ", "libcuda.so ", "libnvidia-ml.so.1 "} {
		if !strings.Contains(ld, lib) {
			t.Errorf("ldconfig -p in %s does not list %s(the spec's update-ldcache hook):\n%s", pod, lib, ld)
		}
	}
}
