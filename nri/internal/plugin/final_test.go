package plugin

import (
	"fmt"
	"slices"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/verify"
)

func dev(path string, major, minor int64) *api.LinuxDevice {
	return &api.LinuxDevice{Path: path, Type: "c", Major: major, Minor: minor}
}

func rule(typ string, major, minor *int64, access string) *api.LinuxDeviceCgroup {
	r := &api.LinuxDeviceCgroup{Allow: true, Type: typ, Access: access}
	if major != nil {
		r.Major = api.Int64(*major)
	}
	if minor != nil {
		r.Minor = api.Int64(*minor)
	}
	return r
}

func i64(v int64) *int64 { return &v }

// TestFinal: the container as it will run, as the runtime applies an
// adjustment, and every way it reaches a GPU.
func TestFinal(t *testing.T) {
	ctr := &api.Container{
		Env:    []string{"PATH=/bin", "NVINJECT_GPU_UUID_0=GPU-a", "A=1"},
		Mounts: []*api.Mount{{Source: "/proc", Destination: "/proc"}},
		Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{dev("/dev/nvidia0", 195, 0), dev("/dev/null", 1, 3)},
			Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}}},
	}
	adj := &api.ContainerAdjustment{}
	adj.AddDevice(dev("/dev/nvidia0", 195, 4)) // replaces the container's node at that path
	adj.AddDevice(dev("/dev/nvidiactl", 195, 255))
	adj.AddEnv("NVINJECT_GPU_UUID_0", "GPU-b")
	adj.AddEnv("B", "2")
	adj.AddMount(&api.Mount{Source: "/dev/nvidia3", Destination: "/dev/nvidia3", Type: "bind"})
	adj.Linux.Resources = &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{rule("c", i64(195), i64(2), "rw")}}

	for _, tc := range []struct {
		name               string
		ctr                *api.Container
		adj                *api.ContainerAdjustment
		nodes, access, env []string
		mounts, cgroup     int
		wildcard           bool
	}{
		{name: "no adjustment", ctr: ctr,
			nodes: []string{"/dev/nvidia0 195:0", "/dev/null 1:3"}, access: []string{"/dev/nvidia0 195:0", "/dev/null 1:3"},
			env: ctr.Env, mounts: 1, cgroup: 1},
		{name: "adjusted: a device or variable replaces the container's, mounts and rules add up", ctr: ctr, adj: adj,
			nodes:  []string{"/dev/nvidia0 195:4", "/dev/null 1:3", "/dev/nvidiactl 195:255"},
			access: []string{"/dev/nvidia0 195:4", "/dev/null 1:3", "/dev/nvidiactl 195:255", "bind mount of /dev/nvidia3 195:3", "device cgroup rule 195:2 195:2"},
			env:    []string{"PATH=/bin", "NVINJECT_GPU_UUID_0=GPU-b", "A=1", "B=2"}, mounts: 2, cgroup: 2},
		{name: "the adjustment alone", adj: adj,
			nodes:  []string{"/dev/nvidia0 195:4", "/dev/nvidiactl 195:255"},
			access: []string{"/dev/nvidia0 195:4", "/dev/nvidiactl 195:255", "bind mount of /dev/nvidia3 195:3", "device cgroup rule 195:2 195:2"},
			env:    []string{"NVINJECT_GPU_UUID_0=GPU-b", "B=2"}, mounts: 1, cgroup: 1},
		{name: "rules that reach no one GPU", adj: &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{
			rule("c", i64(195), i64(1), "m"), rule("b", i64(195), i64(1), "rw"), {Allow: false, Type: "c", Major: api.Int64(195), Minor: api.Int64(1), Access: "rw"},
			rule("b", nil, nil, "rwm"), rule("c", i64(10), i64(200), "rw")}}}},
			access: []string{"device cgroup rule 10:200 10:200"}, env: []string{}, cgroup: 5},
		{name: "a rule for every GPU", adj: &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{
			rule("c", i64(195), nil, "rw")}}}}, env: []string{}, cgroup: 1, wildcard: true},
		{name: "a rule for every device", adj: &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{
			rule("a", nil, nil, "rwm")}}}}, env: []string{}, cgroup: 1, wildcard: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := finalOf(tc.ctr, tc.adj)
			if got := names(f.nodes()); !slices.Equal(got, tc.nodes) {
				t.Errorf("nodes %v, want %v", got, tc.nodes)
			}
			if got := names(f.access()); !slices.Equal(got, tc.access) {
				t.Errorf("access %v, want %v", got, tc.access)
			}
			if !slices.Equal(f.env, tc.env) {
				t.Errorf("env %v, want %v", f.env, tc.env)
			}
			if len(f.mounts) != tc.mounts || len(f.cgroup) != tc.cgroup {
				t.Errorf("%d mounts and %d rules, want %d and %d", len(f.mounts), len(f.cgroup), tc.mounts, tc.cgroup)
			}
			if err := f.wildcard("ctr"); (err != nil) != tc.wildcard || (err != nil && reasonOf(err) != string(verify.ReasonForeignGPU)) {
				t.Errorf("wildcard: %v, want refused %v", err, tc.wildcard)
			}
		})
	}
}

func names(nodes []verify.Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, fmt.Sprintf("%s %d:%d", n.Path, n.Major, n.Minor))
	}
	return out
}
