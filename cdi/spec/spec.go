// Package spec generates the CDI spec that puts the node's GPUs into
// containers: one device per GPU, an "all" device, and the driver's
// control nodes, libraries and tools as common edits.
package spec

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvinject/nvinject/cdi/driver"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// UUIDEnv returns the env key naming the UUID of the GPU with minor.
func UUIDEnv(minor int) string { return contract.EnvUUIDPrefix + strconv.Itoa(minor) }

// MIGUUIDEnv returns the env key naming the UUID of the MIG device whose
// compute instance access node has ciMinor.
func MIGUUIDEnv(ciMinor int64) string {
	return contract.EnvMIGUUIDPrefix + strconv.FormatInt(ciMinor, 10)
}

// MIGIndexName is a MIG device's name under --device-name-strategy=index.
func MIGIndexName(gpuIndex, migIndex int) string {
	return contract.MIGDeviceIndexID(gpuIndex, migIndex)
}

// NameStrategy says how GPU devices are named in the spec.
type NameStrategy string

// Device name strategies.
const (
	NameUUID  NameStrategy = "uuid"
	NameIndex NameStrategy = "index"
)

// ParseNameStrategy validates a --device-name-strategy value.
func ParseNameStrategy(v string) (NameStrategy, error) {
	switch NameStrategy(v) {
	case NameUUID, NameIndex:
		return NameStrategy(v), nil
	}
	return "", fmt.Errorf("device name strategy %q is not valid; use uuid or index", v)
}

// Mount options: driver files read-only; IPC sockets and the MPS pipe
// directory writable (clients connect and create pipes), never executable.
var (
	mountOpts = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}
	ipcOpts   = []string{"nosuid", "nodev", "rbind", "rprivate", "noexec"}
	mpsOpts   = []string{"rw", "nosuid", "nodev", "rbind", "rprivate", "noexec"}
)

// Hook commands of the createContainer hooks the spec runs, in this order.
// nvinject-cdi-hook implements them with the arguments NVIDIA's
// nvidia-cdi-hook takes, so --hook-binary may name either.
const (
	HookCreateSymlinks   = "create-symlinks"
	HookEnableCUDACompat = "enable-cuda-compat"
	HookUpdateLDCache    = "update-ldcache"
)

// Generator turns discovered GPUs into a CDI spec.
type Generator struct {
	vendor, class  string
	driverRoot     string
	hostDriverRoot string
	names          NameStrategy
	hookBinary     string
	replicas       map[string]int
	mps            map[string]MPSShare
	// migOnDemand allows a spec of MIG GPUs without MIG devices yet.
	migOnDemand bool
}

// MPSShare is how a GPU or MIG device shared through MPS reaches its
// clients: its control daemon's pipe directory and the daemons' shared
// memory directory (host paths, mounted at the same paths; the memory at
// /dev/shm), and each client's limits.
type MPSShare struct {
	PipeDir, ShmDir        string
	ActiveThreadPercentage int
	// PinnedMemoryMiB is 0 for no limit.
	PinnedMemoryMiB uint64
}

// Option configures a Generator.
type Option func(*Generator)

// WithVendor sets the spec's vendor (default nvidia.com).
func WithVendor(v string) Option { return func(g *Generator) { g.vendor = v } }

// WithClass sets the spec's class (default gpu).
func WithClass(c string) Option { return func(g *Generator) { g.class = c } }

// WithDriverRoot sets where this process reads the driver's files.
func WithDriverRoot(p string) Option { return func(g *Generator) { g.driverRoot = p } }

// WithHostDriverRoot sets where the driver root is on the host, when this
// process sees it elsewhere (a container mounting the host's / at /host).
func WithHostDriverRoot(p string) Option { return func(g *Generator) { g.hostDriverRoot = p } }

// WithNameStrategy names GPU devices by UUID (default) or also by index.
func WithNameStrategy(s NameStrategy) Option { return func(g *Generator) { g.names = s } }

// HookEnv is every hook's environment. A hook without one gets whatever
// the runtime hands it: runc before 1.3 hands it the container's, so an
// image's LD_PRELOAD reached a host program a hook ran (CVE-2025-23266's
// class). Not empty, since an empty env is omitted from the spec.
func HookEnv() []string { return []string{"PATH=/usr/bin:/bin"} }

