package main

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvinject/nvinject/e2e/harness/rig"
)

// owner is the part of the evidence that depends on who hands the node's GPU
// to kubelet: nvinject-device-plugin (devicePlugin) or nvinject-dra (draDriver).
type owner interface {
	// published shows how the node offers its GPU to the scheduler.
	published(ctx context.Context, e evidence) error
	// capacity explains the Node's capacity c and allocatable a of nvidia.com/gpu.
	capacity(c, a int64) string
	// allocated shows what the pod was given and returns that GPU's UUID
	// and what holds it, for the check inside the container.
	allocated(ctx context.Context, e evidence) (uuid, holder string, err error)
	// checked says what nvinject-nri compared the injected UUID with.
	checked() string
}

// evidence prints the checks (GPU 状态检查) for the deployed node and
// the vLLM stand-in's pod.
type evidence struct {
	d   *rig.Deployer
	dep rig.Deployment
	pod *corev1.Pod
	sh  shell
}

func (e evidence) kubectl(args ...string) []string { return e.d.Kube().KubectlArgs(args...) }

// runAll runs each command line in turn and stops at the first failure.
func (e evidence) runAll(ctx context.Context, argvs ...[]string) error {
	for _, argv := range argvs {
		if _, err := e.sh.run(ctx, argv...); err != nil {
			return err
		}
	}
	return nil
}

func (e evidence) show(ctx context.Context, o owner) error {
	node, sh := e.d.Node(), e.sh
	sh.section("worker GPU list (SIMULATED host view of nvidia-smi; `docker exec <worker> nvidia-smi`)")
	if err := e.runAll(ctx, append(e.d.HostSMICommand(), "--query-gpu=index,uuid,name,mig.mode.current", "--format=csv,noheader")); err != nil {
		return err
	}
	if e.dep.All {
		sh.note("selected GPUs (ConfigMap single-gpu-device-plugin, selected-gpu-uuid): all")
	} else {
		sh.note("selected GPU (ConfigMap single-gpu-device-plugin, selected-gpu-uuid): %s", e.dep.UUID)
	}
	if err := o.published(ctx, e); err != nil {
		return err
	}

	sh.section("Node capacity / allocatable")
	if err := e.runAll(ctx, e.kubectl("get", "node", node.Name(), "-o",
		`jsonpath={"capacity: "}{.status.capacity.nvidia\.com/gpu}{"\nallocatable: "}{.status.allocatable.nvidia\.com/gpu}{"\n"}`)); err != nil {
		return err
	}
	c, a, err := e.d.NodeGPUs(ctx)
	if err != nil {
		return err
	}
	sh.note("%s", o.capacity(c, a))

	sh.section("the vLLM pod: node, RuntimeClass, GPU requests/limits")
	if err := e.runAll(ctx, e.kubectl("get", "pod", e.pod.Name, "-n", e.pod.Namespace, "-o",
		`jsonpath={"node: "}{.spec.nodeName}{"\nruntimeClassName: "}{.spec.runtimeClassName}{"\nrequests: "}{.spec.containers[0].resources.requests}{"\nlimits: "}{.spec.containers[0].resources.limits}{"\n"}`)); err != nil {
		return err
	}
	uuid, holder, err := o.allocated(ctx, e)
	if err != nil {
		return err
	}

	sh.section("CDI spec in the node's CDI dir (cdi/spec, the one generator of both modes)")
	if err := e.runAll(ctx, []string{"find", node.CDIDir(), "-maxdepth", "1", "-type", "f", "-print"},
		[]string{e.d.Bin("nvinject-cdi"), "list", "--cdi-spec-dir=" + node.CDIDir()}); err != nil {
		return err
	}

	sh.section("the GPU inside the container (SIMULATED GPU: its UUID query is nvidia-smi-sim, in the image)")
	got, err := sh.run(ctx, e.kubectl("exec", "-n", e.pod.Namespace, e.pod.Name, "--", "nvidia-smi-sim", "--query-gpu=uuid,name,memory.total", "--format=csv,noheader")...)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], uuid+",") {
		sh.note("MISMATCH: the container sees %q, %s is %s", strings.TrimSpace(got), holder, uuid)
		return fmt.Errorf("the container of %s does not see exactly %s %s", e.pod.Name, holder, uuid)
	}
	sh.note("MATCH: the container sees exactly %s %s", holder, uuid)
	if err := e.runAll(ctx, e.kubectl("logs", "-n", rig.Namespace, "daemonset/"+rig.NRIPlugin, "--tail=2")); err != nil {
		return err
	}
	sh.note("nvinject-nri checked the UUID it injected against %s before runc started the container", o.checked())
	if err := realDriver(ctx, e.d, e.pod.Name, sh); err != nil {
		return err
	}

	sh.section("one completion from the vLLM stand-in (SIMULATED: no inference; it reports the GPU it found)")
	if err := e.runAll(ctx, []string{"curl", "-sS", "--max-time", "10", "http://" + e.pod.Status.PodIP + ":8000/v1/completions",
		"-H", "Content-Type: application/json", "-d", rig.CompletionRequest}); err != nil {
		return err
	}

	sh.section("nvinject-doctor (each layer of the GPU chain)")
	_, err = sh.run(ctx, e.d.Bin("nvinject-doctor"), "--kubeconfig", e.d.Kube().Kubeconfig, "--node-name", node.Name(),
		"--cdi-spec-dir", strings.Join(e.d.CDISpecDirs(), ","), "--containerd-config", node.ContainerdConfig(),
		"--nvidia-smi", strings.Join(e.d.HostSMICommand(), " "))
	return err
}

