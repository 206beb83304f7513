// Package convert turns CDI edits, as the CDI library applies them to an OCI
// spec, into an NRI container adjustment. containerd may already have
// applied the same CDI devices before NRI runs, so the adjustment holds only
// what the container still lacks: applying it never duplicates a hook or a
// mount, and converting again after applying yields an empty adjustment.
package convert

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	oci "github.com/opencontainers/runtime-spec/specs-go"
)

// Adjustment returns the edits of want (an OCI spec holding only CDI edits)
// that ctr does not already have.
func Adjustment(want *oci.Spec, ctr *api.Container) (*api.ContainerAdjustment, error) {
	if err := supported(want, ctr); err != nil {
		return nil, err
	}
	adj := &api.ContainerAdjustment{}
	env := envMap(ctr.GetEnv())
	if want.Process != nil {
		for _, kv := range want.Process.Env {
			k, v, _ := strings.Cut(kv, "=")
			if cur, ok := env[k]; !ok || cur != v {
				adj.AddEnv(k, v)
			}
		}
	}
	if want.Linux != nil {
		have := ctr.GetLinux().GetDevices()
		for _, d := range want.Linux.Devices {
			if !slices.ContainsFunc(have, func(h *api.LinuxDevice) bool { return sameDevice(h, d) }) {
				adj.AddDevice(api.FromOCILinuxDevices([]oci.LinuxDevice{d})[0])
			}
		}
	}
	for _, m := range want.Mounts {
		if !slices.ContainsFunc(ctr.GetMounts(), func(h *api.Mount) bool { return sameMount(h, m) }) {
			adj.AddMount(api.FromOCIMounts([]oci.Mount{m})[0])
		}
	}
	if hooks := missingHooks(want.Hooks, ctr.GetHooks()); hooks != nil {
		adj.AddHooks(hooks)
	}
	return adj, nil
}

// supported refuses edits NRI cannot carry, unless the container already has
// them; silently dropping them would start a container CDI did not describe.
func supported(want *oci.Spec, ctr *api.Container) error {
	for _, m := range want.Mounts {
		if !path.IsAbs(m.Destination) {
			return fmt.Errorf("CDI mount %q -> %q: the container path must be absolute; fix the spec", m.Source, m.Destination)
		}
	}
	if want.Linux != nil {
		for _, d := range want.Linux.Devices {
			if !path.IsAbs(d.Path) {
				return fmt.Errorf("CDI device node %q: the path must be absolute; fix the spec", d.Path)
			}
		}
	}
	if want.Linux != nil && want.Linux.IntelRdt != nil {
		return fmt.Errorf("CDI edit intelRdt cannot be applied through NRI; remove it from the spec or resolve the device with containerd's CDI")
	}
	if want.Linux != nil && len(want.Linux.NetDevices) > 0 {
		return fmt.Errorf("CDI edit netDevices cannot be applied through NRI; remove it from the spec or resolve the device with containerd's CDI")
	}
	if want.Process != nil {
		have := ctr.GetUser().GetAdditionalGids()
		for _, g := range want.Process.User.AdditionalGids {
			if !slices.Contains(have, g) {
				return fmt.Errorf("CDI edit additionalGids %d cannot be applied through NRI; remove it from the spec or resolve the device with containerd's CDI", g)
			}
		}
	}
	return nil
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func sameDevice(h *api.LinuxDevice, d oci.LinuxDevice) bool {
	return h.GetPath() == d.Path && h.GetType() == d.Type && h.GetMajor() == d.Major && h.GetMinor() == d.Minor &&
		eqPtr(h.GetFileMode().Get(), d.FileMode) && eqPtr(h.GetUid().Get(), d.UID) && eqPtr(h.GetGid().Get(), d.GID)
}

func sameMount(h *api.Mount, m oci.Mount) bool {
	return h.GetDestination() == m.Destination && h.GetSource() == m.Source && h.GetType() == m.Type && slices.Equal(h.GetOptions(), m.Options)
}

func eqPtr[T comparable](a, b *T) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// missingHooks returns the hooks of want that have has not, phase by phase.
func missingHooks(want *oci.Hooks, have *api.Hooks) *api.Hooks {
	if want == nil {
		return nil
	}
	w := api.FromOCIHooks(want)
	out := &api.Hooks{
		Prestart:        missing(w.Prestart, have.GetPrestart()),
		CreateRuntime:   missing(w.CreateRuntime, have.GetCreateRuntime()),
		CreateContainer: missing(w.CreateContainer, have.GetCreateContainer()),
		StartContainer:  missing(w.StartContainer, have.GetStartContainer()),
		Poststart:       missing(w.Poststart, have.GetPoststart()),
		Poststop:        missing(w.Poststop, have.GetPoststop()),
	}
	if len(out.Prestart)+len(out.CreateRuntime)+len(out.CreateContainer)+len(out.StartContainer)+len(out.Poststart)+len(out.Poststop) == 0 {
		return nil
	}
	return out
}

func missing(want, have []*api.Hook) []*api.Hook {
	var out []*api.Hook
	for _, h := range want {
		if !slices.ContainsFunc(have, func(x *api.Hook) bool { return sameHook(x, h) }) &&
			!slices.ContainsFunc(out, func(x *api.Hook) bool { return sameHook(x, h) }) {
			out = append(out, h)
		}
	}
	return out
}

func sameHook(a, b *api.Hook) bool {
	return a.GetPath() == b.GetPath() && slices.Equal(a.GetArgs(), b.GetArgs()) && slices.Equal(a.GetEnv(), b.GetEnv()) &&
		eqPtr(a.GetTimeout().Get(), b.GetTimeout().Get())
}
