package scenarios

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/doctor"
	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/gpunode/mps"
)

// An MPS pair on one GPU with 2 replicas: the device plugin runs NVIDIA's
// real nvidia-cuda-mps-control (535) for the GPU, both pods get its pipe
// dir, the daemons' /dev/shm and their limits in MPS's env, and the real
// control program inside each answers with the daemon's limits (50 % of
// the threads, half the memory); a third pod waits.
func TestMPSPairWithLimits(t *testing.T) {
	if !driver.Real() {
		t.Skip("MPS runs NVIDIA's real control daemon: " + driver.String())
	}
	ctx := testCtx(t)
	const sharing = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}"
	shared := deployFor(t, ctx, rig.GPUs{NVML: rig.DefaultNVML, Sharing: sharing, Expect: map[string]int64{rig.Resource: 2}})
	d := need(t)
	names := []string{"mps-0", "mps-1", "mps-2"}
	for _, n := range names {
		createPod(t, ctx, n, podSpec{gpu: true, runtimeClass: true, image: rig.VLLMImage})
	}
	runningPods, waiting := splitPods(t, ctx, names, 2)
	pipe := mps.PathsOf(d.MPSDir(), shared.UUID).Pipe
	// 80 GiB of the A100's memory, halved: the daemon reports whole GiB.
	wantEnv := []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipe, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M"}
	for _, n := range runningPods {
		if got := containerGPUs(t, ctx, n); !slices.Equal(got, []string{shared.UUID}) {
			t.Errorf("pod %s sees %v, want only the MPS-shared GPU %s", n, got, shared.UUID)
		}
		out, err := d.Kube().Exec(ctx, ns, n, "", "/bin/sh", "-c",
			`env | grep '^CUDA_MPS_' | sort; echo get_default_active_thread_percentage | nvidia-cuda-mps-control; echo get_default_device_pinned_mem_limit 0 | nvidia-cuda-mps-control; ls -d /dev/shm`)
		if err != nil {
			t.Fatalf("MPS client in %s: %v", n, err)
		}
		t.Logf("%s:\n%s", n, out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		for _, e := range wantEnv {
			if !slices.Contains(lines, e) {
				t.Errorf("pod %s lacks %s in its env:\n%s", n, e, out)
			}
		}
		if len(lines) < 3 || lines[len(lines)-3] != "50.0" || lines[len(lines)-2] != "40G" {
			t.Errorf("pod %s: the real MPS control daemon answered %q, want 50.0 and 40G", n, lines)
		}
	}
	// The doctor sees the daemon up and the GPU within its 2 replicas.
	r := runDoctor(t, ctx, func(o *doctor.Options) {
		o.PodResourcesSocket = filepath.Join(d.Node().PodResourcesDir(), "kubelet.sock")
	})
	v, _ := r.Verdict(doctor.LayerAllocate)
	if ev := strings.Join(v.Evidence, "\n"); v.Status != doctor.OK || !strings.Contains(ev, "MPS control daemon of "+shared.UUID+" up") {
		t.Errorf("doctor allocate layer: %s, evidence:\n%s\nfix: %s", v.Status, ev, v.Fix)
	}
	t.Logf("FIGURE MPS: 3 pods created on 1 GPU with 2 MPS replicas: %d Running as clients of NVIDIA's real control daemon (50%% threads, 40G pinned each), %s Unschedulable", len(runningPods), waiting[0])
}
