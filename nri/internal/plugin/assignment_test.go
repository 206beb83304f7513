package plugin

import (
	"testing"

	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/podresources"
)

// The record names each resource kubelet assigned by its own name: a MIG
// device is nvidia.com/mig-1g.10gb's, not nvidia.com/gpu's; another
// domain's resources are not the GPUs'.
func TestAssignmentByResource(t *testing.T) {
	h := &Handler{resource: contract.ResourceName}
	c := podresources.Container{
		Devices: []podresources.Devices{
			{Resource: "example.com/mig-1g.10gb", IDs: []string{"MIG-other"}},
			{Resource: "example.com/nic", IDs: []string{"n0"}},
			{Resource: "nvidia.com/gpu", IDs: []string{"GPU-a"}},
			{Resource: "nvidia.com/mig-1g.10gb", IDs: []string{"MIG-b", "MIG-c"}},
		},
		Claims: []podresources.Claim{
			{Namespace: "ml", Name: "gpu", Devices: []podresources.ClaimDevice{{Driver: contract.DRADriver, Pool: "node", Device: "gpu-1"}}},
			{Namespace: "ml", Name: "nic", Devices: []podresources.ClaimDevice{{Driver: "nic.example.com", Pool: "node", Device: "eth0"}}},
		},
	}
	want := "nvidia.com/gpu [GPU-a] and nvidia.com/mig-1g.10gb [MIG-b MIG-c] and DRA [ml/gpu:node/gpu-1]"
	if got := h.assignment(c).String(); got != want {
		t.Errorf("assignment = %q, want %q", got, want)
	}
	if got := h.ownIDs(c); len(got) != 3 || got[0] != "GPU-a" {
		t.Errorf("ownIDs = %v, want the GPU and the two MIG devices", got)
	}
}

// A pod naming GPUs in pod-level annotations is told how to ask for them:
// a MIG device by its own profile's resource.
func TestHowToRequest(t *testing.T) {
	h := &Handler{resource: contract.ResourceName}
	kind := contract.CDIKind(contract.CDIVendor, contract.CDIClass)
	if got := h.howToRequest([]string{kind + "=GPU-a"}); got != "nvidia.com/gpu" {
		t.Errorf("a GPU: %q", got)
	}
	if got := h.howToRequest([]string{kind + "=MIG-b"}); got != "nvidia.com/mig-<profile>" {
		t.Errorf("a MIG device the node does not know: %q", got)
	}
	h.inventory = &verify.Inventory{MIG: map[string]verify.Slice{"MIG-b": {Profile: "1g.10gb"}}}
	if got := h.howToRequest([]string{kind + "=MIG-b", kind + "=GPU-a", kind + "=GPU-c"}); got != "nvidia.com/mig-1g.10gb or nvidia.com/gpu" {
		t.Errorf("a MIG device and two GPUs: %q", got)
	}
}
