package convert

import (
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	rtgen "github.com/opencontainers/runtime-tools/generate"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

func base() *oci.Spec {
	return &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/bin"}}, Linux: &oci.Linux{}, Mounts: []oci.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}}}
}

func toContainer(s *oci.Spec) *api.Container {
	return &api.Container{Env: s.Process.Env, Mounts: api.FromOCIMounts(s.Mounts), Hooks: api.FromOCIHooks(s.Hooks),
		Linux: &api.LinuxContainer{Devices: api.FromOCILinuxDevices(s.Linux.Devices)}}
}

func apply(t *testing.T, s *oci.Spec, adj *api.ContainerAdjustment) {
	t.Helper()
	g := rtgen.NewFromSpec(s)
	if err := nrigen.SpecGenerator(&g).Adjust(adj); err != nil {
		t.Fatal(err)
	}
}

// roundTrip checks the conversion's contract for edits: applying the
// adjustment to a container that already has none, some or all of them
// (as containerd's CDI leaves it) ends with each edit exactly once, and a
// second conversion finds nothing left to add.
// A refused conversion is returned: refusing is always allowed, silently
// losing an edit is not.
func roundTrip(t *testing.T, e specs.ContainerEdits, preApplied bool) error {
	t.Helper()
	want := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if err := (&cdi.ContainerEdits{ContainerEdits: &e}).Apply(want); err != nil {
		t.Skip("edits CDI itself rejects:", err)
	}
	s := base()
	if preApplied {
		if err := (&cdi.ContainerEdits{ContainerEdits: &e}).Apply(s); err != nil {
			t.Fatal(err)
		}
	}
	adj, err := Adjustment(want, toContainer(s))
	if err != nil {
		return err
	}
	if preApplied && (len(adj.Env)+len(adj.Mounts)+len(adj.GetLinux().GetDevices()) > 0 || adj.Hooks != nil) {
		t.Fatalf("edits already applied, adjustment still adds %v", adj)
	}
	apply(t, s, adj)
	for _, kv := range want.Process.Env {
		if !slices.Contains(s.Process.Env, kv) {
			t.Fatalf("env %q missing from %v", kv, s.Process.Env)
		}
	}
	for _, d := range want.Linux.Devices {
		if n := count(s.Linux.Devices, func(x oci.LinuxDevice) bool { return x.Path == d.Path }); n != 1 {
			t.Fatalf("device %s present %d times", d.Path, n)
		}
	}
	for _, m := range want.Mounts {
		if n := count(s.Mounts, func(x oci.Mount) bool { return x.Destination == m.Destination }); n != 1 {
			t.Fatalf("mount %s present %d times", m.Destination, n)
		}
	}
	if want.Hooks != nil {
		for _, h := range want.Hooks.CreateContainer {
			if n := count(s.Hooks.CreateContainer, func(x oci.Hook) bool { return x.Path == h.Path && slices.Equal(x.Args, h.Args) }); n != 1 {
				t.Fatalf("hook %s present %d times", h.Path, n)
			}
		}
	}
	again, err := Adjustment(want, toContainer(s))
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Env)+len(again.Mounts)+len(again.GetLinux().GetDevices()) > 0 || again.Hooks != nil {
		t.Fatalf("second conversion is not empty: %v", again)
	}
	return nil
}

func count[T any](xs []T, f func(T) bool) int {
	n := 0
	for _, x := range xs {
		if f(x) {
			n++
		}
	}
	return n
}

func sample() specs.ContainerEdits {
	return specs.ContainerEdits{
		Env:         []string{"NVIDIA_VISIBLE_DEVICES=void", "NVINJECT_GPU_UUID_0=GPU-a"},
		DeviceNodes: []*specs.DeviceNode{{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0}, {Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255}},
		Mounts:      []*specs.Mount{{HostPath: "/usr/lib/libcuda.so.1", ContainerPath: "/usr/lib/libcuda.so.1", Options: []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}}},
		Hooks:       []*specs.Hook{{HookName: "createContainer", Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "update-ldcache"}}},
	}
}

func TestRoundTrip(t *testing.T) {
	for name, pre := range map[string]bool{"fresh container": false, "containerd applied it first": true} {
		t.Run(name, func(t *testing.T) {
			if err := roundTrip(t, sample(), pre); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestChangedEnvValueIsSet(t *testing.T) {
	s := base()
	s.Process.Env = append(s.Process.Env, "NVIDIA_VISIBLE_DEVICES=all")
	want := &oci.Spec{Process: &oci.Process{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}}}
	adj, err := Adjustment(want, toContainer(s))
	if err != nil {
		t.Fatal(err)
	}
	apply(t, s, adj)
	if !slices.Equal(s.Process.Env, []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"}) {
		t.Fatalf("env = %v", s.Process.Env)
	}
}

func TestUnsupportedEditsRefused(t *testing.T) {
	for name, want := range map[string]*oci.Spec{
		"intelRdt":       {Linux: &oci.Linux{IntelRdt: &oci.LinuxIntelRdt{ClosID: "x"}}},
		"additionalGids": {Process: &oci.Process{User: oci.User{AdditionalGids: []uint32{44}}}},
	} {
		if _, err := Adjustment(want, &api.Container{}); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

// FuzzAdjustment drives the conversion with arbitrary env, device, mount
// and hook edits.
func FuzzAdjustment(f *testing.F) {
	f.Add("A=1", "/dev/nvidia0", uint8(0), "/usr/lib/x.so", "/usr/bin/hook", "arg", false)
	f.Add("A=", "/dev/nvidia7", uint8(7), "/opt/a", "/bin/true", "", true)
	f.Add("NVINJECT_GPU_UUID_0=GPU-a", "/dev/dri/card0", uint8(200), "/etc/x", "/h", "--folder=/usr/lib", true)
	f.Fuzz(func(t *testing.T, env, dev string, minor uint8, mnt, hook, arg string, pre bool) {
		e := specs.ContainerEdits{
			Env:         []string{env},
			DeviceNodes: []*specs.DeviceNode{{Path: dev, Type: "c", Major: 195, Minor: int64(minor)}},
			Mounts:      []*specs.Mount{{HostPath: mnt, ContainerPath: mnt, Options: []string{"ro", "rbind"}}},
			Hooks:       []*specs.Hook{{HookName: "createContainer", Path: hook, Args: []string{arg}}},
		}
		if strings.HasPrefix(env, "PATH=") || dev == "/proc" || mnt == "/proc" {
			t.Skip("collides with the base spec on purpose")
		}
		if err := roundTrip(t, e, pre); err != nil {
			t.Skip("refused:", err)
		}
	})
}
