package collect

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/driverroot"
)

// maxShadowed bounds the shadowed devices the evidence lists; the rest are
// counted.
const maxShadowed = 2 * contract.MaxListed

// runtimeDirs are the CDI dirs in the order containerd reads them: its
// cdi_spec_dirs, else dirs (the doctor's, containerd's default).
func runtimeDirs(c evidence.ContainerdEvidence, dirs []string) []string {
	if c.Unread == "" && len(c.CDISpecDirs) > 0 {
		return c.CDISpecDirs
	}
	return dirs
}

// ownSpecPath is where daemon d writes its spec of kind vendor/class: its
// --cdi-spec-dir (default contract.CDISpecDir) and the name
// cdi/spec.FileName gives it.
func ownSpecPath(d evidence.DaemonEvidence, vendor, class string) string {
	dir := d.CDISpecDir
	if dir == "" {
		dir = contract.CDISpecDir
	}
	return filepath.Join(filepath.Clean(dir), cdi.GenerateSpecName(vendor, class)+".yaml")
}

// collectRuntimeSpecs reads every spec file in dirs as containerd's CDI
// library does (the same package, the same scan) into ev: the files that
// loaded and the devices more than one of them defines, with the file the
// library resolves each to. Files that do not load are skipped, as the
// library skips them; collectCDI names them.
func collectRuntimeSpecs(ev *evidence.CDIEvidence, dirs []string, own string) {
	ev.RuntimeDirs, ev.OwnSpec = dirs, own
	for _, d := range dirs {
		if _, err := os.ReadDir(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			ev.RuntimeUnread = fmt.Sprintf("list CDI spec dir %s (run the doctor as root on the worker): %v", d, err)
			return
		}
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		ev.RuntimeUnread = fmt.Sprintf("load CDI specs from %v: %v", dirs, err)
		return
	}
	var specs []*cdi.Spec
	for _, v := range cache.ListVendors() {
		specs = append(specs, cache.GetVendorSpecs(v)...)
	}
	// The library scans dir by dir, each dir's files by name.
	slices.SortFunc(specs, func(a, b *cdi.Spec) int {
		if a.GetPriority() != b.GetPriority() {
			return a.GetPriority() - b.GetPriority()
		}
		return strings.Compare(a.GetPath(), b.GetPath())
	})
	defs := map[string][]string{}
	var names []string
	for _, s := range specs {
		ev.Specs = append(ev.Specs, evidence.SpecFile{Path: s.GetPath(), Priority: s.GetPriority(), Kind: s.Kind,
			Devices: len(s.Devices), DriverVersion: s.Annotations[contract.DriverVersionAnnotation]})
		for _, d := range s.Devices {
			n := s.Kind + "=" + d.Name
			if defs[n] == nil {
				names = append(names, n)
			}
			defs[n] = append(defs[n], s.GetPath())
		}
	}
	var all []evidence.ShadowedDevice
	for _, n := range names {
		if len(defs[n]) < 2 {
			continue
		}
		sd := evidence.ShadowedDevice{Name: n, Files: defs[n], Own: slices.Contains(defs[n], own)}
		// The library's own precedence: the later dir wins, two files of
		// one dir drop the device.
		if d := cache.GetDevice(n); d != nil {
			sd.Winner = d.GetSpec().GetPath()
		}
		if sd.Lost(own) {
			ev.OwnLost++
		}
		all = append(all, sd)
	}
	// The daemon's lost devices first, so the bound never hides them.
	slices.SortStableFunc(all, func(a, b evidence.ShadowedDevice) int {
		switch la, lb := a.Lost(own), b.Lost(own); {
		case la && !lb:
			return -1
		case lb && !la:
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	ev.ShadowedTotal = len(all)
	ev.Shadowed = all[:min(len(all), maxShadowed)]
}

// collectDriverRoot reads the driver installed in the driver root: given
// (--driver-root), else the one daemon d names in its spec, else /.
func collectDriverRoot(given string, d evidence.DaemonEvidence) evidence.DriverRootEvidence {
	ev := evidence.DriverRootEvidence{Root: given, Source: "--driver-root"}
	switch {
	case given != "":
	case d.HostDriverRoot != "":
		ev.Root, ev.Source = d.HostDriverRoot, fmt.Sprintf("pod %s/%s (--host-driver-root, else --driver-root)", d.Namespace, d.Pod)
	default:
		ev.Root, ev.Source = "/", "the default (pass --driver-root)"
	}
	v, ok, err := driverroot.DriverVersion(ev.Root)
	switch {
	case err != nil:
		ev.Unread = fmt.Sprintf("read the driver version in %s: %v", ev.Root, err)
	case ok:
		ev.Version, ev.File = v.Version, v.File
	}
	return ev
}
