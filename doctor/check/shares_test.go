package check

import (
	"testing"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

// withShares puts GPU 0 in shares (nvinject-dra --gpu-shares): two claims
// of 40Gi and 30Gi on its share device, and a monitor with admin access.
func withShares(e *evidence.Evidence) {
	e.DRA.Slices.Devices = append(e.DRA.Slices.Devices, evidence.SliceDevice{Pool: draNode, Name: "gpu-0-share", UUID: uuid, Memory: "80Gi", Type: contract.DRATypeShare})
	share := func(name, id string, consumed ...string) evidence.Claim {
		return evidence.Claim{Namespace: "default", Name: name, Allocated: true, ReservedFor: []string{"default/" + name},
			Devices: []evidence.ClaimDevice{{Request: "share", Driver: contract.DRADriver, Pool: draNode, Device: "gpu-0-share", ShareID: id, Consumed: consumed}}}
	}
	mon := share("monitor", "s-m", "computePercent=1", "memory=256Mi")
	mon.Devices[0].AdminAccess = true
	e.DRA.Claims.Claims = []evidence.Claim{share("share-a", "s-a", "computePercent=50", "memory=40Gi"), share("share-b", "s-b", "computePercent=10", "memory=30Gi"), mon}
}

var shareCases = []verdictCase{
	{"DRA: a GPU in shares, per claim", LayerAllocate, withShares, OK,
		"GPU " + uuid + " in shares (" + draNode + "/gpu-0-share, memory 80Gi): 2 share(s): default/share-a computePercent=50, memory=40Gi, default/share-b computePercent=10, memory=30Gi", ""},
	{"DRA: a share's claim names its share", LayerAllocate, withShares, OK,
		"request share → gpu.nvinject.io/" + draNode + "/gpu-0-share " + uuid + " share s-a computePercent=50, memory=40Gi", ""},
	{"DRA: the monitor's admin access", LayerAllocate, withShares, OK, "share s-m computePercent=1, memory=256Mi with admin access", ""},
}

func TestDRAShareRows(t *testing.T) { runCases(t, healthyDRA, shareCases) }
