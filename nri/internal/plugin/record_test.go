package plugin_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/audit"
	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/shared/contract"
)

// auditor collects the records the handler hands it.
type auditor struct {
	mu   sync.Mutex
	recs []audit.Record
}

func (a *auditor) Record(r audit.Record) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.recs = append(a.recs, r)
}

func (a *auditor) take() []audit.Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.recs
	a.recs = nil
	return out
}

// TestVerdictRecords: every final verdict on a GPU container, admitted or
// refused in CreateContainer or in the check of the final container, gives
// exactly one record and one log line saying the same; a container without
// GPUs that passes gives none.
func TestVerdictRecords(t *testing.T) {
	k := &kubelet{}
	a := &auditor{}
	logs := &nritest.LogBuffer{}
	e := start(t, envOpts{kubelet: serveKubelet(t, k), handlerOpts: []plugin.Option{
		plugin.WithAuditor(a), plugin.WithLogger(slog.New(slog.NewJSONHandler(logs, nil)))}})
	n := e.node
	u1, u2, u3 := n.Devices[1].UUID, n.Devices[2].UUID, n.Devices[3].UUID
	// kubelet lists every pod at once: each holds its own GPU.
	k.assign("pod-dp", "main", u1)
	k.assign("pod-mismatch", "main", u2)
	k.claim("pod-dra", "main", n.Name(3))
	gpu1 := []string{"/dev/nvidia1 195:1"}
	env1 := []string{contract.EnvUUIDPrefix + "1=" + u1}
	tests := []struct {
		name          string
		pod           *api.PodSandbox
		ann           map[string]string
		containerdCDI []string
		cri           []string
		want          *audit.Record // nil: no record
	}{
		{name: "device plugin, admitted", pod: nritest.Pod("dp", "nvidia", nil), containerdCDI: []string{n.Name(1)}, cri: []string{n.Name(1)},
			want: &audit.Record{Admitted: true, Checked: true, UUIDs: []string{u1}, CDI: []string{n.Name(1)}, Devices: gpu1, Env: env1,
				Assigned: audit.Assignment{Asked: true, Resource: contract.ResourceName, Devices: []audit.Devices{{Resource: contract.ResourceName, IDs: []string{u1}}}}}},
		{name: "DRA, containerd applied the claim's CDI name", pod: nritest.Pod("dra", "nvidia", nil), containerdCDI: []string{n.Name(3)},
			want: &audit.Record{Admitted: true, Checked: true, UUIDs: []string{u3}, CDI: []string{n.Name(3)}, Devices: []string{"/dev/nvidia3 195:3"},
				Env:      []string{contract.EnvUUIDPrefix + "3=" + u3},
				Assigned: audit.Assignment{Asked: true, Resource: contract.ResourceName, Claims: []string{"default/gpu-pod-dra:node/gpu-1"}}}},
		{name: "kubelet assigned another GPU: refused by the final check", pod: nritest.Pod("mismatch", "nvidia", nil),
			containerdCDI: []string{n.Name(1)}, cri: []string{n.Name(1)},
			want: &audit.Record{Reason: "podresources-mismatch", Checked: true, CDI: []string{n.Name(1)}, Devices: gpu1, Env: env1,
				Assigned: audit.Assignment{Asked: true, Resource: contract.ResourceName, Devices: []audit.Devices{{Resource: contract.ResourceName, IDs: []string{u2}}}}}},
		{name: "pod-level spoof: refused in CreateContainer", pod: nritest.Pod("spoof", "nvidia", map[string]string{"cdi.k8s.io/x": n.Name(3)}),
			want: &audit.Record{Reason: plugin.ReasonPodLevel, Assigned: audit.Assignment{NotAsked: "the verdict came before kubelet was asked"}}},
		{name: "no GPU, admitted: no record", pod: nritest.Pod("plain", "nvidia", nil)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logs.Take()
			_, _, err := e.create(t, tc.pod, tc.ann, tc.containerdCDI, tc.cri...)
			e.remove(t, tc.pod)
			recs := a.take()
			if tc.want == nil {
				if err != nil || len(recs) > 0 {
					t.Fatalf("err %v, records %+v; want admitted without a record", err, recs)
				}
				return
			}
			if (err == nil) != tc.want.Admitted || len(recs) != 1 {
				t.Fatalf("err %v, %d records; want admitted %v and one record", err, len(recs), tc.want.Admitted)
			}
			got := recs[0]
			if got.Namespace != "default" || got.Pod != tc.pod.GetName() || got.PodUID != tc.pod.GetUid() || got.Container != "main" || got.RuntimeHandler != "nvidia" {
				t.Errorf("record names %s/%s uid %s container %s handler %s", got.Namespace, got.Pod, got.PodUID, got.Container, got.RuntimeHandler)
			}
			if got.Admitted != tc.want.Admitted || got.Reason != tc.want.Reason || got.Checked != tc.want.Checked || !slices.Equal(got.UUIDs, tc.want.UUIDs) ||
				!slices.Equal(got.CDI, tc.want.CDI) || !slices.Equal(got.Devices, tc.want.Devices) || !slices.Equal(got.Env, tc.want.Env) ||
				fmt.Sprint(got.Assigned) != fmt.Sprint(tc.want.Assigned) {
				t.Errorf("record\n%+v\nwant\n%+v", got, *tc.want)
			}
			if tc.want.Admitted && (got.SpecMounts == 0 || got.DriverMounts != got.SpecMounts) {
				t.Errorf("driver mounts %d/%d, want all of the spec's", got.DriverMounts, got.SpecMounts)
			}
			if !tc.want.Admitted && !strings.Contains(got.Error, "nvinject:") {
				t.Errorf("refusal record error %q", got.Error)
			}
			checkVerdictLine(t, logs.Take(), got)
		})
	}
}

// checkVerdictLine: the verdict is one log line carrying the record.
func checkVerdictLine(t *testing.T, out string, r audit.Record) {
	t.Helper()
	msg := map[bool]string{true: "injected GPUs", false: "refused container"}[r.Admitted]
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err == nil && (m["msg"] == "injected GPUs" || m["msg"] == "refused container") {
			lines = append(lines, m)
		}
	}
	if len(lines) != 1 || lines[0]["msg"] != msg {
		t.Fatalf("verdict lines %v, want one %q", lines, msg)
	}
	l := lines[0]
	if l["pod"] != r.Namespace+"/"+r.Pod || l["assigned"] != r.Assigned.String() || l["pod_uid"] != r.PodUID {
		t.Errorf("verdict line %v does not carry the record %+v", l, r)
	}
}
