package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/shared/contract"
)

// draDriver is -mode dra: the node is labeled for nvinject-dra, which
// publishes the GPU as a ResourceSlice device; the example's nvidia.com/gpu limit
// reaches it through the DeviceClass's extendedResourceName (KEP-5004), and
// kubelet gets the CDI name from NodePrepareResources.
type draDriver struct{}

func (draDriver) published(ctx context.Context, e evidence) error {
	node := e.d.Node().Name()
	e.sh.section("the node's owner: label " + contract.DRAModeLabel + " and nvinject's DaemonSets")
	if err := e.runAll(ctx, e.kubectl("get", "node", node, "-L", contract.DRAModeLabel),
		e.kubectl("get", "daemonsets", "-n", rig.Namespace, "-o", "wide")); err != nil {
		return err
	}
	e.sh.note("the device plugin runs on nodes not labeled %s=%s, nvinject-dra on those labeled: one owner of %s per node",
		contract.DRAModeLabel, contract.DRAModeDRA, contract.ResourceName)

	e.sh.section("DeviceClass " + contract.DRADriver + " (KEP-5004: extendedResourceName maps the example's " + contract.ResourceName + " limit to it)")
	if err := e.runAll(ctx, e.kubectl("get", "deviceclass", contract.DRADriver, "-o",
		`jsonpath={"extendedResourceName: "}{.spec.extendedResourceName}{"\nselector: "}{.spec.selectors[0].cel.expression}{"\n"}`)); err != nil {
		return err
	}

	e.sh.section("nvinject-dra's ResourceSlice and its kubelet registration")
	sel := "spec.nodeName=" + node + ",spec.driver=" + contract.DRADriver
	root := e.d.Node().KubeletRootDir()
	if err := e.runAll(ctx, e.kubectl("get", "resourceslices", "--field-selector", sel),
		e.kubectl("get", "resourceslices", "--field-selector", sel, "-o",
			`jsonpath={range .items[*].spec.devices[*]}{.name}{":"}`+attr(contract.DRAAttrUUID)+attr(contract.DRAAttrProductName)+
				`{" `+contract.DRACapacityMemory+`="}{.capacity.`+contract.DRACapacityMemory+`.value}{" taints="}{.taints}{"\n"}{end}`),
		[]string{"ls", "-l", filepath.Join(root, "plugins_registry"), filepath.Join(root, "plugins", contract.DRADriver)}); err != nil {
		return err
	}
	s, err := e.d.ResourceSlice(ctx)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(s.Spec.Devices, func(d resourceapi.Device) bool { return len(d.Taints) > 0 }) {
		return fmt.Errorf("ResourceSlice %s has a tainted device: the GPU is Unhealthy, see nvinject-dra's log", s.Name)
	}
	e.sh.note("no device taint: the GPU is healthy (an Xid or a lost GPU adds %s=<reason>:NoSchedule)", contract.DRATaintKey)
	return nil
}

// attr is a jsonpath printing the string attribute name of a device as name=value.
func attr(name string) string { return `{" ` + name + `="}{.attributes.` + name + `.string}` }

func (draDriver) capacity(c, a int64) string {
	why := fmt.Sprintf("allocatable %d: nvinject-dra offers the GPU as a ResourceSlice device, not as a node resource; the scheduler satisfies %s through DeviceClass %s only on nodes whose allocatable %s is 0",
		a, contract.ResourceName, contract.DRADriver, contract.ResourceName)
	if c == 0 {
		return why + "; capacity 0: nvinject-dra's empty device-plugin endpoint for " + contract.ResourceName + " replaced the device plugin's (dra/README.md)"
	}
	return why + fmt.Sprintf("; capacity %d is the stopped device plugin's, which kubelet keeps for its endpoint grace period (5 min) unless another endpoint registers the resource", c)
}

func (draDriver) allocated(ctx context.Context, e evidence) (string, string, error) {
	e.sh.section("the pod's ResourceClaim (made by the scheduler for the " + contract.ResourceName + " limit, KEP-5004)")
	if err := e.runAll(ctx, e.kubectl("get", "pod", e.pod.Name, "-n", e.pod.Namespace, "-o", `jsonpath={.status.extendedResourceClaimStatus}{"\n"}`)); err != nil {
		return "", "", err
	}
	claim, err := e.d.ClaimOf(ctx, e.pod)
	if err != nil {
		return "", "", err
	}
	if err := e.runAll(ctx, e.kubectl("get", "resourceclaim", claim.Name, "-n", claim.Namespace, "-o",
		`jsonpath={range .status.allocation.devices.results[*]}{"allocated: request="}{.request}{" driver="}{.driver}{" pool="}{.pool}{" device="}{.device}{"\n"}{end}{"reservedFor:"}{range .status.reservedFor[*]}{" "}{.resource}{"/"}{.name}{end}{"\n"}`)); err != nil {
		return "", "", err
	}
	uuid, err := e.allocatedUUID(ctx, claim)
	if err != nil {
		return "", "", err
	}
	r := claim.Status.Allocation.Devices.Results[0]
	e.sh.note("device %s of pool %s is, in nvinject-dra's ResourceSlice, the GPU with %s %s", r.Device, r.Pool, contract.DRAAttrUUID, uuid)
	if !e.dep.All && uuid != e.dep.UUID {
		return "", "", fmt.Errorf("ResourceClaim %s/%s got GPU %s, not the selected %s: check nvinject-dra's selection (ConfigMap %s)", claim.Namespace, claim.Name, uuid, e.dep.UUID, contract.ConfigMapName)
	}

	e.sh.section("nvinject-dra prepared the claim: the CDI name kubelet got from NodePrepareResources")
	if err := e.runAll(ctx, e.kubectl("logs", "-n", rig.Namespace, "daemonset/"+rig.DRADaemonSet)); err != nil {
		return "", "", err
	}
	return uuid, "ResourceClaim " + claim.Name + "'s GPU", nil
}

func (draDriver) checked() string {
	return "kubelet's record of the claim (PodResources dynamic_resources)"
}
