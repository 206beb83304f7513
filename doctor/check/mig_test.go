package check

import (
	"testing"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

const (
	migGPU = "GPU-4f1c7a52-9b7e-4c1d-8a3e-000000000002"
	mig1   = "MIG-11111111-1111-1111-1111-111111111111"
	mig2   = "MIG-22222222-2222-2222-2222-222222222222"
	res1g  = "nvidia.com/mig-1g.10gb"
)

// withMIG adds GPU 1, MIG mode on and split into two 1g.10gb devices, to a
// device-plugin chain under MIG_STRATEGY=mixed: published in the CDI spec
// and as nvidia.com/mig-1g.10gb: 2.
func withMIG(e *evidence.Evidence) {
	e.SMI.GPUs = append(e.SMI.GPUs, evidence.GPU{Index: "1", UUID: migGPU, Name: "NVIDIA A100-SXM4-80GB", MIGMode: "Enabled", MIGPending: "Enabled"})
	e.SMI.MIGDevices = []evidence.MIGDevice{{Parent: migGPU, Profile: "1g.10gb", UUID: mig1}, {Parent: migGPU, Profile: "1g.10gb", UUID: mig2}}
	e.Selected = evidence.SelectedEvidence{Source: "ConfigMap", All: true}
	e.CDI.GPUDevices = []evidence.CDIDevice{{UUID: uuid, Names: []string{uuid}},
		{UUID: mig1, Names: []string{mig1}, Parent: migGPU, Profile: "1g.10gb"}, {UUID: mig2, Names: []string{mig2}, Parent: migGPU, Profile: "1g.10gb"}}
	e.PluginPod = running(contract.DevicePluginApp)
	e.PluginPod.MIGStrategy = migMixed
	e.NodeStatus.MIGCapacity = map[string]int64{res1g: 2}
}

// mig is withMIG, then change.
func mig(change func(*evidence.Evidence)) func(*evidence.Evidence) {
	return func(e *evidence.Evidence) {
		withMIG(e)
		if change != nil {
			change(e)
		}
	}
}

// singleMIG is GPU 1 alone under MIG_STRATEGY=single, its two MIG
// devices published as nvidia.com/gpu: capacity.
func singleMIG(capacity int64) func(*evidence.Evidence) {
	return mig(func(e *evidence.Evidence) {
		e.SMI.GPUs = e.SMI.GPUs[1:]
		e.CDI.GPUDevices = e.CDI.GPUDevices[1:]
		e.PluginPod.MIGStrategy = migSingle
		e.NodeStatus.MIGCapacity = nil
		e.NodeStatus.Capacity, e.NodeStatus.Allocatable = capacity, capacity
	})
}

var migCases = []verdictCase{
	{"MIG layout published", LayerRegistration, mig(nil), OK, "nvidia-smi -L: 2 MIG device(s) live", ""},
	{"MIG device live, not in the CDI spec", LayerRegistration, mig(func(e *evidence.Evidence) { e.CDI.GPUDevices = e.CDI.GPUDevices[:2] }),
		Broken, "MIG device(s) live in the driver (nvidia-smi -L) but not in the node's CDI spec: " + mig2 + " (1g.10gb on " + migGPU + ")",
		"nvinject republishes a changed MIG layout within --mig-rescan-interval (default 10s): run the doctor again; if it persists, read single-gpu-device-plugin's log (kubectl -n nvidia-device-plugin logs ds/single-gpu-device-plugin --tail=100) and restart its pod (kubectl -n nvidia-device-plugin delete pod single-gpu-device-plugin-x1)"},
	{"MIG device published, gone from the driver", LayerRegistration, mig(func(e *evidence.Evidence) { e.SMI.MIGDevices = e.SMI.MIGDevices[:1] }),
		Broken, "MIG device(s) in the node's CDI spec but gone from the driver (not in nvidia-smi -L): " + mig2, "--mig-rescan-interval"},
	{"MIG capacity stale under mixed", LayerRegistration, mig(func(e *evidence.Evidence) { e.NodeStatus.MIGCapacity[res1g] = 1 }),
		Broken, "Node k8s-ai-infra-worker capacity nvidia.com/mig-1g.10gb=1 but the driver has 2 to publish under MIG_STRATEGY=mixed", "--mig-rescan-interval"},
	{"MIG profile published but no device has it", LayerRegistration, mig(func(e *evidence.Evidence) { e.NodeStatus.MIGCapacity["nvidia.com/mig-3g.40gb"] = 1 }),
		Broken, "capacity nvidia.com/mig-3g.40gb=1 but the driver has 0", "--mig-rescan-interval"},
	{"shared MIG devices publish their replicas", LayerRegistration, mig(func(e *evidence.Evidence) {
		e.CDI.GPUDevices[1].Replicas, e.CDI.GPUDevices[2].Replicas = 2, 2
		e.NodeStatus.MIGCapacity = map[string]int64{res1g + ".shared": 4}
	}), OK, "2 MIG device(s) live", ""},
	{"MIG layout under single", LayerRegistration, singleMIG(2), OK, "2 MIG device(s) live", ""},
	{"MIG capacity stale under single", LayerRegistration, singleMIG(3),
		Broken, "capacity nvidia.com/gpu=3 but the driver has 2 MIG device(s) to publish under MIG_STRATEGY=single", "--mig-rescan-interval"},
	{"MIG GPU under MIG_STRATEGY=none", LayerRegistration, mig(func(e *evidence.Evidence) { e.PluginPod.MIGStrategy = migNone }),
		Broken, "GPU 1 (" + migGPU + ") has MIG mode on but single-gpu-device-plugin runs MIG_STRATEGY=none",
		"set MIG_STRATEGY=single or mixed on single-gpu-device-plugin (env MIG_STRATEGY in its DaemonSet, deploy/base/device-plugin-daemonset.yaml; Helm value migStrategy)"},
	{"unselected MIG GPU under MIG_STRATEGY=none", LayerRegistration, mig(func(e *evidence.Evidence) {
		e.PluginPod.MIGStrategy = migNone
		e.Selected = evidence.SelectedEvidence{Source: "ConfigMap", UUIDs: []string{uuid}}
	}), OK, "capacity nvidia.com/gpu=1", ""},
	{"unselected MIG GPU is not expected published", LayerRegistration, mig(func(e *evidence.Evidence) {
		e.Selected = evidence.SelectedEvidence{Source: "ConfigMap", UUIDs: []string{uuid}}
		e.CDI.GPUDevices = e.CDI.GPUDevices[:1]
		e.NodeStatus.MIGCapacity = nil
	}), OK, "2 MIG device(s) live", ""},
	{"nvidia-smi -L fails", LayerRegistration, mig(func(e *evidence.Evidence) {
		e.SMI.MIGDevices, e.SMI.MIGUnread = nil, "nvidia-smi -L failed (exit status 9)"
	}),
		Unknown, "could not read the MIG devices (nvidia-smi -L): nvidia-smi -L failed", ""},
}

func TestMIGRows(t *testing.T) { runCases(t, healthy, migCases) }

// withDRAMIG is withMIG on a DRA node: the MIG devices are in
// nvinject-dra's ResourceSlice.
func withDRAMIG(e *evidence.Evidence) {
	plugin := e.PluginPod
	withMIG(e)
	e.PluginPod, e.NodeStatus.MIGCapacity = plugin, nil
	e.DRAPod.MIGStrategy = migMixed
	for i, m := range []string{mig1, mig2} {
		e.DRA.Slices.Devices = append(e.DRA.Slices.Devices, evidence.SliceDevice{Pool: draNode, Name: contract.DRAMIGDeviceName(1, "1g.10gb", 3+i, 0), UUID: m, Type: contract.DRATypeMIG, Profile: "1g.10gb"})
	}
}

var draMIGCases = []verdictCase{
	{"DRA: MIG layout published", LayerRegistration, withDRAMIG, OK, "2 MIG device(s) live", ""},
	{"DRA: MIG device live, in no ResourceSlice", LayerRegistration, func(e *evidence.Evidence) {
		withDRAMIG(e)
		e.DRA.Slices.Devices = e.DRA.Slices.Devices[:2]
	}, Broken, "live in the driver (nvidia-smi -L) but in no ResourceSlice of gpu.nvinject.io: " + mig2, "read nvinject-dra's log (kubectl -n nvidia-device-plugin logs ds/nvinject-dra --tail=100) and restart its pod (kubectl -n nvidia-device-plugin delete pod nvinject-dra-x1)"},
	{"DRA: MIG device in a ResourceSlice, gone from the driver", LayerRegistration, func(e *evidence.Evidence) {
		withDRAMIG(e)
		e.SMI.MIGDevices = e.SMI.MIGDevices[:1]
		e.CDI.GPUDevices = e.CDI.GPUDevices[:2]
	}, Broken, "in a ResourceSlice of gpu.nvinject.io but gone from the driver (not in nvidia-smi -L): " + mig2 + " (nvinject-sim-worker/gpu-1-mig-1g10gb-gi4-ci0)", "--mig-rescan-interval"},
	{"DRA: MIG GPU under MIG_STRATEGY=none", LayerRegistration, func(e *evidence.Evidence) {
		withDRAMIG(e)
		e.DRAPod.MIGStrategy = migNone
	}, Broken, "runs MIG_STRATEGY=none", "deploy/components/dra/dra-daemonset.yaml"},
}

func TestDRAMIGRows(t *testing.T) { runCases(t, healthyDRA, draMIGCases) }
