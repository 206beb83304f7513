package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

// cdiSpecs is the CDI spec dir's files' content.
func (r *rig) cdiSpecs(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(r.dir, "cdi", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(data)
	}
	return b.String()
}

// With --mig-on-demand, kubelet's NodePrepareResources of a claim on a
// placement of a GPU without MIG devices makes one: the answer names it in
// the node's CDI spec, which lists it; the layout watch (every 10ms) does
// not republish it as a new layout; NodeUnprepareResources destroys it and
// the spec no longer lists it. The GPUs are SIMULATED.
func TestMIGOnDemandThroughTheDRASocket(t *testing.T) {
	r := newRig(t, "sim:a100-80gb*2,mig=1", "--mig-on-demand", "--mig-rescan-interval=10ms")
	r.register(t)
	c := r.dra(t)
	placement := contract.DRAMIGSlotDeviceName(1, "1g.10gb", 0)
	claim := r.claim(t, "on-demand", "uid-on-demand", placement)
	resp, err := c.NodePrepareResources(context.Background(), &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{claim}})
	if err != nil || resp.Claims[claim.Uid].GetError() != "" || len(resp.Claims[claim.Uid].GetDevices()) != 1 {
		t.Fatalf("prepare: %v %v", resp, err)
	}
	ids := resp.Claims[claim.Uid].Devices[0].CdiDeviceIds
	uuid, ok := strings.CutPrefix(strings.Join(ids, ","), "nvidia.com/gpu=MIG-")
	if !ok {
		t.Fatalf("CDI devices %v, want the made MIG device's", ids)
	}
	uuid = "MIG-" + uuid
	if !strings.Contains(r.cdiSpecs(t), uuid) {
		t.Errorf("the CDI spec does not list the made MIG device %s", uuid)
	}
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-r.done:
		t.Fatalf("the daemon ended: %v", err)
	default:
	}
	if devs := r.migDevices(t); len(devs) != 0 {
		t.Errorf("the made MIG device is published as a free one: %v", devs)
	}
	if _, err := c.NodeUnprepareResources(context.Background(), &drapbv1.NodeUnprepareResourcesRequest{Claims: []*drapbv1.Claim{claim}}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(r.cdiSpecs(t), uuid) {
		t.Errorf("the CDI spec still lists the destroyed MIG device %s", uuid)
	}
	if err := r.d.Ready(); err != nil {
		t.Errorf("not ready after unprepare: %v", err)
	}
}

// A node whose only GPU has MIG mode on and no MIG device starts with
// --mig-on-demand: its CDI spec has no device, so there is no file; a
// claim's MIG device brings it, and its unprepare takes it away again.
func TestMIGOnDemandOnlyGPU(t *testing.T) {
	r := newRig(t, "sim:a100-80gb,mig=0", "--mig-on-demand")
	r.register(t)
	if s := r.cdiSpecs(t); s != "" {
		t.Errorf("a CDI spec before any MIG device: %s", s)
	}
	c := r.dra(t)
	claim := r.claim(t, "only", "uid-only", contract.DRAMIGSlotDeviceName(0, "7g.80gb", 0))
	resp, err := c.NodePrepareResources(context.Background(), &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{claim}})
	if err != nil || resp.Claims[claim.Uid].GetError() != "" {
		t.Fatalf("prepare: %v %v", resp, err)
	}
	if s := r.cdiSpecs(t); !strings.Contains(s, "MIG-") {
		t.Errorf("the CDI spec lacks the made MIG device: %s", s)
	}
	if _, err := c.NodeUnprepareResources(context.Background(), &drapbv1.NodeUnprepareResourcesRequest{Claims: []*drapbv1.Claim{claim}}); err != nil {
		t.Fatal(err)
	}
	if s := r.cdiSpecs(t); s != "" {
		t.Errorf("a CDI spec after the last MIG device went: %s", s)
	}
}
