package plugin

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// final is a container as it will run: the container after an adjustment,
// applied the way the runtime applies it. The early check in
// CreateContainer, the check of the final container and Synchronize's
// check of running containers all read it.
type final struct {
	devices []*api.LinuxDevice
	mounts  []*api.Mount
	cgroup  []*api.LinuxDeviceCgroup
	env     []string
}

// finalOf applies adj to ctr: an adjusted device or variable replaces the
// container's of the same path or name; mounts and device cgroup rules add
// up. Either may be nil: no adjustment, or the adjustment alone.
func finalOf(ctr *api.Container, adj *api.ContainerAdjustment) final {
	byPath := map[string]*api.LinuxDevice{}
	var order []string
	for _, d := range slices.Concat(ctr.GetLinux().GetDevices(), adj.GetLinux().GetDevices()) {
		if _, ok := byPath[d.GetPath()]; !ok {
			order = append(order, d.GetPath())
		}
		byPath[d.GetPath()] = d
	}
	f := final{
		devices: make([]*api.LinuxDevice, 0, len(order)),
		mounts:  slices.Concat(ctr.GetMounts(), adj.GetMounts()),
		cgroup:  slices.Concat(ctr.GetLinux().GetResources().GetDevices(), adj.GetLinux().GetResources().GetDevices()),
		env:     finalEnv(ctr, adj),
	}
	for _, p := range order {
		f.devices = append(f.devices, byPath[p])
	}
	return f
}

func finalEnv(ctr *api.Container, adj *api.ContainerAdjustment) []string {
	env := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := env[k]; !ok {
			order = append(order, k)
		}
		env[k] = v
	}
	for _, kv := range ctr.GetEnv() {
		k, v, _ := strings.Cut(kv, "=")
		set(k, v)
	}
	for _, kv := range adj.GetEnv() {
		set(kv.GetKey(), kv.GetValue())
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+env[k])
	}
	return out
}

// nodes are the device nodes alone: what nvinject itself hands out.
func (f final) nodes() []verify.Node {
	out := make([]verify.Node, 0, len(f.devices))
	for _, d := range f.devices {
		out = append(out, verify.Node{Path: d.GetPath(), Type: d.GetType(), Major: d.GetMajor(), Minor: d.GetMinor()})
	}
	return out
}

var (
	gpuNodePath  = regexp.MustCompile(`^/dev/nvidia([0-9]+)$`)
	capsNodePath = regexp.MustCompile(`^` + regexp.QuoteMeta(contract.CapsDir) + `/nvidia-cap([0-9]+)$`)
)

// access lists every way the container reaches a GPU or a MIG capability:
// device nodes, bind mounts of a host /dev/nvidiaN or
// /dev/nvidia-caps/nvidia-capN (its minor read from its name, as the
// driver names them), and device cgroup rules that grant read or write on
// one device (195:N, or a caps node's numbers).
func (f final) access() []verify.Node {
	out := f.nodes()
	for _, m := range f.mounts {
		src := m.GetSource()
		if g := gpuNodePath.FindStringSubmatch(src); g != nil {
			minor, err := strconv.ParseInt(g[1], 10, 64)
			if err == nil {
				out = append(out, verify.Node{Path: "bind mount of " + src, Type: "c", Major: gpu.NVIDIAMajor, Minor: minor})
			}
		}
		if c := capsNodePath.FindStringSubmatch(src); c != nil {
			if minor, err := strconv.ParseInt(c[1], 10, 64); err == nil {
				out = append(out, verify.Node{Path: "bind mount of " + src, Type: "c", Minor: minor})
			}
		}
	}
	for _, r := range f.cgroup {
		if grants(r) && r.GetMajor() != nil && r.GetMinor() != nil && r.GetType() != "b" {
			out = append(out, verify.Node{Path: fmt.Sprintf("device cgroup rule %d:%d", r.GetMajor().GetValue(), r.GetMinor().GetValue()),
				Type: "c", Major: r.GetMajor().GetValue(), Minor: r.GetMinor().GetValue()})
		}
	}
	return out
}

// wildcard refuses a device cgroup rule that grants read or write on every
// GPU at once (any major, or major 195 with any minor).
func (f final) wildcard(who string) error {
	for _, r := range f.cgroup {
		if !grants(r) || r.GetType() == "b" {
			continue
		}
		if r.GetMajor() == nil || (r.GetMajor().GetValue() == gpu.NVIDIAMajor && r.GetMinor() == nil) {
			return refuse(string(verify.ReasonForeignGPU), fmt.Errorf("%s: a device cgroup rule (type %q, access %q) grants every GPU; remove it or the privileged setting", who, r.GetType(), r.GetAccess()))
		}
	}
	return nil
}

// grants reports an allow rule giving read or write access.
func grants(r *api.LinuxDeviceCgroup) bool {
	return r.GetAllow() && strings.ContainsAny(r.GetAccess(), "rw")
}
