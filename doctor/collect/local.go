package collect

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/doctor/ctrdconfig"
	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/doctor/promtext"
	"github.com/nvinject/nvinject/doctor/smi"
	"github.com/nvinject/nvinject/shared/contract"
)

func collectSMI(ctx context.Context, path string) evidence.SMIEvidence {
	ev := evidence.SMIEvidence{Path: path}
	r, err := smi.Run(ctx, path)
	if err != nil {
		ev.Unread = err.Error()
		return ev
	}
	ev.Output, ev.Failed = r.Output, r.Failed
	mig := false
	for _, g := range r.GPUs {
		ev.GPUs = append(ev.GPUs, evidence.GPU{Index: g.Index, UUID: g.UUID, Name: g.Name, MIGMode: g.MIGMode, MIGPending: g.MIGPending})
		mig = mig || g.MIGMode == smi.MIGEnabled
	}
	if !mig {
		return ev
	}
	devs, err := smi.List(ctx, path)
	if err != nil {
		ev.MIGUnread = err.Error()
		return ev
	}
	for _, d := range devs {
		ev.MIGDevices = append(ev.MIGDevices, evidence.MIGDevice{Parent: d.Parent, Profile: d.Profile, UUID: d.UUID})
	}
	return ev
}

func collectKubeletDir(dir string) evidence.KubeletDirEvidence {
	ev := evidence.KubeletDirEvidence{Dir: dir}
	entries, err := os.ReadDir(dir)
	if err != nil {
		ev.Unread = fmt.Sprintf("list %s (run on the worker, or pass --kubelet-dir): %v", dir, err)
		return ev
	}
	for _, e := range entries {
		if e.Type()&fs.ModeSocket == 0 {
			continue
		}
		if e.Name() == "kubelet.sock" {
			ev.KubeletSocket = true
			continue
		}
		ev.PluginSockets = append(ev.PluginSockets, e.Name())
	}
	return ev
}

// fetchMetrics reads a daemon's metrics at url, or says why not: no URL
// (the flag to pass), or the fetch's error.
func fetchMetrics(ctx context.Context, o Options, url, flagName string, d evidence.DaemonEvidence) (promtext.Families, string) {
	if url == "" {
		return nil, fmt.Sprintf("no metrics URL (pass --%s, or let the doctor find the pod through the API server): %s", flagName, d.Describe())
	}
	f, err := promtext.Fetch(ctx, o.HTTPClient, url)
	if err != nil {
		return nil, err.Error()
	}
	return f, ""
}

func collectPlugin(ctx context.Context, o Options, pod evidence.DaemonEvidence) evidence.PluginEvidence {
	ev := evidence.PluginEvidence{URL: o.DevicePluginMetrics}
	f, unread := fetchMetrics(ctx, o, ev.URL, "device-plugin-metrics", pod)
	if unread != "" {
		ev.Unread = unread
		return ev
	}
	// Labelled counters appear only after their first increment, so on a
	// plugin that answers, an absent one means zero.
	ev.Registrations = orZero(f.SumWhere(contract.MetricRegistrations, "result", "ok"))
	ev.RegistrationErrors = orZero(f.SumWhere(contract.MetricRegistrations, "result", "error"))
	ev.Streams = f.Sum(contract.MetricStreams)
	ev.AllocateErrors = orZero(f.SumWhere(contract.MetricAllocations, "result", "refused"))
	ev.HealthEvents = healthEvents(f, contract.MetricHealthEvents)
	ev.Devices = deviceHealth(f, contract.MetricDeviceHealthy)
	ev.Held = heldGPUs(f)
	return ev
}

// heldGPUs reads the device plugin's withheld GPUs.
func heldGPUs(f promtext.Families) []evidence.HeldGPU {
	var out []evidence.HeldGPU
	for _, s := range f[contract.MetricGPUHeld] {
		if s.Value == 1 {
			out = append(out, evidence.HeldGPU{UUID: s.Labels["uuid"], Holder: s.Labels["holder"], Pod: s.Labels["pod"], Claim: s.Labels["claim"]})
		}
	}
	slices.SortFunc(out, func(a, b evidence.HeldGPU) int { return strings.Compare(a.UUID+a.Pod+a.Claim, b.UUID+b.Pod+b.Claim) })
	return out
}

