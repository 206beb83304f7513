package spec_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/shared/contract"
)

// A MIG device resolves, through the CDI library as containerd resolves
// it, to its parent's node and its own two access nodes, with its UUID in
// the env; no other slice's node, no other GPU, no MIG GPU whole.
func TestMIGDeviceThroughCDICache(t *testing.T) {
	node, root := simNode(t, "sim:a100-80gb*3,mig=1:3g.40gb+1g.10gb*2")
	g := spec.New(spec.WithDriverRoot(root), spec.WithNameStrategy(spec.NameIndex))
	s, err := g.Generate(node, node.Devices)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range s.Devices {
		names = append(names, d.Name)
	}
	parent := node.Devices[1]
	if len(parent.MIG) != 3 {
		t.Fatalf("GPU 1 has %d MIG devices, want 3", len(parent.MIG))
	}
	if slices.Contains(names, parent.UUID) || slices.Contains(names, "1") {
		t.Errorf("the MIG GPU is in the spec whole: %v", names)
	}
	for i, m := range parent.MIG {
		if !slices.Contains(names, m.UUID) || !slices.Contains(names, spec.MIGIndexName(1, i)) {
			t.Errorf("spec lacks MIG device %s (%s): %v", m.UUID, spec.MIGIndexName(1, i), names)
		}
	}
	dir := t.TempDir()
	if _, _, err := spec.Write(dir, s); err != nil {
		t.Fatal(err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	want := parent.MIG[2]
	ociSpec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(ociSpec, g.QualifiedName(want.UUID)); err != nil || len(unresolved) > 0 {
		t.Fatalf("inject: %v, unresolved %v", err, unresolved)
	}
	var got []string
	for _, d := range ociSpec.Linux.Devices {
		if strings.HasPrefix(d.Path, contract.CapsDir) || d.Path == "/dev/nvidia1" || d.Path == "/dev/nvidia0" || d.Path == "/dev/nvidia2" {
			got = append(got, d.Path)
		}
	}
	if wantNodes := []string{"/dev/nvidia1", want.GIAccess.Path, want.CIAccess.Path}; !slices.Equal(got, wantNodes) {
		t.Errorf("GPU and caps nodes = %v, want %v", got, wantNodes)
	}
	if want.GIAccess.Path == parent.MIG[1].GIAccess.Path || want.CIAccess.Minor == parent.MIG[1].CIAccess.Minor {
		t.Errorf("two MIG devices share an access node: %+v %+v", want, parent.MIG[1])
	}
	var uuidEnv []string
	for _, e := range ociSpec.Process.Env {
		if strings.HasPrefix(e, contract.EnvUUIDPrefix) || strings.HasPrefix(e, contract.EnvMIGUUIDPrefix) {
			uuidEnv = append(uuidEnv, e)
		}
	}
	if w := spec.MIGUUIDEnv(want.CIAccess.Minor) + "=" + want.UUID; !slices.Equal(uuidEnv, []string{w}) {
		t.Errorf("UUID env = %v, want [%s]", uuidEnv, w)
	}
	for _, d := range s.Devices {
		if d.Name == want.UUID && (d.Annotations[contract.MIGParentAnnotation] != parent.UUID || d.Annotations[contract.MIGProfileAnnotation] != want.Profile) {
			t.Errorf("MIG device annotations %v", d.Annotations)
		}
	}
}

func TestMIGDeviceWithoutCaps(t *testing.T) {
	node, root := simNode(t, "sim:a100-80gb,mig=0:1g.10gb")
	node.Devices[0].MIG[0].CIAccess.Path = ""
	if _, err := spec.New(spec.WithDriverRoot(root)).Generate(node, node.Devices); err == nil || !strings.Contains(err.Error(), "/proc/driver/nvidia/capabilities/gpu0/mig") {
		t.Errorf("MIG device without access nodes: %v", err)
	}
}

// A shared GPU's and a shared MIG device's CDI devices carry their replica
// count; others none; an unknown UUID is refused.
func TestSharedReplicasAnnotation(t *testing.T) {
	node, root := simNode(t, "sim:a100-80gb*2,mig=1:1g.10gb*2")
	whole, mig := node.Devices[0].UUID, node.Devices[1].MIG[1].UUID
	s, err := spec.New(spec.WithDriverRoot(root), spec.WithSharedReplicas(map[string]int{whole: 4, mig: 2})).Generate(node, node.Devices)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{whole: "4", mig: "2", node.Devices[1].MIG[0].UUID: ""}
	for _, d := range s.Devices {
		if w, ok := want[d.Name]; ok && d.Annotations[contract.SharedReplicasAnnotation] != w {
			t.Errorf("%s: replicas annotation %q, want %q", d.Name, d.Annotations[contract.SharedReplicasAnnotation], w)
		}
	}
	if _, err := spec.New(spec.WithDriverRoot(root), spec.WithSharedReplicas(map[string]int{"GPU-nope": 2})).Generate(node, node.Devices); err == nil || !strings.Contains(err.Error(), "GPU-nope") {
		t.Errorf("unknown shared device: %v", err)
	}
}

// An MPS-shared GPU's and MIG device's CDI devices make their containers
// clients of their daemon (pipe dir, /dev/shm, limits, by the index name
// too); other devices get none of it; bad shares are refused.
func TestMPSShareEdits(t *testing.T) {
	node, root := simNode(t, "sim:a100-80gb*2,mig=1:1g.10gb*2")
	whole, mig, other := node.Devices[0].UUID, node.Devices[1].MIG[1].UUID, node.Devices[1].MIG[0].UUID
	shares := map[string]spec.MPSShare{
		whole: {PipeDir: "/run/nvinject/mps/" + whole + "/pipe", ShmDir: "/run/nvinject/mps/shm", ActiveThreadPercentage: 25, PinnedMemoryMiB: 20480},
		mig:   {PipeDir: "/run/nvinject/mps/" + mig + "/pipe", ShmDir: "/run/nvinject/mps/shm", ActiveThreadPercentage: 50},
	}
	s, err := spec.New(spec.WithDriverRoot(root), spec.WithNameStrategy(spec.NameIndex), spec.WithMPS(shares)).Generate(node, node.Devices)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct {
		share  *spec.MPSShare
		pinned string
	}{
		whole: {ptr(shares[whole]), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"}, "0": {ptr(shares[whole]), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"},
		mig: {ptr(shares[mig]), ""}, "1:1": {ptr(shares[mig]), ""}, other: {}, "1:0": {},
	} {
		d := device(t, s, name)
		env := strings.Join(d.ContainerEdits.Env, " ")
		if want.share == nil {
			if strings.Contains(env, "CUDA_MPS") || len(d.ContainerEdits.Mounts) != 0 || d.Annotations[contract.MPSPipeDirAnnotation] != "" {
				t.Errorf("%s is not MPS-shared but has env %s, mounts %v", name, env, d.ContainerEdits.Mounts)
			}
			continue
		}
		for _, e := range []string{"CUDA_MPS_PIPE_DIRECTORY=" + want.share.PipeDir, fmt.Sprintf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d", want.share.ActiveThreadPercentage), want.pinned} {
			if !strings.Contains(env, e) {
				t.Errorf("%s: env %s lacks %s", name, env, e)
			}
		}
		if want.pinned == "" && strings.Contains(env, "PINNED") {
			t.Errorf("%s: pinned limit without one configured: %s", name, env)
		}
		mounts := map[string]string{}
		for _, m := range d.ContainerEdits.Mounts {
			mounts[m.ContainerPath] = m.HostPath
		}
		if mounts[want.share.PipeDir] != want.share.PipeDir || mounts["/dev/shm"] != want.share.ShmDir {
			t.Errorf("%s: mounts %v", name, mounts)
		}
		if d.Annotations[contract.MPSPipeDirAnnotation] != want.share.PipeDir {
			t.Errorf("%s: pipe dir annotation %q", name, d.Annotations[contract.MPSPipeDirAnnotation])
		}
	}
	for _, bad := range []map[string]spec.MPSShare{
		{"GPU-nope": shares[whole]},
		{whole: {PipeDir: "pipe", ShmDir: "/shm", ActiveThreadPercentage: 50}},
		{whole: {PipeDir: "/pipe", ShmDir: "/shm", ActiveThreadPercentage: 0}},
	} {
		if _, err := spec.New(spec.WithDriverRoot(root), spec.WithMPS(bad)).Generate(node, node.Devices); err == nil || !strings.Contains(err.Error(), "MPS") {
			t.Errorf("bad share %v: %v", bad, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func device(t *testing.T, s *specs.Spec, name string) specs.Device {
	t.Helper()
	for _, d := range s.Devices {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no device %s in the spec", name)
	return specs.Device{}
}
