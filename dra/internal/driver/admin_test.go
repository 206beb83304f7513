package driver_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

func adminResult(device string) resourceapi.DeviceRequestAllocationResult {
	r := result("node-a", device)
	admin := true
	r.AdminAccess = &admin
	return r
}

// A claim with admin access is prepared on a GPU another claim holds, with
// its own CDI device marked admin access (nvinject-nri admits its pods
// beside the holder); a second claim without admin access is still
// refused; a restart writes the admin claim's spec again.
func TestPrepareAdminAccess(t *testing.T) {
	stateDir, specDir := t.TempDir(), t.TempDir()
	d := newSharingDriver(t, stateDir, specDir)
	if res := prepare(t, d, claim("uid-work", "work", result("node-a", "gpu-1"))); res.Err != nil {
		t.Fatal(res.Err)
	}
	res := prepare(t, d, claim("uid-mon", "monitor", adminResult("gpu-1")))
	if res.Err != nil {
		t.Fatalf("admin-access claim on a held GPU: %v", res.Err)
	}
	if got, want := res.Devices[0].CDIDeviceIDs, []string{"nvidia.com/gpu=GPU-bbb", "nvidia.com/claim=uid-mon"}; !reflect.DeepEqual(got, want) {
		t.Errorf("CDI names %v, want %v", got, want)
	}
	spec := filepath.Join(specDir, "nvidia.com-claim_uid-mon.json")
	data, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`"` + contract.AdminAccessAnnotation + `":"true"`, `"` + contract.SharedClaimUUIDsAnnotation + `":"GPU-bbb"`, contract.EnvSharedClaim + "=uid-mon"} {
		if !strings.Contains(string(data), w) {
			t.Errorf("admin claim spec lacks %s:\n%s", w, data)
		}
	}
	if res := prepare(t, d, claim("uid-other", "other", result("node-a", "gpu-1"))); res.Err == nil || !strings.Contains(res.Err.Error(), "already prepared for ResourceClaim default/work") {
		t.Errorf("second claim without admin access: %v", res.Err)
	}
	if err := os.Remove(spec); err != nil {
		t.Fatal(err)
	}
	newSharingDriver(t, stateDir, specDir)
	if _, err := os.Stat(spec); err != nil {
		t.Errorf("restart did not write the admin claim's spec again: %v", err)
	}
}

// Kubernetes 1.37's allocator gives an admin-access request a GPU another
// claim holds, on a node of whole GPUs. Where the GPUs consume counters
// (--gpu-shares, or MIG) it does too: the allocator skips the counter
// check for admin access.
func TestAdminAccessAllocation(t *testing.T) {
	for _, shares := range []bool{false, true} {
		var m *fakeMPS
		if shares {
			m = &fakeMPS{}
		}
		d := newSharingDriver(t, t.TempDir(), t.TempDir())
		if shares {
			d = newShareDriver(t, m, t.TempDir(), t.TempDir())
		}
		s := newScheduler(t, d.Resources())
		for _, n := range []string{"w0", "w1"} {
			if !s.allocate(unallocated("uid-"+n, n, request(contract.DRADriver, nil))) {
				t.Fatalf("shares %v: whole GPU %s not allocated", shares, n)
			}
		}
		req := request(contract.DRADriver, nil)
		admin := true
		req.Exactly.AdminAccess = &admin
		mon := unallocated("uid-mon", "mon", req)
		if !s.allocate(mon) {
			t.Errorf("shares %v: admin-access claim not allocated on a held GPU", shares)
			continue
		}
		if r := mon.Status.Allocation.Devices.Results[0]; r.AdminAccess == nil || !*r.AdminAccess {
			t.Errorf("shares %v: result %+v without admin access", shares, r)
		}
		if s.allocate(unallocated("uid-x", "x", request(contract.DRADriver, nil))) {
			t.Errorf("shares %v: a third whole GPU claim allocated on a node of two held GPUs", shares)
		}
	}
}

// A monitor of a GPU in shares asks the share class with admin access: the
// allocator gives it the share device in use (its counters are charged
// already), though it takes its request's capacity (the default 1Gi and
// 10 percent) as a share does; on the whole device it does not fit (whole
// and shares never together). Prepare runs no MPS daemon for it.
func TestAdminAccessBesideShares(t *testing.T) {
	d := newShareDriver(t, &fakeMPS{}, t.TempDir(), t.TempDir())
	s := newScheduler(t, d.Resources())
	for _, n := range []string{"a", "b"} {
		if !s.allocate(unallocated("uid-"+n, n, request(contract.DRAShareClass, map[string]string{"memory": "30Gi"}))) {
			t.Fatalf("share %s not allocated", n)
		}
	}
	admin := true
	whole := request(contract.DRADriver, nil)
	whole.Exactly.AdminAccess = &admin
	if !s.allocate(unallocated("uid-w", "w", request(contract.DRADriver, nil))) {
		t.Fatal("the other GPU not allocated whole")
	}
	if mon := unallocated("uid-m1", "m1", whole); s.allocate(mon) && mon.Status.Allocation.Devices.Results[0].Device == "gpu-0" {
		t.Errorf("admin access on the whole device of a GPU in shares: %+v", mon.Status.Allocation)
	}
	share := request(contract.DRAShareClass, nil)
	share.Exactly.AdminAccess = &admin
	mon := unallocated("uid-m2", "m2", share)
	if !s.allocate(mon) {
		t.Fatal("admin access on the share device in use not allocated")
	}
	r := mon.Status.Allocation.Devices.Results[0]
	if r.Device != "gpu-0-share" || r.AdminAccess == nil || !*r.AdminAccess {
		t.Errorf("monitor's result %+v", r)
	}
	m := &fakeMPS{}
	pd := newShareDriver(t, m, t.TempDir(), t.TempDir())
	c := claim("uid-m2", "m2", r)
	if res := prepare(t, pd, c); res.Err != nil || res.Devices[0].ShareID == nil || len(res.Devices[0].CDIDeviceIDs) != 2 {
		t.Errorf("prepare the monitor: %+v", res)
	}
	for _, ds := range m.synced {
		if len(ds) > 0 {
			t.Errorf("MPS daemons %+v for a monitor", ds)
		}
	}
}