// healthEvents are the health events a daemon counted that its policy did
// not ignore ("xid 79", "gpu-lost").
func healthEvents(f promtext.Families, name string) []string {
	var out []string
	for _, s := range f[name] {
		if s.Value > 0 && s.Labels["ignored"] != "true" {
			out = append(out, strings.TrimSpace(s.Labels["kind"]+" "+s.Labels["xid"]))
		}
	}
	slices.Sort(out)
	return out
}

// deviceHealth reads a daemon's per-GPU healthy gauge.
func deviceHealth(f promtext.Families, name string) []evidence.DeviceHealth {
	var out []evidence.DeviceHealth
	for _, s := range f[name] {
		out = append(out, evidence.DeviceHealth{UUID: s.Labels["uuid"], Healthy: s.Value == 1})
	}
	slices.SortFunc(out, func(a, b evidence.DeviceHealth) int { return strings.Compare(a.UUID, b.UUID) })
	return out
}

func orZero(p *float64) *float64 {
	if p == nil {
		return new(float64)
	}
	return p
}

func collectNRIMetrics(ctx context.Context, o Options, pod evidence.DaemonEvidence, ev *evidence.NRIEvidence) {
	ev.URL = o.NRIMetrics
	f, unread := fetchMetrics(ctx, o, ev.URL, "nri-metrics", pod)
	if unread != "" {
		ev.MetricsUnread = unread
		return
	}
	ev.Connected = f.Sum(contract.MetricNRIConnected)
	for _, s := range f[contract.MetricNRIRefusals] {
		if ev.Refusals == nil {
			ev.Refusals = map[string]float64{}
		}
		ev.Refusals[s.Labels["reason"]] += s.Value
	}
}

func collectContainerd(path string) evidence.ContainerdEvidence {
	ev := evidence.ContainerdEvidence{Path: path}
	c, err := ctrdconfig.Load(path)
	if err != nil {
		ev.Unread = err.Error()
		return ev
	}
	ev.Files, ev.Handlers, ev.CDISpecDirs, ev.NRIDisabled = c.Files, c.Handlers, c.CDISpecDirs, c.NRIDisabled
	return ev
}

// cdiName finds qualified CDI device names in runtime error messages.
var cdiName = regexp.MustCompile(`[a-z0-9][a-z0-9.-]*/[a-z0-9][a-z0-9._-]*=[A-Za-z0-9][A-Za-z0-9_.:-]*[A-Za-z0-9]`)

