package daemon

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

func percentiles(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	at := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}

// BenchmarkAnchorGetInfoOverSocket is the anchor for the prepare figure:
// the registrar's GetInfo, an RPC that does no work, through the same
// kubeletplugin gRPC stack over a unix socket.
func BenchmarkAnchorGetInfoOverSocket(b *testing.B) {
	r := newRig(b, "sim:a100-80gb*8")
	reg := registerapi.NewRegistrationClient(dial(b, filepath.Join(r.cfg.RegistrarDir, contract.DRADriver+"-reg.sock")))
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	percentiles(b, lat)
}

// BenchmarkNodePrepareResources is kubelet's NodePrepareResources of one
// new one-GPU claim over dra.sock: the helper's claim read (from an
// in-process fake API server, so no network round trip), the checks, and
// the checkpoint written with fsync. Each claim is unprepared untimed.
func BenchmarkNodePrepareResources(b *testing.B) {
	r := newRig(b, "sim:a100-80gb*8")
	r.register(b)
	benchPrepare(b, r.dra(b), r.claim(b, "bench", "uid-bench", "gpu-3"))
}

// BenchmarkNodePrepareResourcesMIG is the same for a MIG device and, on
// the same node in the same run, for the whole GPU beside it.
func BenchmarkNodePrepareResourcesMIG(b *testing.B) {
	r := newRig(b, "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb*2")
	r.register(b)
	c := r.dra(b)
	gpu := r.claim(b, "bench-gpu", "uid-bench-gpu", "gpu-0")
	mig := r.claim(b, "bench-mig", "uid-bench-mig", contract.DRAMIGDeviceName(1, "1g.10gb", 1, 0))
	b.Run("gpu", func(b *testing.B) { benchPrepare(b, c, gpu) })
	b.Run("mig", func(b *testing.B) { benchPrepare(b, c, mig) })
}

// BenchmarkNodePrepareResourcesMIGOnDemand is NodePrepareResources of a
// claim on a placement (--mig-on-demand): the claim checkpointed as
// pending, the GPU and compute instance made through the SIMULATED NVML,
// the node's CDI spec rewritten with the made MIG device, the claim
// checkpointed; each untimed unprepare destroys it again. Against the whole
// GPU's prepare on the same node in the same run.
func BenchmarkNodePrepareResourcesMIGOnDemand(b *testing.B) {
	r := newRig(b, "sim:a100-80gb*2,mig=1", "--mig-on-demand")
	r.register(b)
	c := r.dra(b)
	gpu := r.claim(b, "bench-gpu", "uid-bench-gpu", "gpu-0")
	mig := r.claim(b, "bench-mig", "uid-bench-mig", contract.DRAMIGSlotDeviceName(1, "1g.10gb", 0))
	b.Run("gpu", func(b *testing.B) { benchPrepare(b, c, gpu) })
	b.Run("on-demand", func(b *testing.B) { benchPrepare(b, c, mig) })
}

func benchPrepare(b *testing.B, c drapbv1.DRAPluginClient, claim *drapbv1.Claim) {
	req := &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{claim}}
	un := &drapbv1.NodeUnprepareResourcesRequest{Claims: []*drapbv1.Claim{claim}}
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		resp, err := c.NodePrepareResources(context.Background(), req)
		lat = append(lat, time.Since(t0))
		if err != nil || resp.Claims[claim.Uid].GetError() != "" || len(resp.Claims[claim.Uid].GetDevices()) != 1 {
			b.Fatalf("prepare: %v %v", resp, err)
		}
		if _, err := c.NodeUnprepareResources(context.Background(), un); err != nil {
			b.Fatal(err)
		}
	}
	percentiles(b, lat)
}

// BenchmarkNodePrepareResourcesShare is NodePrepareResources of a GPU
// share (consumable capacity, --gpu-shares): its own MPS control daemon
// started and its limits set before the answer, against the whole GPU's
// prepare on the same node in the same run. NVIDIA's real control program
// runs (no GPU needed until a client connects): the benchmark takes the
// driver root holding it from NVINJECT_BENCH_DRIVER_ROOT (e.g.
// ~/.cache/nvinject/driver-root-535.261.03-flat-*/root) and is skipped
// without it.
func BenchmarkNodePrepareResourcesShare(b *testing.B) {
	root := os.Getenv("NVINJECT_BENCH_DRIVER_ROOT")
	if root == "" {
		b.Skip("set NVINJECT_BENCH_DRIVER_ROOT to a driver root with nvidia-cuda-mps-control")
	}
	mpsDir, err := os.MkdirTemp("", "nvmps")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(mpsDir) })
	r := newRig(b, "sim:a100-80gb*2", "--gpu-shares", "--driver-root="+root, "--mps-dir="+mpsDir)
	r.register(b)
	c := r.dra(b)
	gpu := r.claim(b, "bench-gpu", "uid-bench-gpu", "gpu-0")
	share := r.shareClaim(b, "bench-share", "uid-bench-share", contract.DRAShareDeviceName(1), "20Gi", 25)
	b.Run("gpu", func(b *testing.B) { benchPrepare(b, c, gpu) })
	b.Run("share", func(b *testing.B) { benchPrepare(b, c, share) })
}
