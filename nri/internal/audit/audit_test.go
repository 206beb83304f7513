package audit

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/contract"
)

const uuid = "GPU-f600f526-b58e-5106-a700-ac0942c77830"

func TestRecordNote(t *testing.T) {
	pod := Record{Namespace: "default", Pod: "vllm-0", PodUID: "uid-1", Container: "vllm", RuntimeHandler: "nvidia"}
	dp := pod
	dp.Admitted, dp.UUIDs = true, []string{uuid}
	dp.Assigned = Assignment{Asked: true, Resource: contract.ResourceName, Devices: []Devices{{Resource: contract.ResourceName, IDs: []string{uuid}}}}
	dp.Checked, dp.CDI, dp.Devices, dp.Env = true, []string{"nvidia.com/gpu=" + uuid}, []string{"/dev/nvidia0 195:0"}, []string{"NVINJECT_GPU_UUID_0=" + uuid}
	dp.DriverMounts, dp.SpecMounts = 41, 41

	dra := dp
	dra.Assigned = Assignment{Asked: true, Resource: contract.ResourceName, Claims: []string{"default/vllm-0-gpu-x:nvinject-sim-worker/gpu-0"}}

	spoof := pod
	spoof.Reason, spoof.Error = "pod-annotation", "nvinject: pod-level annotations name GPUs"
	spoof.Assigned.NotAsked = "refused before kubelet was asked"

	nothing := pod
	nothing.Reason, nothing.Error = "foreign-gpu", "nvinject: container would get /dev/nvidia1"
	nothing.Assigned = Assignment{Asked: true, Resource: contract.ResourceName}
	nothing.Checked, nothing.Devices = true, []string{"bind mount of /dev/nvidia1 195:1"}

	tests := []struct {
		name   string
		r      Record
		reason string
		note   contract.AuditNote
	}{
		{"device plugin, admitted", dp, contract.EventReasonGPUAdmitted, contract.AuditNote{
			Container: "vllm", Assigned: "nvidia.com/gpu [" + uuid + "]", CDI: "[nvidia.com/gpu=" + uuid + "]",
			Checked: "devices [/dev/nvidia0 195:0] env [NVINJECT_GPU_UUID_0=" + uuid + "] driver mounts 41/41", Verdict: "admitted [" + uuid + "]"}},
		{"DRA, admitted", dra, contract.EventReasonGPUAdmitted, contract.AuditNote{
			Container: "vllm", Assigned: "DRA [default/vllm-0-gpu-x:nvinject-sim-worker/gpu-0]", CDI: "[nvidia.com/gpu=" + uuid + "]",
			Checked: "devices [/dev/nvidia0 195:0] env [NVINJECT_GPU_UUID_0=" + uuid + "] driver mounts 41/41", Verdict: "admitted [" + uuid + "]"}},
		{"refused before the check", spoof, contract.EventReasonGPURefused, contract.AuditNote{
			Container: "vllm", Assigned: "not asked (refused before kubelet was asked)", CDI: "none", Checked: "not reached",
			Verdict: "refused pod-annotation: nvinject: pod-level annotations name GPUs"}},
		{"a GPU kubelet did not assign", nothing, contract.EventReasonGPURefused, contract.AuditNote{
			Container: "vllm", Assigned: "nothing (no nvidia.com/gpu, no gpu.nvinject.io claim)", CDI: "none", Checked: "devices [bind mount of /dev/nvidia1 195:1] env []",
			Verdict: "refused foreign-gpu: nvinject: container would get /dev/nvidia1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r.Bounded()
			if got := r.Note(); got != tc.note {
				t.Errorf("note\n%+v\nwant\n%+v", got, tc.note)
			}
			if r.EventReason() != tc.reason || (r.EventType() == "Normal") != r.Admitted {
				t.Errorf("event %s %s, want %s", r.EventType(), r.EventReason(), tc.reason)
			}
			got, err := contract.ParseAuditNote(r.Note().String())
			if err != nil || got != tc.note {
				t.Errorf("note does not parse back: %+v, %v", got, err)
			}
			attrs := attrMap(r.LogAttrs())
			for _, k := range []string{"pod", "container", "runtime_handler", "assigned", "cdi_devices"} {
				if _, ok := attrs[k]; !ok {
					t.Errorf("log attributes lack %s: %v", k, attrs)
				}
			}
			if _, ok := attrs["uuids"]; ok != r.Admitted {
				t.Errorf("uuids logged %v, admitted %v", ok, r.Admitted)
			}
			if _, ok := attrs["reason"]; ok == r.Admitted {
				t.Errorf("reason logged %v, admitted %v", ok, r.Admitted)
			}
		})
	}
}

// TestRecordBounded: a pod can ask for anything (any number of CDI names of
// any length, a 1 MiB annotation in the refusal): the log attributes and
// the note stay within fixed bounds and count what they leave out.
func TestRecordBounded(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	many := make([]string, 5000)
	for i := range many {
		many[i] = fmt.Sprintf("nvidia.com/gpu=GPU-%d-%s", i, strings.Repeat("a", i%300))
	}
	r := Record{Namespace: huge, Pod: huge, PodUID: huge, Container: huge, RuntimeHandler: huge, Reason: huge, Error: huge,
		Assigned: Assignment{Asked: true, Resource: huge, Devices: slices.Repeat([]Devices{{Resource: huge, IDs: many}}, 100), Claims: many},
		CDI:      many, Devices: many, Env: many, UUIDs: many, DriverMounts: 1 << 30, SpecMounts: 1 << 30}
	for _, admitted := range []bool{true, false} {
		r.Admitted = admitted
		b := r.Bounded()
		size := 0
		for _, v := range b.LogAttrs() {
			size += len(fmt.Sprint(v))
		}
		// 6 lists and maxResources resources' IDs of MaxItems+1 entries, 8
		// strings and the resources' names, the error.
		if max := (6+maxResources)*(MaxItems+1)*(MaxItem+1) + (8+maxResources)*2*MaxItem + contract.MaxError + 200; size > max {
			t.Errorf("log attributes are %d bytes, over %d", size, max)
		}
		if got := b.CDI[len(b.CDI)-1]; len(b.CDI) != MaxItems+1 || got != "…and 4992 more" {
			t.Errorf("CDI list of %d ends %q, want %d names and the rest counted", len(b.CDI), got, MaxItems)
		}
		if len(b.Assigned.Devices) != maxResources {
			t.Errorf("%d resources kept of 100, want %d", len(b.Assigned.Devices), maxResources)
		}
		note := b.Note().String()
		if len(note) > contract.MaxAuditNote {
			t.Errorf("note is %d bytes", len(note))
		}
		if _, err := contract.ParseAuditNote(note); err != nil {
			t.Error(err)
		}
	}
}

func attrMap(a []any) map[string]any {
	m := map[string]any{}
	for i := 0; i+1 < len(a); i += 2 {
		m[a[i].(string)] = a[i+1]
	}
	return m
}