// wantedNames are the CDI names pods need: nvinject's names for the
// selected and published GPUs, the GPUs DRA claims hold, and any name a
// container error mentions.
func wantedNames(e evidence.Evidence, kind string) []string {
	var out []string
	add := func(n string) {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if e.Selected.Unread == "" && !e.Selected.All {
		for _, u := range e.Selected.UUIDs {
			add(kind + "=" + u)
		}
	}
	for _, d := range e.Plugin.Devices {
		add(kind + "=" + d.UUID)
	}
	if e.DRA != nil {
		for _, d := range e.DRA.Slices.Devices {
			if d.UUID != "" && held(e.DRA, d) {
				add(kind + "=" + d.UUID)
			}
		}
	}
	for _, c := range e.NRI.CreateErrors {
		for _, n := range cdiName.FindAllString(c.Message, -1) {
			add(n)
		}
	}
	slices.Sort(out)
	return out
}

func collectCDI(dirs, wanted []string, kind string) evidence.CDIEvidence {
	ev := evidence.CDIEvidence{Dirs: dirs, Wanted: wanted}
	for _, d := range dirs {
		if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
			ev.MissingDirs = append(ev.MissingDirs, d)
		}
	}
	if len(ev.MissingDirs) == len(dirs) {
		ev.Unread = fmt.Sprintf("none of the CDI spec dirs %v exists here (run on the worker, or pass --cdi-spec-dir)", dirs)
		return ev
	}
	// Manual refresh: one consistent scan, no watcher goroutine.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		ev.Unread = fmt.Sprintf("load CDI specs from %v: %v", dirs, err)
		return ev
	}
	for _, d := range dirs {
		for _, ext := range []string{"*.yaml", "*.json"} {
			m, _ := filepath.Glob(filepath.Join(d, ext))
			ev.Files = append(ev.Files, m...)
		}
	}
	// A file that loaded has errors only for devices it shares with another
	// file, which the shadowed devices (collectRuntimeSpecs) explain.
	loaded := map[string]bool{}
	for _, v := range cache.ListVendors() {
		for _, s := range cache.GetVendorSpecs(v) {
			loaded[s.GetPath()] = true
		}
	}
	for path, errs := range cache.GetErrors() {
		if !loaded[path] {
			ev.Errors = append(ev.Errors, evidence.SpecError{Path: path, Error: contract.Cut(errors.Join(errs...).Error(), 2*contract.MaxQuoted)})
		}
	}
	slices.SortFunc(ev.Errors, func(a, b evidence.SpecError) int { return strings.Compare(a.Path, b.Path) })
	ev.Devices = cache.ListDevices()
	// A GPU with MIG mode on is in the spec as its MIG devices only.
	migParents := map[string]bool{}
	for _, n := range ev.Devices {
		if d := cache.GetDevice(n); d != nil && d.Annotations[contract.MIGParentAnnotation] != "" {
			kind, _, _ := strings.Cut(n, "=")
			migParents[kind+"="+d.Annotations[contract.MIGParentAnnotation]] = true
		}
	}
	for _, n := range wanted {
		if cache.GetDevice(n) == nil && !migParents[n] {
			ev.Unresolved = append(ev.Unresolved, n)
		}
	}
	ev.GPUDevices = gpuDevices(cache, ev.Devices, kind)
	return ev
}

// gpuDevices are the GPUs and MIG devices among the cache's devices of
// kind, one per UUID (the env naming it: contract.EnvUUIDPrefix or
// EnvMIGUUIDPrefix) with every name it has; "all", which names several,
// is none of them.
func gpuDevices(cache *cdi.Cache, names []string, kind string) []evidence.CDIDevice {
	var out []evidence.CDIDevice
	for _, n := range names {
		k, name, _ := strings.Cut(n, "=")
		d := cache.GetDevice(n)
		if k != kind || d == nil {
			continue
		}
		var uuids []string
		for _, env := range d.ContainerEdits.Env {
			k, v, _ := strings.Cut(env, "=")
			if strings.HasPrefix(k, contract.EnvUUIDPrefix) || strings.HasPrefix(k, contract.EnvMIGUUIDPrefix) {
				uuids = append(uuids, v)
			}
		}
		if len(uuids) != 1 {
			continue
		}
		if i := slices.IndexFunc(out, func(c evidence.CDIDevice) bool { return c.UUID == uuids[0] }); i >= 0 {
			out[i].Names = append(out[i].Names, name)
			continue
		}
		a := d.Annotations
		c := evidence.CDIDevice{UUID: uuids[0], Names: []string{name}, Parent: a[contract.MIGParentAnnotation], Profile: a[contract.MIGProfileAnnotation]}
		c.Replicas, _ = strconv.Atoi(a[contract.SharedReplicasAnnotation])
		if dir := a[contract.MPSPipeDirAnnotation]; dir != "" {
			c.MPS = &evidence.MPSDaemon{PipeDir: dir}
		}
		out = append(out, c)
	}
	return out
}

// held says whether a claim holds slice device d.
func held(e *evidence.DRAEvidence, d evidence.SliceDevice) bool {
	for _, c := range e.Claims.Claims {
		if slices.ContainsFunc(c.Devices, func(cd evidence.ClaimDevice) bool { return cd.ID() == d.ID() }) {
			return true
		}
	}
	return false
}
