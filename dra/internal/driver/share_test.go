package driver_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/dra/internal/claimspec"
	"github.com/nvinject/nvinject/dra/internal/driver"
	"github.com/nvinject/nvinject/gpunode/health"
	gpumps "github.com/nvinject/nvinject/gpunode/mps"
	"github.com/nvinject/nvinject/shared/contract"
)

// newSharingDriver is newDriver with per-claim CDI specs in specDir.
func newSharingDriver(t *testing.T, stateDir, specDir string, opts ...driver.Option) *driver.Driver {
	t.Helper()
	h := &fakeHealth{states: []health.State{{UUID: "GPU-aaa", Healthy: true}, {UUID: "GPU-bbb", Healthy: true}}}
	st, err := checkpoint.Open(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d, err := driver.New("node-a", node, node.Devices, cdiName, h, st, append([]driver.Option{driver.WithClaimSpecs(claimspec.New(specDir, "nvidia.com"))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// withConfig gives c an allocated opaque config of driver for requests.
func withConfig(c *resourceapi.ResourceClaim, src resourceapi.AllocationConfigSource, driver, params string, requests ...string) *resourceapi.ResourceClaim {
	c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source: src, Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}}})
	return c
}

const (
	timeSlicing = `{"apiVersion":"gpu.nvinject.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Default"}}}`
	mps         = `{"apiVersion":"gpu.nvinject.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi"}}}`
)

func claimSpecFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "nvidia.com-claim_*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A claim shared by time-slicing is answered with its GPU and its own
// CDI device, whose spec (one file per claim UID, valid CDI) names the
// claim and its GPU; unprepare removes the file. A claim without config
// is answered as before, with no file.
func TestPrepareSharedClaimWritesItsSpec(t *testing.T) {
	specDir := t.TempDir()
	d := newSharingDriver(t, t.TempDir(), specDir)
	shared := withConfig(claim("6f1c4e2a-0000-4000-8000-000000000001", "shared", result("node-a", "gpu-1")), resourceapi.AllocationConfigSourceClaim, contract.DRADriver, timeSlicing)
	res := prepare(t, d, shared)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	claimDev := "nvidia.com/claim=" + string(shared.UID)
	if got, want := res.Devices[0].CDIDeviceIDs, []string{"nvidia.com/gpu=GPU-bbb", claimDev}; !reflect.DeepEqual(got, want) {
		t.Fatalf("CDI names %v, want %v", got, want)
	}
	files := claimSpecFiles(t, specDir)
	if len(files) != 1 || !strings.Contains(files[0], string(shared.UID)) {
		t.Fatalf("per-claim spec files %v, want one for the claim", files)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	dev := cache.GetDevice(claimDev)
	if dev == nil {
		t.Fatalf("CDI does not resolve %s: %v", claimDev, cache.GetErrors())
	}
	if dev.Annotations[contract.SharedClaimAnnotation] != string(shared.UID) || dev.Annotations[contract.SharedClaimUUIDsAnnotation] != "GPU-bbb" {
		t.Errorf("annotations %v, want the claim UID and GPU-bbb", dev.Annotations)
	}
	if !slices.Contains(dev.ContainerEdits.Env, contract.EnvSharedClaim+"="+string(shared.UID)) {
		t.Errorf("env %v lacks %s", dev.ContainerEdits.Env, contract.EnvSharedClaim)
	}
	// Prepared again (another pod of the claim): the same answer.
	if again := prepare(t, d, shared); !reflect.DeepEqual(again, res) {
		t.Errorf("second prepare %+v, want %+v", again, res)
	}

	plain := prepare(t, d, claim("uid-plain", "plain", result("node-a", "gpu-0")))
	if plain.Err != nil || !reflect.DeepEqual(plain.Devices[0].CDIDeviceIDs, []string{"nvidia.com/gpu=GPU-aaa"}) {
		t.Fatalf("claim without config: %+v, want only its GPU", plain)
	}
	if files := claimSpecFiles(t, specDir); len(files) != 1 {
		t.Errorf("per-claim spec files %v after an unshared claim, want the shared one only", files)
	}

	out, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: shared.UID}, {UID: "uid-plain"}})
	if err != nil || out[shared.UID] != nil || out["uid-plain"] != nil {
		t.Fatalf("unprepare: %v %v", out, err)
	}
	if files := claimSpecFiles(t, specDir); len(files) != 0 {
		t.Errorf("per-claim spec files %v after unprepare, want none", files)
	}
}