// devicePlugin is the default mode: nvinject-device-plugin registers
// nvidia.com/gpu with kubelet, whose Allocate hands out the CDI name.
type devicePlugin struct{}

func (devicePlugin) published(ctx context.Context, e evidence) error {
	e.sh.section("device plugin DaemonSet and its kubelet socket")
	return e.runAll(ctx, e.kubectl("get", "daemonset", rig.DevicePlugin, "-n", rig.Namespace, "-o", "wide"),
		e.kubectl("logs", "-n", rig.Namespace, "daemonset/"+rig.DevicePlugin, "--tail=6"),
		[]string{"ls", "-l", "/var/lib/kubelet/device-plugins"})
}

func (devicePlugin) capacity(c, a int64) string {
	if c == 1 {
		return fmt.Sprintf("capacity %d, allocatable %d: the device plugin registered the one selected GPU with kubelet, healthy", c, a)
	}
	return fmt.Sprintf("capacity %d, allocatable %d: the device plugin registered %d devices of nvidia.com/gpu with kubelet (MIG devices or replicas)", c, a, c)
}

func (devicePlugin) allocated(_ context.Context, e evidence) (string, string, error) {
	return e.dep.UUID, "the selected GPU", nil
}

func (devicePlugin) checked() string { return "kubelet's allocation (PodResources devices)" }

// noDriver is what NVIDIA's nvidia-smi prints when its libraries load and the
// kernel module is not there.
const noDriver = "couldn't communicate with the NVIDIA driver"

// realDriver shows NVIDIA's REAL driver user space inside the container: the
// real nvidia-smi failing only for want of the kernel module, the driver's
// libraries loading as CUDA programs load them, and the ld.so.cache the spec's
// update-ldcache hook wrote; a spec without that hook fails the demo. On the
// simulated root it says why it is skipped.
func realDriver(ctx context.Context, d *rig.Deployer, pod string, sh shell) error {
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
	spec, err := sh.run(ctx, "/bin/sh", "-c", "grep -n update-ldcache "+d.Node().CDIDir()+"/*.yaml || echo \""+noHook+"\"")
	if err != nil {
		return err
	}
	ld, err := sh.run(ctx, exec(`ldconfig -p | grep -E 'libcuda|libnvidia-ml' || echo "ldconfig -p lists no NVIDIA library"`)...)
	if err != nil {
		return err
	}
	switch hooked, indexed := !strings.Contains(spec, noHook), strings.Contains(ld, "libcuda.so.1"); {
	case hooked && indexed:
		sh.note("the CDI spec's update-ldcache hook (nvinject-cdi-hook) indexed the driver's libraries in the container, where Triton (vLLM) looks for libcuda")
	case hooked:
		sh.note("UNEXPECTED: the spec runs the update-ldcache hook, and the container's ld.so.cache lists no libcuda.so.1")
		return fmt.Errorf("the update-ldcache hook did not index the driver's libraries in %s", pod)
	default:
		sh.note("UNEXPECTED: %s", noHook)
		return fmt.Errorf("the CDI spec in %s runs no createContainer hooks: the daemon writing it needs --hook-binary (deploy/)", d.Node().CDIDir())
	}
	return nil
}

// noHook is what the spec check prints for a spec without the update-ldcache hook.
const noHook = "the CDI spec runs no update-ldcache hook"

// showMIG prints the MIG evidence: what the node publishes, and the MIG
// device the vLLM pod sees with its access nodes.
func (e evidence) showMIG(ctx context.Context) error {
	sh := e.sh
	sh.section("MIG (SIMULATED layout " + e.dep.NVML + ", MIG_STRATEGY=" + e.dep.MIGStrategy + "): the node's GPU resources")
	if err := e.runAll(ctx, e.kubectl("get", "node", e.d.Node().Name(), "-o", `jsonpath={.status.allocatable}{"\n"}`)); err != nil {
		return err
	}
	sh.section("MIG: what the vLLM container sees (nvidia-smi -L lists a MIG device only with its access node)")
	return e.runAll(ctx, e.kubectl("exec", "-n", e.pod.Namespace, e.pod.Name, "--", "nvidia-smi-sim", "-L"),
		e.kubectl("exec", "-n", e.pod.Namespace, e.pod.Name, "--", "sh", "-c", "ls -l /dev/nvidia*; if [ -d /dev/nvidia-caps ]; then ls -l /dev/nvidia-caps; else echo 'no /dev/nvidia-caps: a whole GPU'; fi"))
}
