package podresources

import (
	"slices"

	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Claim is one DRA ResourceClaim kubelet prepared for a container, as
// PodResources reports it (dynamic_resources).
type Claim struct {
	Namespace, Name string
	// Devices are the claim's devices of the driver asked for.
	Devices []ClaimDevice
}

// String names the claim as users know it.
func (c Claim) String() string { return "ResourceClaim " + c.Namespace + "/" + c.Name }

// ClaimDevice is one prepared device and the CDI names its driver returned.
type ClaimDevice struct {
	Pool, Device string
	CDIDevices   []string
}

// CDIDevices returns every CDI name of the claim's devices, sorted.
func (c Claim) CDIDevices() []string {
	var out []string
	for _, d := range c.Devices {
		out = append(out, d.CDIDevices...)
	}
	slices.Sort(out)
	return out
}

// claims returns the container's claims with devices of driver, with only
// those devices.
func claims(cr *podresv1.ContainerResources, driver string) []Claim {
	var out []Claim
	for _, dr := range cr.GetDynamicResources() {
		cl := Claim{Namespace: dr.GetClaimNamespace(), Name: dr.GetClaimName()}
		for _, r := range dr.GetClaimResources() {
			if r.GetDriverName() != driver {
				continue
			}
			d := ClaimDevice{Pool: r.GetPoolName(), Device: r.GetDeviceName()}
			for _, n := range r.GetCdiDevices() {
				d.CDIDevices = append(d.CDIDevices, n.GetName())
			}
			cl.Devices = append(cl.Devices, d)
		}
		if len(cl.Devices) > 0 {
			out = append(out, cl)
		}
	}
	return out
}
