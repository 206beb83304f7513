package scenarios

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// enableDRAMIGOnDemand patches nvinject-dra's DaemonSet with the shipped
// deploy/components/dra-mig-on-demand (--mig-on-demand, privileged) and,
// for the SIMULATED driver only, a writable driver root (the simulated
// driver shares a made MIG device through the root's state file). It
// waits until the node's slices show GPU 1's first 1g.10gb placement; the
// returned func puts the container back as it was and waits until they no
// longer do.
func enableDRAMIGOnDemand(t *testing.T, ctx context.Context) (restore func()) {
	t.Helper()
	d := need(t)
	cur, err := d.Kube().Client.AppsV1().DaemonSets(rig.Namespace).Get(ctx, rig.DRADaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var writable []map[string]any
	for i, m := range cur.Spec.Template.Spec.Containers[0].VolumeMounts {
		if m.Name == "driver-root" {
			writable = append(writable, map[string]any{"op": "replace", "path": fmt.Sprintf("/spec/template/spec/containers/0/volumeMounts/%d/readOnly", i), "value": false})
		}
	}
	undo, err := d.ApplyDRAComponent(ctx, "dra-mig-on-demand", writable...)
	if err != nil {
		t.Fatal(err)
	}
	placement := contract.DRAMIGSlotDeviceName(1, "1g.10gb", 0)
	if err := d.WaitSliceDevice(ctx, placement, true); err != nil {
		t.Fatal(err)
	}
	pod, err := d.DRAPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c := pod.Spec.Containers[0]; !rig.Privileged(c) || !slices.Contains(c.Args, "--mig-on-demand") {
		t.Fatalf("nvinject-dra's pod %s after the component: args %v, securityContext %+v; want --mig-on-demand, privileged", pod.Name, c.Args, c.SecurityContext)
	}
	return func() {
		if err := errors.Join(undo(context.Background()), d.WaitSliceDevice(context.Background(), placement, false)); err != nil {
			t.Fatal(err)
		}
	}
}

// simMIGInstances are the MIG UUIDs the SIMULATED driver root's state file
// lists on GPU gpu; none without a file.
func simMIGInstances(gpu int) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(rig.DriverRoot, sim.StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st sim.State
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", sim.StateFile, err)
	}
	var out []string
	for _, g := range st.GPUs {
		if g.Index != gpu {
			continue
		}
		for _, gi := range g.GPUInstances {
			for _, ci := range gi.ComputeInstances {
				out = append(out, ci.UUID)
			}
		}
	}
	return out, nil
}

// A 1g.10gb claim on a GPU with MIG mode on and no instance
// (nvinject-dra deployed with components/dra-mig-on-demand: privileged,
// --mig-on-demand; A100 GPU 1 of a SIMULATED node) runs on
// an instance made for it at prepare: the pod gets GPU 1 and that MIG
// device's UUID in its env, the driver's shared state lists it; once the
// pod is deleted the instance is gone.
func TestDRAMIGOnDemand(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	if err := d.ImportDRAImage(ctx); err != nil {
		t.Fatal(err)
	}
	const nvml = "sim:a100-80gb*2,mig=1"
	g := deployFor(t, ctx, rig.GPUs{NVML: nvml, All: true, MIGStrategy: "mixed", Expect: map[string]int64{rig.Resource: 1}})
	_, err := d.SwitchToDRA(ctx, g, 3*time.Minute)
	t.Cleanup(func() {
		if _, err := d.SwitchToDevicePlugin(context.Background(), g, 3*time.Minute); err != nil {
			t.Errorf("switch back to the device plugin: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(enableDRAMIGOnDemand(t, ctx))
	node, err := rig.SimulatedGPUs(ctx, nvml)
	if err != nil {
		t.Fatal(err)
	}
	attr := `device.attributes["` + contract.DRADriver + `"].`
	createCELTemplate(t, ctx, "mig-1g-on-demand", attr+contract.DRAAttrType+` == "`+contract.DRATypeMIG+`" && `+attr+contract.DRAAttrProfile+` == "1g.10gb"`)
	t0 := time.Now()
	createDRAPod(t, ctx, "dra-mig-on-demand", podSpec{runtimeClass: true}, "mig-1g-on-demand")
	waitPod(t, ctx, "dra-mig-on-demand", 2*time.Minute, "Running", running)
	took := time.Since(t0)
	// nvidia-smi-sim lists the GPUs of the layout the pod's spec named;
	// the made MIG device is named by its env, as in
	// TestMIGLayoutChangeAtRuntime.
	if seen := smiList(t, ctx, "dra-mig-on-demand"); !slices.Contains(seen, node.Devices[1].UUID) || slices.Contains(seen, node.Devices[0].UUID) {
		t.Errorf("nvidia-smi -L in the pod lists %v, want GPU 1 %s and not GPU 0", seen, node.Devices[1].UUID)
	}
	env, err := d.Kube().Exec(ctx, ns, "dra-mig-on-demand", "", "sh", "-c", "env | grep "+contract.EnvMIGUUIDPrefix)
	_, uuid, _ := strings.Cut(strings.TrimSpace(env), "=")
	made, serr := simMIGInstances(1)
	if err != nil || !strings.HasPrefix(uuid, "MIG-") || strings.Contains(strings.TrimSpace(env), "\n") || serr != nil || !slices.Equal(made, []string{uuid}) {
		t.Fatalf("the pod's MIG env %q (%v); the simulated driver lists %v (%v) on GPU 1; want one MIG device, made for the pod", env, err, made, serr)
	}
	deletePod(t, "dra-mig-on-demand")
	err = rig.Poll(ctx, 200*time.Millisecond, func(context.Context) error {
		left, err := simMIGInstances(1)
		if err == nil && len(left) > 0 {
			err = fmt.Errorf("GPU 1 still has %v", left)
		}
		return err
	})
	if err != nil {
		t.Fatalf("the instance made for the pod is not gone after it ended: %v", err)
	}
	t.Logf("FIGURE DRA MIG on demand: a 1g.10gb claim on GPU 1 without instances, pod create → Running %s on %s made for it; gone after the pod ended", took.Round(time.Millisecond), uuid)
}
