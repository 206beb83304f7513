package check

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

// shadowOrigin says where a spec that shadows nvinject's comes from.
const shadowOrigin = "such a file is left by an earlier install (helm uninstall and kubectl delete leave the spec a GPU daemon wrote in /var/run/cdi or /etc/cdi) or written by NVIDIA's Container Toolkit (nvidia-ctk cdi generate: /var/run/cdi/nvidia.yaml or /etc/cdi/nvidia.yaml, the same kind " + contract.CDIVendor + "/" + contract.CDIClass + "; where the toolkit's nvidia-cdi-refresh systemd unit rewrites it, disable that unit); containerd rereads its spec dirs on the change, no restart needed"

// maxSpecErrors bounds the malformed spec files named; the rest are counted.
const maxSpecErrors = 2 * contract.MaxListed

// specErrorFindings names each spec file the CDI library refused; it skips
// them and keeps the others, and so does the doctor.
func specErrorFindings(c evidence.CDIEvidence, f *finding) {
	for i, se := range c.Errors {
		if i == maxSpecErrors {
			f.problem(fixCDISpec, "…and %d more CDI spec files that do not load", len(c.Errors)-maxSpecErrors)
			break
		}
		f.problem(fixCDISpec, "CDI spec %s does not load (containerd skips it, the other files still count): %s", se.Path, se.Error)
	}
}

// shadowFindings judges the devices more than one spec file defines: broken
// when containerd takes one of nvinject's devices from another file, or
// from none (two files of one dir define it).
func shadowFindings(c evidence.CDIEvidence, f *finding) {
	if c.Unread != "" {
		return
	}
	if c.RuntimeUnread != "" {
		f.unread("the CDI specs containerd reads", c.RuntimeUnread)
		return
	}
	own := "not among them"
	if slices.ContainsFunc(c.Specs, func(s evidence.SpecFile) bool { return s.Path == c.OwnSpec }) {
		own = "one of them"
	}
	f.fact("containerd reads CDI specs from %v, a later dir's device winning: %d file(s) load; nvinject's spec %s is %s; %d device(s) defined in more than one file", c.RuntimeDirs, len(c.Specs), c.OwnSpec, own, c.ShadowedTotal)
	var remove []string
	listedLost := 0
	for _, d := range c.Shadowed {
		winner := d.Winner
		if winner == "" {
			winner = "none: two files of one dir define it, so the CDI library drops it and the name resolves to no device"
		}
		switch {
		case d.Lost(c.OwnSpec):
			listedLost++
			for _, p := range d.Files {
				if p != c.OwnSpec && !slices.Contains(remove, p) {
					remove = append(remove, p)
				}
			}
			f.problem("", "CDI device %s of nvinject's spec %s is shadowed: defined in %v, containerd takes %s%s", d.Name, c.OwnSpec, d.Files, winner, specNote(c, d.Winner))
		case d.Own && d.Winner != c.OwnSpec:
			f.fact("CDI device %s is defined in %v, containerd takes %s; nvinject hands out no such name, so no pod gets it", d.Name, d.Files, winner)
		case d.Winner == "":
			f.problem(fmt.Sprintf("remove one of %v from the node so %s resolves again; %s", d.Files, d.Name, shadowOrigin), "CDI device %s is defined in %v, containerd takes %s", d.Name, d.Files, winner)
		case d.Own:
			f.fact("CDI device %s is defined in %v; containerd takes nvinject's %s (remove the others at leisure)", d.Name, d.Files, winner)
		default:
			f.fact("CDI device %s is defined in %v, none of them nvinject's; containerd takes %s", d.Name, d.Files, winner)
		}
	}
	if more := c.ShadowedTotal - len(c.Shadowed); more > 0 {
		if lostMore := c.OwnLost - listedLost; lostMore > 0 {
			f.problem("", "…and %d more of nvinject's CDI devices shadowed (%d more shadowed in all)", lostMore, more)
		} else {
			f.fact("…and %d more devices defined in more than one file, none of them one nvinject loses", more)
		}
	}
	if c.OwnLost > 0 {
		f.fix(fmt.Sprintf("remove %s from the node (rm %s), leaving nvinject's %s: %s", contract.List(remove), strings.Join(remove, " "), c.OwnSpec, shadowOrigin))
	}
}

// specNote says what made spec file p, where its annotation tells.
func specNote(c evidence.CDIEvidence, p string) string {
	i := slices.IndexFunc(c.Specs, func(s evidence.SpecFile) bool { return s.Path == p })
	if i < 0 || c.Specs[i].DriverVersion == "" {
		return ""
	}
	return fmt.Sprintf(" (an nvinject spec, of driver %s)", c.Specs[i].DriverVersion)
}

// staleSpecFindings compares the driver nvinject's spec was made from with
// the driver installed: a spec of another driver names files that are gone.
func staleSpecFindings(e evidence.Evidence, f *finding) {
	c := e.CDI
	i := slices.IndexFunc(c.Specs, func(s evidence.SpecFile) bool { return s.Path == c.OwnSpec })
	if i < 0 {
		return
	}
	spec, r := c.Specs[i], e.DriverRoot
	switch {
	case spec.DriverVersion == "":
		f.fact("nvinject's spec %s carries no %s (an older nvinject wrote it): its driver is not compared", spec.Path, contract.DriverVersionAnnotation)
	case r.Unread != "":
		f.unread("the driver installed in "+r.Root, r.Unread)
	case r.Version == "":
		f.fact("driver root %s (%s) holds no NVIDIA driver library, so the spec's driver %s is not compared (pass --driver-root)", r.Root, r.Source, spec.DriverVersion)
	case r.Version != spec.DriverVersion:
		f.problem(fixStaleSpec(e.SpecOwner(), e.Node, r.Version), "nvinject's CDI spec %s was made from driver %s (%s) but driver %s is installed in %s (%s, from %s): its mounts name the old driver's files",
			spec.Path, spec.DriverVersion, contract.DriverVersionAnnotation, r.Version, r.Root, r.File, r.Source)
	default:
		f.fact("nvinject's CDI spec %s was made from driver %s, the one installed in %s (%s)", spec.Path, spec.DriverVersion, r.Root, r.File)
	}
}

// fixStaleSpec tells how daemon d rewrites its spec on node for driver
// version v.
func fixStaleSpec(d evidence.DaemonEvidence, node, v string) string {
	restart := fmt.Sprintf("kubectl -n %s delete pod -l %s=%s --field-selector spec.nodeName=%s", d.Namespace, contract.AppLabel, d.App, node)
	if d.Pod != "" {
		restart = fmt.Sprintf("kubectl -n %s delete pod %s", d.Namespace, d.Pod)
	}
	return fmt.Sprintf("the daemon writes its spec for the driver it finds when it starts, and on a driver change removes it and exits for its DaemonSet to restart it (every --driver-check-interval, 5s by default); if it has not (the check is off, or an older nvinject), restart it (%s) so it writes the spec for driver %s; start no new GPU container on the node until then", restart, v)
}
