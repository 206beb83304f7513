package check

import (
	"testing"

	"github.com/nvinject/nvinject/doctor/evidence"
)

const pipeDir = "/run/nvinject/mps/gpu-0/pipe"

// sharedBy shares the chain's GPU with replicas and gives it to pods
// (name → kubelet's device IDs).
func sharedBy(replicas int, pods map[string][]string) func(*evidence.Evidence) {
	return func(e *evidence.Evidence) {
		e.CDI.GPUDevices = []evidence.CDIDevice{{UUID: uuid, Names: []string{"0", uuid}, Replicas: replicas}}
		e.PodResources = evidence.PodResourcesEvidence{Socket: "/var/lib/kubelet/pod-resources/kubelet.sock"}
		for name, ids := range pods {
			e.PodResources.Containers = append(e.PodResources.Containers, evidence.ContainerDevices{
				PodRef: evidence.PodRef{Namespace: "default", Name: name, Container: "c"}, Resource: "nvidia.com/gpu", IDs: ids})
		}
	}
}

// withMPS shares the chain's GPU through MPS, its daemon as m says.
func withMPS(m evidence.MPSDaemon) func(*evidence.Evidence) {
	return func(e *evidence.Evidence) {
		m.PipeDir = pipeDir
		e.CDI.GPUDevices = []evidence.CDIDevice{{UUID: uuid, Names: []string{uuid}, Replicas: 2, MPS: &m}}
	}
}

var sharingCases = []verdictCase{
	{"shared GPU within its replicas", LayerAllocate, sharedBy(2, map[string][]string{"a": {uuid + "::0"}, "b": {uuid + "::1"}}), OK, "no pod on", ""},
	{"shared GPU over its replicas", LayerAllocate, sharedBy(2, map[string][]string{"a": {uuid + "::0"}, "b": {uuid + "::1"}, "c": {"0::3"}}),
		Broken, "shared GPU " + uuid + " (nvinject.io/shared-replicas 2) is held by 3 pods at once: default/a, default/b, default/c",
		"the sharing config's replicas were lowered under running pods"},
	{"two replicas in one pod are one holder", LayerAllocate, sharedBy(2, map[string][]string{"a": {uuid + "::0", uuid + "::2"}, "b": {uuid + "::1"}}), OK, "no pod on", ""},
	{"exclusive GPU held by two pods", LayerAllocate, sharedBy(0, map[string][]string{"a": {uuid}, "b": {"0"}}),
		Broken, "GPU " + uuid + " is not shared (no nvinject.io/shared-replicas) but 2 pods hold it at once: default/a, default/b", "delete all but one of them"},
	{"another vendor's device IDs are not GPUs", LayerAllocate, func(e *evidence.Evidence) {
		sharedBy(0, map[string][]string{"a": {uuid}})(e)
		e.PodResources.Containers = append(e.PodResources.Containers, evidence.ContainerDevices{PodRef: pod("default", "nic"), Resource: "example.com/nic", IDs: []string{"0"}})
	}, OK, "no pod on", ""},
	{"holders unread, nothing shared", LayerAllocate, func(e *evidence.Evidence) { e.PodResources.Unread = "permission denied" }, OK, "who holds which GPU not read", ""},
	{"holders unread, a GPU shared", LayerAllocate, func(e *evidence.Evidence) {
		sharedBy(4, nil)(e)
		e.PodResources.Unread = "permission denied"
	}, Unknown, "could not read kubelet's PodResources (who holds the shared GPUs): permission denied", "--pod-resources-socket"},
	{"MPS daemon up", LayerAllocate, withMPS(evidence.MPSDaemon{}), OK, "MPS control daemon of " + uuid + " up (" + pipeDir + "/control)", ""},
	{"MPS daemon down", LayerAllocate, withMPS(evidence.MPSDaemon{Down: "dial unix " + pipeDir + "/control: connect: connection refused"}),
		Broken, "the MPS control daemon of GPU " + uuid + " is down: its control socket " + pipeDir + "/control takes no connection (dial unix " + pipeDir + "/control: connect: connection refused)",
		"nvinject-device-plugin runs an MPS control daemon per shared GPU and restarts it when it exits"},
	{"MPS daemon down without the API", LayerAllocate, func(e *evidence.Evidence) {
		withMPS(evidence.MPSDaemon{Down: "no such file or directory"})(e)
		e.Allocate = evidence.AllocateEvidence{Unread: unread}
	}, Broken, "is down", "MPS control daemon per shared GPU"},
	{"MPS socket unreadable", LayerAllocate, withMPS(evidence.MPSDaemon{Unread: "permission denied"}), Unknown, "could not read the MPS control daemon of " + uuid, "as root"},
}

func TestSharingRows(t *testing.T) { runCases(t, healthy, sharingCases) }