// A restart removes the per-claim specs of claims no longer in the
// checkpoint (unprepared while the driver was down) and writes again those
// of shared claims still prepared.
func TestRestartCleansOrphanedClaimSpecs(t *testing.T) {
	stateDir, specDir := t.TempDir(), t.TempDir()
	h := &fakeHealth{states: []health.State{{UUID: "GPU-aaa", Healthy: true}, {UUID: "GPU-bbb", Healthy: true}}}
	st, err := checkpoint.Open(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := driver.New("node-a", node, node.Devices, cdiName, h, st, driver.WithClaimSpecs(claimspec.New(specDir, "nvidia.com")))
	if err != nil {
		t.Fatal(err)
	}
	kept := withConfig(claim("uid-kept", "kept", result("node-a", "gpu-0")), resourceapi.AllocationConfigSourceClaim, contract.DRADriver, timeSlicing)
	if res := prepare(t, d, kept); res.Err != nil {
		t.Fatal(res.Err)
	}
	st.Close()
	orphan := filepath.Join(specDir, "nvidia.com-claim_uid-gone.json")
	if err := os.WriteFile(orphan, []byte(`{"cdiVersion":"0.6.0","kind":"nvidia.com/claim","devices":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	keptFile := filepath.Join(specDir, "nvidia.com-claim_uid-kept.json")
	if err := os.Remove(keptFile); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(specDir, "nvidia.com-gpu.yaml")
	if err := os.WriteFile(other, []byte("node spec"), 0o600); err != nil {
		t.Fatal(err)
	}

	newSharingDriver(t, stateDir, specDir)
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("orphaned per-claim spec still there (%v)", err)
	}
	if _, err := os.Stat(keptFile); err != nil {
		t.Errorf("the prepared shared claim's spec is not written again: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("the node's own spec was touched: %v", err)
	}
}

// MPS on a driver that runs no MPS daemons is refused with what to use
// instead; a bad config is refused naming the claim and the field; no file
// is left.
func TestPrepareRefusesMPSAndBadConfig(t *testing.T) {
	specDir := t.TempDir()
	d := newSharingDriver(t, t.TempDir(), specDir)
	for _, tc := range []struct {
		name   string
		params string
		want   []string
	}{
		{"MPS without daemons", mps, []string{"ResourceClaim default/c", "runs no MPS daemons; use strategy TimeSlicing"}},
		{"MPS out of range", strings.Replace(mps, "50", "0", 1), []string{"ResourceClaim default/c", "defaultActiveThreadPercentage 0"}},
		{"interval", strings.Replace(timeSlicing, "Default", "Short", 1), []string{"ResourceClaim default/c", "does not set the compute time-slice yet"}},
		{"unknown field", strings.Replace(timeSlicing, `"strategy"`, `"replicas":2,"strategy"`, 1), []string{"unknown field", "replicas"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := withConfig(claim("uid-"+strings.ReplaceAll(tc.name, " ", "-"), "c", result("node-a", "gpu-1")), resourceapi.AllocationConfigSourceClaim, contract.DRADriver, tc.params)
			res := prepare(t, d, c)
			if res.Err == nil {
				t.Fatalf("prepared %+v; want refused", res)
			}
			for _, w := range tc.want {
				if !strings.Contains(res.Err.Error(), w) {
					t.Errorf("error %q does not say %q", res.Err, w)
				}
			}
			if files := claimSpecFiles(t, specDir); len(files) != 0 {
				t.Errorf("per-claim spec files %v after a refusal", files)
			}
		})
	}
	// The GPU is still free: nothing was checkpointed.
	if res := prepare(t, d, claim("uid-next", "next", result("node-a", "gpu-1"))); res.Err != nil {
		t.Fatalf("GPU held after refusals: %v", res.Err)
	}
}

// A FromClaim config wins over the class's for the same request; another
// driver's config is ignored.
func TestPrepareConfigPrecedence(t *testing.T) {
	d := newSharingDriver(t, t.TempDir(), t.TempDir())
	c := claim("uid-p", "p", result("node-a", "gpu-1"))
	withConfig(c, resourceapi.AllocationConfigSourceClaim, contract.DRADriver, timeSlicing)
	withConfig(c, resourceapi.AllocationConfigSourceClass, contract.DRADriver, mps)
	withConfig(c, resourceapi.AllocationConfigSourceClaim, "gpu.nvidia.com", `{"kind":"not ours"}`)
	res := prepare(t, d, c)
	if res.Err != nil {
		t.Fatalf("the claim's TimeSlicing should win over the class's MPS: %v", res.Err)
	}
	if !slices.Contains(res.Devices[0].CDIDeviceIDs, "nvidia.com/claim=uid-p") {
		t.Errorf("CDI names %v lack the claim's device", res.Devices[0].CDIDeviceIDs)
	}
	// The class's MPS alone applies: refused.
	c2 := withConfig(claim("uid-q", "q", result("node-a", "gpu-0")), resourceapi.AllocationConfigSourceClass, contract.DRADriver, mps)
	if res := prepare(t, d, c2); res.Err == nil || !strings.Contains(res.Err.Error(), "shares by MPS, and this nvinject-dra runs no MPS daemons") {
		t.Errorf("class MPS: err = %v, want the MPS refusal", res.Err)
	}
}

// A checkpoint written before sharing existed (no sharing field) restores
// and answers as before.
func TestOldCheckpointRestoresUnshared(t *testing.T) {
	stateDir, specDir := t.TempDir(), t.TempDir()
	old := map[string]any{"version": 1, "claims": map[string]any{"uid-old": map[string]any{
		"uid": "uid-old", "namespace": "default", "name": "old",
		"devices": []any{map[string]any{"requests": []string{"gpu"}, "pool": "node-a", "device": "gpu-1", "uuid": "GPU-bbb", "cdiDeviceIDs": []string{"nvidia.com/gpu=GPU-bbb"}}},
	}}}
	data, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, checkpoint.FileName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	d := newSharingDriver(t, stateDir, specDir)
	res := prepare(t, d, claim("uid-old", "old", result("node-a", "gpu-1")))
	if res.Err != nil || !reflect.DeepEqual(res.Devices[0].CDIDeviceIDs, []string{"nvidia.com/gpu=GPU-bbb"}) {
		t.Fatalf("old checkpoint's claim answered %+v", res)
	}
	if files := claimSpecFiles(t, specDir); len(files) != 0 {
		t.Errorf("per-claim spec files %v for an old, unshared claim", files)
	}
}

// fakeMPS records the daemons the driver wants; fail refuses them.
type fakeMPS struct {
	synced [][]gpumps.Daemon
	fail   error
}

func (f *fakeMPS) Sync(ds []gpumps.Daemon) error {
	if f.fail != nil && len(ds) > 0 {
		return f.fail
	}
	f.synced = append(f.synced, ds)
	return nil
}

// Wait finds the daemon ready once it is wanted: the manager's own wait is
// gpunode/mps's test.
func (f *fakeMPS) Wait(_ context.Context, id string) error {
	if len(f.synced) > 0 && slices.ContainsFunc(f.last(), func(d gpumps.Daemon) bool { return d.ID == id }) {
		return nil
	}
	return errors.New("daemon " + id + " not wanted")
}

func (f *fakeMPS) Client(id string) (string, string) {
	return "/run/mps/" + id + "/pipe", "/run/mps/shm"
}

func (f *fakeMPS) last() []gpumps.Daemon { return f.synced[len(f.synced)-1] }

// A claim shared by MPS gets one daemon over its GPU with the GpuConfig's
// limits before the answer leaves; its own CDI device makes its containers
// clients (pipe dir, /dev/shm, limits); unprepare stops the daemon; a
// restarted driver runs the checkpointed claim's daemon again; a daemon
// that cannot run refuses the claim and leaves no file.
func TestPrepareMPSClaimRunsItsDaemon(t *testing.T) {
	stateDir, specDir := t.TempDir(), t.TempDir()
	open := func(m *fakeMPS) *driver.Driver { return newSharingDriver(t, stateDir, specDir, driver.WithMPS(m)) }
	m := &fakeMPS{}
	d := open(m)
	want := gpumps.Daemon{ID: "uid-mps", Visible: "GPU-bbb", ActiveThreadPercentage: 50, PinnedMemoryMiB: 10240}
	c := withConfig(claim("uid-mps", "c", result("node-a", "gpu-1")), resourceapi.AllocationConfigSourceClaim, contract.DRADriver, mps)
	if res := prepare(t, d, c); res.Err != nil {
		t.Fatal(res.Err)
	}
	if got := m.last(); !reflect.DeepEqual(got, []gpumps.Daemon{want}) {
		t.Errorf("daemons %+v, want %+v", got, want)
	}
	data, err := os.ReadFile(filepath.Join(specDir, "nvidia.com-claim_uid-mps.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"CUDA_MPS_PIPE_DIRECTORY=/run/mps/uid-mps/pipe", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M", `"containerPath":"/dev/shm"`, contract.EnvSharedClaim + "=uid-mps"} {
		if !strings.Contains(string(data), w) {
			t.Errorf("claim spec lacks %s:\n%s", w, data)
		}
	}

	m2 := &fakeMPS{}
	open(m2)
	if len(m2.synced) == 0 || !reflect.DeepEqual(m2.last(), []gpumps.Daemon{want}) {
		t.Errorf("restarted driver's daemons %+v, want the checkpointed %+v", m2.synced, want)
	}

	if _, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: c.UID}}); err != nil {
		t.Fatal(err)
	}
	if got := m.last(); len(got) != 0 {
		t.Errorf("daemons after unprepare %+v, want none", got)
	}

	bad := &fakeMPS{fail: os.ErrNotExist}
	d3 := open(bad)
	c2 := withConfig(claim("uid-mps-2", "c2", result("node-a", "gpu-1")), resourceapi.AllocationConfigSourceClaim, contract.DRADriver, mps)
	if res := prepare(t, d3, c2); res.Err == nil || !strings.Contains(res.Err.Error(), "ResourceClaim default/c2") {
		t.Errorf("prepare with a daemon that cannot run: %+v", res)
	}
	if files := claimSpecFiles(t, specDir); len(files) != 0 {
		t.Errorf("per-claim spec files %v after a refusal", files)
	}
}
