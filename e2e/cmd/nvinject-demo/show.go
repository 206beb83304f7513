package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/nvinject/nvinject/e2e/simnode"
)

// evidence prints the seed's checks (GPU 状态检查) for the deployed node.
func evidence(ctx context.Context, d *simnode.Deployer, dep simnode.Deployment, pod, ip string, sh shell) error {
	k := d.Kube()
	node := d.Node()
	kubectl := k.KubectlArgs
	sh.section("worker GPU list (SIMULATED host view of nvidia-smi; the seed's `docker exec <worker> nvidia-smi`)")
	if _, err := sh.run(ctx, append(d.HostSMICommand(), "--query-gpu=index,uuid,name,mig.mode.current", "--format=csv,noheader")...); err != nil {
		return err
	}
	sh.note("selected GPU (ConfigMap single-gpu-device-plugin, selected-gpu-uuid): %s", dep.UUID)

	sh.section("device plugin DaemonSet and its kubelet socket")
	if _, err := sh.run(ctx, kubectl("get", "daemonset", simnode.DevicePlugin, "-n", simnode.Namespace, "-o", "wide")...); err != nil {
		return err
	}
	if _, err := sh.run(ctx, kubectl("logs", "-n", simnode.Namespace, "daemonset/"+simnode.DevicePlugin, "--tail=6")...); err != nil {
		return err
	}
	if _, err := sh.run(ctx, "ls", "-l", "/var/lib/kubelet/device-plugins"); err != nil {
		return err
	}

	sh.section("Node capacity / allocatable")
	if _, err := sh.run(ctx, kubectl("get", "node", node.Name(), "-o",
		`jsonpath={"capacity: "}{.status.capacity.nvidia\.com/gpu}{"\nallocatable: "}{.status.allocatable.nvidia\.com/gpu}{"\n"}`)...); err != nil {
		return err
	}

	sh.section("the vLLM pod: node, RuntimeClass, GPU requests/limits")
	if _, err := sh.run(ctx, kubectl("get", "pod", pod, "-n", "default", "-o",
		`jsonpath={"node: "}{.spec.nodeName}{"\nruntimeClassName: "}{.spec.runtimeClassName}{"\nrequests: "}{.spec.containers[0].resources.requests}{"\nlimits: "}{.spec.containers[0].resources.limits}{"\n"}`)...); err != nil {
		return err
	}

	sh.section("CDI spec written by the device plugin (the node's CDI dir)")
	if _, err := sh.run(ctx, "find", node.CDIDir(), "-maxdepth", "1", "-type", "f", "-print"); err != nil {
		return err
	}
	if _, err := sh.run(ctx, d.Bin("nvinject-cdi"), "list", "--cdi-spec-dir="+node.CDIDir()); err != nil {
		return err
	}

	sh.section("the GPU inside the container (SIMULATED GPU: its UUID query is nvidia-smi-sim, in the image)")
	got, err := sh.run(ctx, kubectl("exec", "-n", "default", pod, "--", "nvidia-smi-sim", "--query-gpu=uuid,name,memory.total", "--format=csv,noheader")...)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], dep.UUID+",") {
		sh.note("MISMATCH: the container sees %q, the selected GPU is %s", strings.TrimSpace(got), dep.UUID)
		return fmt.Errorf("the container does not see exactly the selected GPU %s", dep.UUID)
	}
	sh.note("MATCH: the container sees exactly the selected GPU %s", dep.UUID)
	if _, err := sh.run(ctx, kubectl("logs", "-n", simnode.Namespace, "daemonset/"+simnode.NRIPlugin, "--tail=2")...); err != nil {
		return err
	}
	sh.note("nvinject-nri checked the UUID it injected against kubelet's allocation (PodResources) before runc started the container")
	if err := realDriver(ctx, d, pod, sh); err != nil {
		return err
	}

	sh.section("one completion from the vLLM stand-in (SIMULATED: no inference; it reports the GPU it found)")
	if _, err := sh.run(ctx, "curl", "-sS", "--max-time", "10", "http://"+ip+":8000/v1/completions",
		"-H", "Content-Type: application/json", "-d", simnode.CompletionRequest); err != nil {
		return err
	}

	sh.section("nvinject-doctor (each layer of the GPU chain)")
	_, err = sh.run(ctx, d.Bin("nvinject-doctor"), "--kubeconfig", k.Kubeconfig, "--node-name", node.Name(),
		"--cdi-spec-dir", strings.Join(d.CDISpecDirs(), ","), "--containerd-config", node.ContainerdConfig(),
		"--nvidia-smi", strings.Join(d.HostSMICommand(), " "))
	return err
}

// noDriver is what NVIDIA's nvidia-smi prints when its libraries load and the
// kernel module is not there.
const noDriver = "couldn't communicate with the NVIDIA driver"

// realDriver shows NVIDIA's REAL driver user space inside the container: the
// real nvidia-smi failing only for want of the kernel module, the driver's
// libraries loading as CUDA programs load them, and the ld.so.cache the spec's
// update-ldcache hook wrote. On the simulated root it says why it is skipped.
func realDriver(ctx context.Context, d *simnode.Deployer, pod string, sh shell) error {
	drv := d.Driver()
	if !drv.Real() {
		sh.section("NVIDIA's real driver user space inside the container: not shown")
		sh.note("%s", drv)
		return nil
	}
	exec := func(script string) []string {
		return d.Kube().KubectlArgs("exec", "-n", "default", pod, "--", "/bin/sh", "-c", script)
	}
	sh.section("NVIDIA's REAL driver user space inside the container (" + drv.Layout + " layout; no kernel module, no GPU)")
	out, err := sh.run(ctx, exec(`command -v nvidia-smi; nvidia-smi; echo "exit status $?"`)...)
	if err != nil {
		return err
	}
	if !strings.Contains(out, noDriver) || !strings.Contains(out, "exit status 9") {
		sh.note("UNEXPECTED: the real nvidia-smi should fail only with %q (exit 9)", noDriver)
		return fmt.Errorf("the real nvidia-smi in %s did not fail as a driver without its kernel module does", pod)
	}
	sh.note("the real nvidia-smi loaded the injected libraries and found no kernel driver: what it says on any host whose module is not loaded")
	if _, err := sh.run(ctx, d.Kube().KubectlArgs("exec", "-n", "default", pod, "--", "gpu-probe")...); err != nil {
		return fmt.Errorf("a driver library did not load in %s: %w", pod, err)
	}
	sh.note("every library loads; cuInit 100 (no device) and nvmlInit 9 (Driver Not Loaded) are what the real driver answers without its kernel module")
	if _, err := sh.run(ctx, exec(`ldconfig -p | grep -E 'libcuda|libnvidia-ml' || echo "ldconfig -p lists no NVIDIA library"`)...); err != nil {
		return err
	}
	sh.note("the CDI spec's update-ldcache hook (nvinject-cdi-hook) indexed the driver's libraries in the container, where Triton (vLLM) looks for libcuda")
	return nil
}
