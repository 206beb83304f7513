// Package audit is nvinject-nri's record of one verdict on a GPU container:
// whom kubelet assigned what, the CDI names, what the final container was
// found to have, and the verdict. It is bounded whatever the pod asks for,
// and renders as the verdict's log attributes and as an audit Event's note
// (contract.AuditNote).
package audit

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nvinject/nvinject/shared/contract"
)

// Bounds of a record: lists keep MaxItems entries (the rest counted), each
// cut to MaxItem bytes.
const (
	MaxItems = 8
	MaxItem  = 96
)

// Record is one verdict. The plugin fills it while it checks; Bounded cuts
// it before it is logged or queued.
type Record struct {
	Namespace, Pod, PodUID, Container, RuntimeHandler string

	Admitted bool
	// Reason and Error say why a container was refused.
	Reason, Error string

	Assigned Assignment
	// CDI are the container's CDI device names.
	CDI []string
	// Checked: the container's GPUs were checked, and Devices are the
	// ways it reaches a GPU (device nodes, bind mounts of /dev/nvidiaN,
	// device cgroup rules), Env its NVINJECT_GPU_UUID_* variables.
	Checked      bool
	Devices, Env []string
	// DriverMounts of the CDI spec's SpecMounts are in the final container.
	DriverMounts, SpecMounts int
	// UUIDs are the GPUs admitted.
	UUIDs []string
	// Admin: admitted through a claim with admin access; Beside are the
	// pods holding those GPUs then.
	Admin  bool
	Beside []string
}

// Assignment is what kubelet's PodResources assigned the container.
type Assignment struct {
	// Asked: kubelet was asked; NotAsked says why not.
	Asked    bool
	NotAsked string
	// Resource is the device plugin's GPU resource (named when nothing
	// was assigned); Devices its IDs by resource as kubelet assigned them
	// (nvidia.com/gpu, nvidia.com/mig-1g.10gb); Claims DRA's, as
	// "namespace/claim:pool/device".
	Resource string
	Devices  []Devices
	Claims   []string
}

// maxResources bounds the resources of one assignment a record keeps (a
// GPU and two MIG profiles); their IDs are bounded like a list.
const maxResources = 3

// Devices are the device-plugin IDs of one resource.
type Devices struct {
	Resource string
	IDs      []string
}

// Bounded returns r with every list and string within the package's bounds.
// A list already within them is shared, not copied (the request path makes
// a record per GPU container): its owner must not change it afterwards.
func (r Record) Bounded() Record {
	for _, s := range []*string{&r.Namespace, &r.Pod, &r.PodUID, &r.Container, &r.RuntimeHandler, &r.Reason, &r.Assigned.NotAsked, &r.Assigned.Resource} {
		*s = contract.Cut(*s, 2*MaxItem)
	}
	r.Error = contract.Cut(r.Error, contract.MaxError)
	for _, l := range []*[]string{&r.CDI, &r.Devices, &r.Env, &r.UUIDs, &r.Beside, &r.Assigned.Claims} {
		*l = bound(*l)
	}
	// A container asks for a few resources; more are cut like a list's items.
	if devs := r.Assigned.Devices; len(devs) > 0 {
		out := make([]Devices, 0, min(len(devs), maxResources))
		for _, d := range devs[:min(len(devs), maxResources)] {
			out = append(out, Devices{Resource: contract.Cut(d.Resource, 2*MaxItem), IDs: bound(d.IDs)})
		}
		r.Assigned.Devices = out
	}
	return r
}

// bound keeps MaxItems items of l, each cut to MaxItem bytes, and one more
// counting the rest.
func bound(l []string) []string {
	if len(l) <= MaxItems && !slices.ContainsFunc(l, func(s string) bool { return len(s) > MaxItem }) {
		return l
	}
	out := make([]string, 0, min(len(l), MaxItems+1))
	for i, s := range l {
		if i == MaxItems {
			out = append(out, fmt.Sprintf("…and %d more", len(l)-MaxItems))
			break
		}
		out = append(out, contract.Cut(s, MaxItem))
	}
	return out
}

// LogAttrs are the verdict's log line attributes: the keys nvinject-nri
// has always logged (pod, container, runtime_handler, uuids or reason and
// error) and the rest of the record.
func (r Record) LogAttrs() []any {
	a := []any{"pod", r.Namespace + "/" + r.Pod, "container", r.Container, "runtime_handler", r.RuntimeHandler, "pod_uid", r.PodUID}
	if r.Admitted {
		a = append(a, "uuids", r.UUIDs)
		if r.Admin {
			a = append(a, "admin_access", true, "beside", r.Beside)
		}
	} else {
		a = append(a, "reason", r.Reason, "error", r.Error)
	}
	a = append(a, "assigned", r.Assigned.String(), "cdi_devices", r.CDI, "checked_devices", r.Devices, "checked_env", r.Env)
	if r.SpecMounts > 0 {
		a = append(a, "driver_mounts", r.mounts())
	}
	return a
}

// Note is the record as an audit Event's message.
func (r Record) Note() contract.AuditNote {
	checked := "devices " + list(r.Devices) + " env " + list(r.Env)
	if r.SpecMounts > 0 {
		checked += " driver mounts " + r.mounts()
	}
	if !r.Checked {
		checked = "not reached"
	}
	verdict := "admitted " + list(r.UUIDs)
	switch {
	case r.Admin && len(r.Beside) == 0:
		verdict += " with admin access beside no other pod"
	case r.Admin:
		verdict += " with admin access beside " + list(r.Beside)
	}
	if !r.Admitted {
		verdict = "refused " + r.Reason + ": " + r.Error
	}
	cdi := list(r.CDI)
	if len(r.CDI) == 0 {
		cdi = "none"
	}
	return contract.AuditNote{Container: r.Container, Assigned: r.Assigned.String(), CDI: cdi, Checked: checked, Verdict: verdict}
}

// EventType and EventReason classify the record's Event.
func (r Record) EventType() string {
	if r.Admitted {
		return "Normal"
	}
	return "Warning"
}

// EventReason is contract.EventReasonGPUAdmitted or EventReasonGPURefused.
func (r Record) EventReason() string {
	if r.Admitted {
		return contract.EventReasonGPUAdmitted
	}
	return contract.EventReasonGPURefused
}

func (r Record) mounts() string { return fmt.Sprintf("%d/%d", r.DriverMounts, r.SpecMounts) }

// String says what kubelet assigned, or why it was not asked.
func (a Assignment) String() string {
	if !a.Asked {
		return "not asked (" + a.NotAsked + ")"
	}
	var parts []string
	for _, d := range a.Devices {
		parts = append(parts, d.Resource+" "+list(d.IDs))
	}
	if len(a.Claims) > 0 {
		parts = append(parts, "DRA "+list(a.Claims))
	}
	if len(parts) == 0 {
		return "nothing (no " + a.Resource + ", no " + contract.DRADriver + " claim)"
	}
	return strings.Join(parts, " and ")
}

func list(l []string) string { return "[" + strings.Join(l, " ") + "]" }