// WithHookBinary makes the spec run createContainer hooks from the hook
// program at host path p (nvinject-cdi-hook, or NVIDIA's nvidia-cdi-hook):
// create-symlinks for the libraries' soname and development links,
// enable-cuda-compat for the image's CUDA forward compatibility libraries,
// and update-ldcache so the container's ld.so.cache lists the driver's
// libraries. Empty (the default): no hooks; the links are bind mounts.
func WithHookBinary(p string) Option { return func(g *Generator) { g.hookBinary = p } }

// WithSharedReplicas records, on the CDI device of each GPU or MIG device
// UUID in replicas, how many pods may share it (time-slicing), for
// nvinject-nri's check.
func WithSharedReplicas(replicas map[string]int) Option {
	return func(g *Generator) { g.replicas = replicas }
}

// WithMPS gives the CDI device of each GPU or MIG device UUID in shares
// what an MPS client needs: CUDA_MPS_PIPE_DIRECTORY and its daemon's pipe
// directory, the daemons' /dev/shm, and its limits in MPS's client env
// (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT).
func WithMPS(shares map[string]MPSShare) Option { return func(g *Generator) { g.mps = shares } }

// WithMIGOnDemand allows selected GPUs with MIG mode on and no MIG device
// yet (a plugin makes them on demand and writes the spec again): until one
// is made the spec may have no device, which Write stores as no file.
func WithMIGOnDemand() Option { return func(g *Generator) { g.migOnDemand = true } }

// New returns a Generator.
func New(opts ...Option) *Generator {
	g := &Generator{vendor: contract.CDIVendor, class: contract.CDIClass, driverRoot: "/", names: NameUUID}
	for _, o := range opts {
		o(g)
	}
	if g.hostDriverRoot == "" {
		g.hostDriverRoot = g.driverRoot
	}
	return g
}

// Kind returns the spec's vendor/class.
func (g *Generator) Kind() string { return g.vendor + "/" + g.class }

// QualifiedName returns the CDI name of a device of this generator's kind.
func (g *Generator) QualifiedName(name string) string {
	return parser.QualifiedName(g.vendor, g.class, name)
}

