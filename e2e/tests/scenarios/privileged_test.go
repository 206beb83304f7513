package scenarios

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/e2e/internal/hostclean"
	"github.com/nvinject/nvinject/shared/contract"
)

// The host has the device nodes of a GPU host with the driver loaded
// (created by the harness, harmless without the kernel module), with the
// numbers nvinject's CDI spec names. A privileged pod outside RuntimeClass
// nvidia and without a GPU request then sees every one of them: containerd
// gives a privileged container the host's /dev and allows every device in
// its cgroup, which is not an NRI adjustment, so nvinject-nri (it refuses
// GPUs an NRI plugin adds outside its runtime handler) lets it run
// unchecked. In RuntimeClass nvidia the same privileged container is
// refused. The README's "Privileged containers" section is this test's
// record.
func TestPrivilegedPodSeesHostGPUs(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	host, err := d.HostGPUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := rig.HostDevices(len(host))
	slices.SortFunc(want, func(a, b hostclean.CharDevice) int { return strings.Compare(a.Path, b.Path) })
	for _, dev := range want {
		if got, err := hostDevice(dev.Path); err != nil || got != dev {
			t.Errorf("host %s = %+v (%v), want char %d:%d", dev.Path, got, err, dev.Major, dev.Minor)
		}
	}
	checkSpecNodesOnHost(t, want)

	createPod(t, ctx, "plain-devs", podSpec{})
	waitPod(t, ctx, "plain-devs", 2*time.Minute, "Running", running)
	if got := containerNVIDIANodes(t, "plain-devs"); len(got) != 0 {
		t.Errorf("an unprivileged pod without a GPU sees %v, want no NVIDIA device node", got)
	}

	injected, refused := nriCounter(t, ctx, contract.MetricNRIInjections), nriCounter(t, ctx, contract.MetricNRIRefusals)
	createPod(t, ctx, "privileged-devs", podSpec{privileged: true})
	waitPod(t, ctx, "privileged-devs", 2*time.Minute, "Running", running)
	got := containerNVIDIANodes(t, "privileged-devs")
	t.Logf("FIGURE privileged pod, no RuntimeClass nvidia, no GPU request: Running, sees %d of the host's %d NVIDIA device nodes: %v", len(got), len(want), got)
	if !slices.Equal(got, want) {
		t.Errorf("privileged pod sees %v, want the host's %v", got, want)
	}
	if i, r := nriCounter(t, ctx, contract.MetricNRIInjections), nriCounter(t, ctx, contract.MetricNRIRefusals); i != injected || r != refused {
		t.Errorf("nvinject-nri injections %v -> %v, refusals %v -> %v: it should neither inject into nor refuse a pod outside its runtime handler", injected, i, refused, r)
	}

	createPod(t, ctx, "privileged-gpu", podSpec{gpu: true, runtimeClass: true, privileged: true})
	p := waitPod(t, ctx, "privileged-gpu", 2*time.Minute, "CreateContainerError", createError)
	_, msg := waitingReason(p)
	t.Logf("FIGURE privileged GPU pod in RuntimeClass nvidia: CreateContainerError: %s", short(msg))
	if !strings.Contains(msg, "nvinject") || !strings.Contains(msg, "privileged") {
		t.Errorf("privileged GPU pod's CreateContainerError = %q, want nvinject's refusal naming the privileged setting", msg)
	}
}

// hostDevice stats a host path as a character device.
func hostDevice(path string) (hostclean.CharDevice, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return hostclean.CharDevice{}, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return hostclean.CharDevice{}, fmt.Errorf("%s is not a character device (mode %o)", path, st.Mode)
	}
	return hostclean.CharDevice{Path: path, Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)}, nil
}

// checkSpecNodesOnHost: every device node in nvinject's CDI spec is one of
// the host's, with the same numbers, so a privileged container and a CDI
// injection see the same /dev.
func checkSpecNodesOnHost(t *testing.T, host []hostclean.CharDevice) {
	t.Helper()
	type nodes struct {
		DeviceNodes []struct {
			Path         string
			Major, Minor uint32
		} `json:"deviceNodes"`
	}
	var spec struct {
		Kind    string `json:"kind"`
		Devices []struct {
			ContainerEdits nodes `json:"containerEdits"`
		} `json:"devices"`
		ContainerEdits nodes `json:"containerEdits"`
	}
	files, _ := filepath.Glob(filepath.Join(need(t).Node().CDIDir(), "*.yaml"))
	checked := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, &spec); err != nil || spec.Kind != contract.CDIKind(contract.CDIVendor, contract.CDIClass) {
			continue
		}
		all := spec.ContainerEdits.DeviceNodes
		for _, dev := range spec.Devices {
			all = append(all, dev.ContainerEdits.DeviceNodes...)
		}
		for _, n := range all {
			checked++
			if !slices.Contains(host, hostclean.CharDevice{Path: n.Path, Major: n.Major, Minor: n.Minor}) {
				t.Errorf("CDI spec %s names %s %d:%d, which the host does not have (host: %v)", f, n.Path, n.Major, n.Minor, host)
			}
		}
	}
	if checked == 0 {
		t.Errorf("no device node in any %s spec in %s", contract.CDIKind(contract.CDIVendor, contract.CDIClass), need(t).Node().CDIDir())
	}
}

// containerNVIDIANodes lists the NVIDIA device nodes in pod name's /dev, by
// busybox stat (major and minor in hex).
func containerNVIDIANodes(t *testing.T, name string) []hostclean.CharDevice {
	t.Helper()
	ctx := testCtx(t)
	out, err := need(t).Kube().Exec(ctx, ns, name, "", "/bin/sh", "-c",
		`for f in /dev/nvidia*; do [ -c "$f" ] && busybox stat -c '%n %t %T' "$f"; done; true`)
	if err != nil {
		t.Fatalf("list /dev/nvidia* in %s: %v", name, err)
	}
	var devs []hostclean.CharDevice
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		maj, err1 := strconv.ParseUint(f[1], 16, 32)
		minor, err2 := strconv.ParseUint(f[2], 16, 32)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: unexpected stat line %q", name, line)
		}
		devs = append(devs, hostclean.CharDevice{Path: f[0], Major: uint32(maj), Minor: uint32(minor)})
	}
	slices.SortFunc(devs, func(a, b hostclean.CharDevice) int { return strings.Compare(a.Path, b.Path) })
	return devs
}
