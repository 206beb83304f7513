package multinode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/e2e/harness/driverroot"
	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/shared/contract"
)

// driverInside is what a container's driver user space is, read inside it from the
// real files: the versions of its libcuda/NVML files and the version line of the
// real nvidia-smi (-h needs no kernel module). The libraries are read through, so a
// file whose host copy an upgrade removed must still be there for the container.
func driverInside(t *testing.T, ctx context.Context, p corev1.Pod) (libs []string, smi string) {
	t.Helper()
	const script = `cd /usr/lib/x86_64-linux-gnu && for f in libcuda.so.*.* libnvidia-ml.so.*.*; do [ -e "$f" ] && head -c 4 "$f" >/dev/null && echo "lib $f"; done; nvidia-smi -h | head -1`
	out, err := need(t).Kube().Exec(ctx, p.Namespace, p.Name, "main", "/bin/sh", "-c", script)
	if err != nil {
		t.Fatalf("driver files in pod %s on %s: %v\n%s", p.Name, p.Spec.NodeName, err, out)
	}
	for _, m := range regexp.MustCompile(`(?m)^lib lib[a-z-]+\.so\.([0-9.]+)$`).FindAllStringSubmatch(out, -1) {
		if !slices.Contains(libs, m[1]) {
			libs = append(libs, m[1])
		}
	}
	smi, ok := driverroot.SMIVersionLine(out)
	if !ok {
		t.Errorf("pod %s: the real nvidia-smi printed no version line:\n%s", p.Name, out)
	}
	return libs, smi
}

// onlyDriver checks a pod's driver user space is exactly version: no mix, no stale.
func onlyDriver(t *testing.T, ctx context.Context, p corev1.Pod, version string) {
	t.Helper()
	libs, smi := driverInside(t, ctx, p)
	t.Logf("pod %s on %s: libcuda/NVML files of %v, nvidia-smi -h says v%s", p.Name, p.Spec.NodeName, libs, smi)
	if !slices.Equal(libs, []string{version}) || smi != version {
		t.Errorf("pod %s on %s: libraries of %v, nvidia-smi %q; want only %s", p.Name, p.Spec.NodeName, libs, smi, version)
	}
}

func waitDriverLabel(t *testing.T, ctx context.Context, node, version string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	err := rig.Poll(ctx, 250*time.Millisecond, func(ctx context.Context) error {
		n, err := need(t).Kube().Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := n.Labels[contract.GFDLabelDriverVersion]; got != version {
			return fmt.Errorf("node %s reports driver %q", node, got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The rolling driver upgrade, 535.261.03 to 550.163.01, the real packages on both
// paths. On the device-plugin node an operator switches the root in place under a
// running GPU pod: it keeps 535, the daemon restarts on 550 and a new pod gets only
// 550. The DRA node is upgraded by nvinject-move upgrade, pods drained and back on 550.
func TestRollingDriverUpgrade(t *testing.T) {
	d := need(t)
	ctx := context.Background()
	if !d.Driver().Real() {
		t.Skip("the upgrade needs the real driver roots; DRIVER_LAYOUT=" + rig.Simulated + " has none")
	}
	next, err := rig.ChooseDriverVersion(ctx, driverroot.DriverVersion550, d.Driver().Layout, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !next.Real() {
		t.Skipf("no real %s root: %s", driverroot.DriverVersion550, next.Why)
	}
	var dp, dra rig.FleetNode
	for _, n := range nodes {
		switch {
		case n.Mode == contract.DRAModeDRA && dra.Name == "":
			dra = n
		case n.Mode == contract.DRAModeDevicePlugin && dp.Name == "" && !n.Driver.Real():
			dp = n
		}
	}
	old := runDeploymentOf(t, ctx, "old-driver", rig.VLLMImage, 1, map[string]string{"kubernetes.io/hostname": dp.Name})[0]
	onlyDriver(t, ctx, old, driverroot.DriverVersion)

	switchRoot, err := d.StageDriverUpgrade(ctx, dp, next)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if out, err := exec.CommandContext(ctx, "sh", "-c", switchRoot).CombinedOutput(); err != nil {
		t.Fatalf("switch %s's driver root: %v\n%s", dp.Name, err, out)
	}
	switched := time.Since(t0)
	waitDriverLabel(t, ctx, dp.Name, driverroot.DriverVersion550)
	if err := rig.Poll(ctx, 250*time.Millisecond, func(ctx context.Context) error { return d.FleetNodePublished(ctx, dp) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE upgrade in place %s (device plugin): root switched in %s, node on %s with its GPUs published %s after the switch",
		dp.Name, switched.Round(time.Millisecond), driverroot.DriverVersion550, time.Since(t0).Round(time.Millisecond))
	still, err := d.Kube().Client.CoreV1().Pods(ns).Get(ctx, old.Name, metav1.GetOptions{})
	if err != nil || still.UID != old.UID || still.Status.Phase != corev1.PodRunning || still.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("the running pod %s across the upgrade: %v, %+v; want it running on, not restarted", old.Name, err, still.Status.ContainerStatuses)
	}
	onlyDriver(t, ctx, old, driverroot.DriverVersion)
	fresh := runDeploymentOf(t, ctx, "new-driver", rig.VLLMImage, 1, map[string]string{"kubernetes.io/hostname": dp.Name})[0]
	onlyDriver(t, ctx, fresh, driverroot.DriverVersion550)

	const app = "dra-upgrade"
	before := runDeploymentOf(t, ctx, app, rig.VLLMImage, 2, map[string]string{"kubernetes.io/hostname": dra.Name})
	for _, p := range before {
		onlyDriver(t, ctx, p, driverroot.DriverVersion)
	}
	switchRoot, err = d.StageDriverUpgrade(ctx, dra, next)
	if err != nil {
		t.Fatal(err)
	}
	r, err := nvinjectMove(t, ctx, "upgrade", dra.Name, "--driver-version="+driverroot.DriverVersion550, "--run="+switchRoot)
	if err != nil || len(r) != 1 || r[0].NoOp {
		t.Fatalf("nvinject-move upgrade %s: %+v, %v", dra.Name, r, err)
	}
	logSteps(t, r[0])
	onNodeWithOwnGPUs(t, ctx, dra, "app="+app, 2)
	for _, p := range waitRunning(t, ctx, "app="+app, 2) {
		onlyDriver(t, ctx, p, driverroot.DriverVersion550)
	}
	again, err := nvinjectMove(t, ctx, "upgrade", dra.Name, "--driver-version="+driverroot.DriverVersion550, "--run=false")
	if err != nil || len(again) != 1 || !again[0].NoOp {
		t.Errorf("second upgrade of %s: %+v, %v; want a no-op that runs nothing", dra.Name, again, err)
	}
}