// Generate builds and validates the spec for devs, which must be among
// node's devices: a device per whole GPU, and for a GPU with MIG mode on a
// device per MIG device instead (named by its MIG UUID: the parent's node
// and the GI's and CI's access nodes), never the MIG GPU whole.
func (g *Generator) Generate(node gpu.Node, devs []gpu.Device) (*specs.Spec, error) {
	if len(devs) == 0 {
		return nil, errors.New("no GPUs to put in the CDI spec; check the GPU selection (NVIDIA_VISIBLE_DEVICES)")
	}
	files, err := driver.Find(g.driverRoot, node.DriverVersion, node.DriverSource)
	if err != nil {
		return nil, err
	}
	if g.hookBinary != "" {
		if !path.IsAbs(g.hookBinary) {
			return nil, fmt.Errorf("--hook-binary=%q is not an absolute path; give the hook program's path on the host (such as /var/lib/nvinject/bin/nvinject-cdi-hook)", g.hookBinary)
		}
		if st, err := os.Stat(g.hookBinary); err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("--hook-binary=%s is not an executable file (%v); install nvinject-cdi-hook there (the device plugin's DaemonSet copies it to /var/lib/nvinject/bin), point it at NVIDIA's nvidia-cdi-hook, or pass --hook-binary= for a spec without hooks", g.hookBinary, err)
		}
		if err := trustedHook(g.hookBinary); err != nil {
			return nil, err
		}
	}
	s := &specs.Spec{Kind: g.Kind(), Annotations: map[string]string{contract.DriverVersionAnnotation: node.DriverVersion}}
	if node.Simulated {
		s.Annotations[contract.SimulatedAnnotation] = "true"
	}
	seen := map[string]bool{}
	for _, d := range devs {
		if _, ok := node.Device(d.UUID); !ok {
			return nil, fmt.Errorf("GPU %s is not on this node", d.UUID)
		}
		if seen[d.UUID] {
			return nil, fmt.Errorf("GPU %s is listed twice; list each GPU once", d.UUID)
		}
		seen[d.UUID] = true
		if d.MIGEnabled {
			if d.MIGErr != nil {
				return nil, fmt.Errorf("GPU %d (%s) has MIG mode on but its MIG devices cannot be read: %w", d.Index, d.UUID, d.MIGErr)
			}
			for i, m := range d.MIG {
				if m.CIAccess.Path == "" || m.GIAccess.Path == "" {
					return nil, fmt.Errorf("MIG device %s on GPU %d has no /dev/nvidia-caps access nodes; check /proc/driver/nvidia/capabilities/gpu%d/mig", m.UUID, d.Index, d.Minor)
				}
				edits := migEdits(m)
				ann := g.annotations(d, m.UUID)
				g.share(&edits, ann, m.UUID)
				ann[contract.MIGParentAnnotation], ann[contract.MIGProfileAnnotation] = d.UUID, m.Profile
				s.Devices = append(s.Devices, specs.Device{Name: m.UUID, Annotations: ann, ContainerEdits: edits})
				if g.names == NameIndex {
					s.Devices = append(s.Devices, specs.Device{Name: MIGIndexName(d.Index, i), Annotations: ann, ContainerEdits: edits})
				}
			}
			continue
		}
		edits := g.deviceEdits(d)
		ann := g.annotations(d, d.UUID)
		g.share(&edits, ann, d.UUID)
		s.Devices = append(s.Devices, specs.Device{Name: d.UUID, Annotations: ann, ContainerEdits: edits})
		if g.names == NameIndex {
			s.Devices = append(s.Devices, specs.Device{Name: strconv.Itoa(d.Index), Annotations: ann, ContainerEdits: edits})
		}
	}
	if len(s.Devices) == 0 && !g.migOnDemand {
		return nil, errors.New("no device to put in the CDI spec: the selected GPUs have MIG mode on without MIG devices; create MIG devices (nvidia-smi mig -cgi <profiles> -C) or disable MIG (nvidia-smi -mig 0)")
	}
	for u := range g.replicas {
		if !slices.ContainsFunc(s.Devices, func(d specs.Device) bool { return d.Name == u }) {
			return nil, fmt.Errorf("shared device %s is not among the spec's GPUs and MIG devices; share a published one", u)
		}
	}
	for u, share := range g.mps {
		if !slices.ContainsFunc(s.Devices, func(d specs.Device) bool { return d.Name == u }) {
			return nil, fmt.Errorf("MPS-shared device %s is not among the spec's GPUs and MIG devices; share a published one", u)
		}
		if !path.IsAbs(share.PipeDir) || !path.IsAbs(share.ShmDir) || share.ActiveThreadPercentage < 1 || share.ActiveThreadPercentage > 100 {
			return nil, fmt.Errorf("MPS share of %s: pipe dir %q and shm dir %q must be absolute and the active thread percentage %d within 1..100", u, share.PipeDir, share.ShmDir, share.ActiveThreadPercentage)
		}
	}
	var all specs.ContainerEdits
	parents := map[string]bool{}
	for _, d := range devs {
		var e specs.ContainerEdits
		if !d.MIGEnabled {
			e = g.deviceEdits(d)
		}
		for _, m := range d.MIG {
			me := migEdits(m)
			// The parent's node once, however many of its MIG devices.
			if parents[m.Parent.Path] {
				me.DeviceNodes = me.DeviceNodes[1:]
			}
			parents[m.Parent.Path] = true
			e.DeviceNodes = append(e.DeviceNodes, me.DeviceNodes...)
			e.Env = append(e.Env, me.Env...)
		}
		all.DeviceNodes = append(all.DeviceNodes, e.DeviceNodes...)
		all.Env = append(all.Env, e.Env...)
	}
	if len(all.DeviceNodes) > 0 {
		s.Devices = append(s.Devices, specs.Device{Name: "all", ContainerEdits: all})
	}
	s.ContainerEdits = g.commonEdits(node, files)
	if s.Version, err = specs.MinimumRequiredVersion(s); err != nil {
		return nil, fmt.Errorf("determine the CDI version of the spec: %w", err)
	}
	if _, err := cdi.ParseSpec(mustJSON(s)); err != nil {
		return nil, fmt.Errorf("generated CDI spec is invalid: %w", err)
	}
	return s, nil
}

// annotations of the CDI device of uuid, d itself or one of its MIG devices.
func (g *Generator) annotations(d gpu.Device, uuid string) map[string]string {
	ann := map[string]string{contract.GPUIndexAnnotation: strconv.Itoa(d.Index)}
	if n, ok := g.replicas[uuid]; ok {
		ann[contract.SharedReplicasAnnotation] = strconv.Itoa(n)
	}
	return ann
}

// share makes the device of uuid an MPS client of its daemon, if it is
// shared through MPS.
func (g *Generator) share(e *specs.ContainerEdits, ann map[string]string, uuid string) {
	share, ok := g.mps[uuid]
	if !ok {
		return
	}
	ann[contract.MPSPipeDirAnnotation] = share.PipeDir
	c := MPSClientEdits(share, 1)
	e.Env = append(e.Env, c.Env...)
	e.Mounts = append(e.Mounts, c.Mounts...)
}

// MPSClientEdits make a container a client of the MPS daemon share names,
// which serves devices devices (CUDA's 0..devices-1): its pipe directory
// and the daemons' /dev/shm mounted, its limits in MPS's client env.
func MPSClientEdits(share MPSShare, devices int) specs.ContainerEdits {
	e := specs.ContainerEdits{Env: []string{"CUDA_MPS_PIPE_DIRECTORY=" + share.PipeDir, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + strconv.Itoa(share.ActiveThreadPercentage)}}
	if share.PinnedMemoryMiB > 0 {
		limits := make([]string, devices)
		for i := range limits {
			limits[i] = fmt.Sprintf("%d=%dM", i, share.PinnedMemoryMiB)
		}
		e.Env = append(e.Env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="+strings.Join(limits, ","))
	}
	e.Mounts = []*specs.Mount{
		{HostPath: share.PipeDir, ContainerPath: share.PipeDir, Options: mpsOpts},
		{HostPath: share.ShmDir, ContainerPath: "/dev/shm", Options: mpsOpts},
	}
	return e
}

func (g *Generator) deviceEdits(d gpu.Device) specs.ContainerEdits {
	return specs.ContainerEdits{
		DeviceNodes: []*specs.DeviceNode{node(d.Node)},
		Env:         []string{UUIDEnv(d.Minor) + "=" + d.UUID},
	}
}

// migEdits give one MIG device: its parent's /dev/nvidiaN first, then the
// GI's and the CI's access nodes, and the env naming its UUID by the CI's.
func migEdits(m gpu.MIGDevice) specs.ContainerEdits {
	return specs.ContainerEdits{
		DeviceNodes: []*specs.DeviceNode{node(m.Parent), node(m.GIAccess), node(m.CIAccess)},
		Env:         []string{MIGUUIDEnv(m.CIAccess.Minor) + "=" + m.UUID},
	}
}

func (g *Generator) commonEdits(n gpu.Node, f driver.Files) specs.ContainerEdits {
	var e specs.ContainerEdits
	for _, c := range n.ControlNodes {
		e.DeviceNodes = append(e.DeviceNodes, node(c))
	}
	// "void" stops an installed nvidia-container-runtime hook from
	// injecting GPUs a second time; CDI already did.
	e.Env = []string{"NVIDIA_VISIBLE_DEVICES=void"}
	if n.Simulated {
		e.Env = append(e.Env, contract.EnvSimulated+"=1")
	}
	seen := map[string]bool{}
	mount := func(source, ctr string, opts []string) {
		if seen[ctr] {
			return
		}
		seen[ctr] = true
		e.Mounts = append(e.Mounts, &specs.Mount{HostPath: path.Join(g.hostDriverRoot, source), ContainerPath: ctr, Options: opts})
	}
	var links []string
	in := f.InContainer
	for _, l := range f.Libraries {
		mount(l.File, in(l.File), mountOpts)
		named := []string{}
		if l.Soname != "" {
			named = append(named, path.Join(l.Dir(), l.Soname))
		}
		if l.DevLink != "" {
			named = append(named, path.Join(l.Dir(), l.DevLink))
		}
		named = append(named, l.Links...)
		if g.hookBinary == "" {
			// Without a hook program the links become bind mounts of the file.
			for _, p := range named {
				mount(l.File, in(p), mountOpts)
			}
			continue
		}
		if l.Soname != "" {
			links = append(links, path.Base(l.File)+"::"+in(path.Join(l.Dir(), l.Soname)))
		}
		if l.DevLink != "" {
			target := l.Soname
			if target == "" {
				target = path.Base(l.File)
			}
			links = append(links, target+"::"+in(path.Join(l.Dir(), l.DevLink)))
		}
		for _, p := range l.Links {
			links = append(links, in(l.File)+"::"+in(p))
		}
	}
	for _, b := range f.Binaries {
		mount(b.Source, b.Path, mountOpts)
	}
	for _, fw := range f.Firmware {
		mount(fw.Source, fw.Path, mountOpts)
	}
	for _, ipc := range f.IPC {
		mount(ipc.Source, ipc.Path, ipcOpts)
	}
	if f.SimulatedFacts != "" {
		mount(f.SimulatedFacts, driver.SimulatedFacts, mountOpts)
	}
	if g.hookBinary != "" {
		hook := func(args ...string) {
			e.Hooks = append(e.Hooks, &specs.Hook{HookName: "createContainer", Path: g.hookBinary, Args: append([]string{path.Base(g.hookBinary)}, args...), Env: HookEnv()})
		}
		if len(links) > 0 {
			args := []string{HookCreateSymlinks}
			for _, l := range links {
				args = append(args, "--link", l)
			}
			hook(args...)
		}
		hook(HookEnableCUDACompat, "--host-driver-version="+f.Version)
		args := []string{HookUpdateLDCache}
		for _, d := range f.LibDirs() {
			args = append(args, "--folder", d)
		}
		hook(args...)
	}
	return e
}

func node(n gpu.DeviceNode) *specs.DeviceNode {
	return &specs.DeviceNode{Path: n.Path, Type: n.Type, Major: n.Major, Minor: n.Minor}
}

// FileName is the spec's file name in a spec dir.
func FileName(s *specs.Spec) (string, error) {
	name, err := cdi.GenerateNameForSpec(s)
	if err != nil {
		return "", fmt.Errorf("name the CDI spec file: %w", err)
	}
	return name + ".yaml", nil
}

// Write stores s in dir atomically unless an identical spec is already
// there; a spec without devices (WithMIGOnDemand) removes the file. It
// returns the file's path and whether it changed.
func Write(dir string, s *specs.Spec) (string, bool, error) {
	name, err := FileName(s)
	if err != nil {
		return "", false, err
	}
	p := filepath.Join(dir, name)
	if len(s.Devices) == 0 {
		err := os.Remove(p)
		if errors.Is(err, os.ErrNotExist) {
			return p, false, nil
		}
		if err != nil {
			return "", false, fmt.Errorf("remove CDI spec %s, which has no device left: %w", p, err)
		}
		return p, true, nil
	}
	if old, err := cdi.ReadSpec(p, 0); err == nil && reflect.DeepEqual(old.Spec, s) {
		return p, false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, fmt.Errorf("create CDI spec dir %s: %w", dir, err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return "", false, fmt.Errorf("open CDI spec dir %s: %w", dir, err)
	}
	if err := cache.WriteSpec(s, name); err != nil {
		return "", false, fmt.Errorf("write CDI spec %s: %w", p, err)
	}
	return p, true, nil
}

// trustedHook refuses a hook program that someone other than root (or
// this process's user, who writes the spec) could replace: the runtime
// runs it as root for every container given the spec. The program and
// each directory above it must be owned by one of them and not writable
// by group or others; a sticky directory (/tmp) is fine, as others cannot
// rename or remove what they do not own there.
func trustedHook(p string) error {
	me := uint32(os.Geteuid())
	for cur := filepath.Clean(p); ; cur = filepath.Dir(cur) {
		st, err := os.Stat(cur)
		if err != nil {
			return fmt.Errorf("--hook-binary=%s: %w", p, err)
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		sticky := st.IsDir() && st.Mode()&os.ModeSticky != 0
		if (sys.Uid != 0 && sys.Uid != me) || (st.Mode().Perm()&0o022 != 0 && !sticky) {
			return fmt.Errorf("--hook-binary=%s: %s is owned by uid %d with mode %v, so someone other than root could replace the program the runtime runs as root for every container; make it root's and not group- or world-writable (chown root %s; chmod go-w %s)", p, cur, sys.Uid, st.Mode().Perm(), cur, cur)
		}
		if cur == "/" {
			return nil
		}
	}
}
