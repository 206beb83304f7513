package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvinject/nvinject/shared/contract"
)

const (
	a100   = "NVIDIA-A100-SXM4-80GB"
	h100   = "NVIDIA H100 80GB HBM3"
	driver = "535.261.03"
)

func dpNode(name string, capacity, allocatable int64) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			contract.GFDLabelPresent: "true", contract.GFDLabelProduct: a100, contract.GFDLabelDriverVersion: driver}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{contract.ResourceName: *resource.NewQuantity(capacity, resource.DecimalSI), corev1.ResourceCPU: resource.MustParse("64")},
			Allocatable: corev1.ResourceList{contract.ResourceName: *resource.NewQuantity(allocatable, resource.DecimalSI), corev1.ResourceCPU: resource.MustParse("63")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
}

// draNode has no GFD product label: the row's model comes from the slice.
func draNode(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{contract.DRAModeLabel: contract.DRAModeDRA, contract.GFDLabelDriverVersion: driver}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
}

// slice is nvinject-dra's slice for node with n GPUs; taint taints the
// devices it names.
func slice(node string, n int, version string, taint ...string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-" + contract.DRADriver + "-x"},
		Spec: resourceapi.ResourceSliceSpec{Driver: contract.DRADriver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}}}
	for i := range n {
		product, ver := h100, version
		d := resourceapi.Device{Name: contract.DRADeviceName(i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			contract.DRAAttrProductName: {StringValue: &product}, contract.DRAAttrDriverVersion: {VersionValue: &ver}}}
		if slices.Contains(taint, d.Name) {
			d.Taints = []resourceapi.DeviceTaint{{Key: contract.DRATaintKey, Value: "xid", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		}
		s.Spec.Devices = append(s.Spec.Devices, d)
	}
	return s
}

func daemon(app, node string, ready bool) *corev1.Pod {
	status := corev1.ConditionTrue
	cs := corev1.ContainerStatus{Name: app, Ready: ready, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	if !ready {
		status = corev1.ConditionFalse
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: app + "-" + node, Namespace: contract.Namespace, Labels: map[string]string{contract.AppLabel: app},
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: app,
			Ports: []corev1.ContainerPort{{Name: metricsPortName, ContainerPort: int32(defaultPorts[app])}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}},
			ContainerStatuses: []corev1.ContainerStatus{cs}},
	}
}

// fakeProber answers readyz from a table, recording what it was asked.
type fakeProber struct {
	mu      sync.Mutex
	answers map[string]string // pod → body
	asked   []string
}

func (f *fakeProber) Readyz(_ context.Context, ns, pod string, port int) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, ns+"/"+pod+":"+strconv.Itoa(port))
	if b, ok := f.answers[pod]; ok {
		return b, nil
	}
	return "", errors.New("error trying to reach service: dial tcp 10.0.0.9:9481: connect: connection refused")
}

func TestRows(t *testing.T) {
	const n = "gpu-1"
	cordoned := dpNode(n, 8, 0)
	cordoned.Spec.Unschedulable = true
	cordoned.Annotations = map[string]string{contract.MoveFailedAnnotation: "wait: nvinject-dra did not publish node gpu-1's GPUs within 5m0s\nsecond line"}
	notReady := dpNode(n, 8, 8)
	notReady.Status.Conditions[0] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown", Message: "Kubelet stopped posting node status."}
	crashing := daemon(contract.DevicePluginApp, n, false)
	crashing.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s"}}
	upgraded := draNode(n)
	upgraded.Labels[contract.GFDLabelDriverVersion] = "550.54.15"
	tests := []struct {
		name    string
		objs    []runtime.Object
		readyz  map[string]string
		want    Row
		reason  []string // substrings of the reason
		asked   []string // readyz requests expected
		fixWant string
	}{
		{name: "healthy device-plugin node",
			objs: []runtime.Object{dpNode(n, 8, 8), daemon(contract.DevicePluginApp, n, true), daemon(contract.NRIApp, n, true)},
			want: Row{Node: n, Mode: contract.DRAModeDevicePlugin, Model: a100, Published: 8, Healthy: 8, Driver: driver, Status: StatusOK}},
		{name: "healthy DRA node, slice version in semver form",
			objs: []runtime.Object{draNode(n), slice(n, 2, "535.261.3"), daemon(contract.DRAApp, n, true), daemon(contract.NRIApp, n, true)},
			want: Row{Node: n, Mode: contract.DRAModeDRA, Model: h100, Published: 2, Healthy: 2, Driver: driver, Status: StatusOK}},
		{name: "device-plugin node with one unhealthy GPU",
			objs:   []runtime.Object{dpNode(n, 8, 7), daemon(contract.DevicePluginApp, n, true), daemon(contract.NRIApp, n, true)},
			want:   Row{Node: n, Mode: contract.DRAModeDevicePlugin, Model: a100, Published: 8, Healthy: 7, Driver: driver, Status: StatusBroken, Layer: LayerHealth},
			reason: []string{"1 of 8 GPUs unhealthy", "allocatable below capacity"}, fixWant: "nvinject-doctor --node-name gpu-1"},
		{name: "DRA node with a tainted device",
			objs:   []runtime.Object{draNode(n), slice(n, 4, "535.261.3", "gpu-2"), daemon(contract.DRAApp, n, true), daemon(contract.NRIApp, n, true)},
			want:   Row{Node: n, Mode: contract.DRAModeDRA, Model: h100, Published: 4, Healthy: 3, Driver: driver, Status: StatusBroken, Layer: LayerHealth},
			reason: []string{"1 of 4 GPUs unhealthy", "taint"}},
		{name: "both daemons on a device-plugin node",
			objs:   []runtime.Object{dpNode(n, 8, 8), daemon(contract.DevicePluginApp, n, true), daemon(contract.DRAApp, n, true), daemon(contract.NRIApp, n, true)},
			want:   Row{Node: n, Mode: contract.DRAModeDevicePlugin, Model: a100, Published: 8, Healthy: 8, Driver: driver, Status: StatusBroken, Layer: LayerOwner},
			reason: []string{"nvinject-dra pod nvinject-dra-gpu-1 runs on this device-plugin node too"}, fixWant: "nvinject-move move gpu-1 --to=device-plugin"},
		{name: "owner not Ready: its readyz says why",
			objs:   []runtime.Object{dpNode(n, 8, 0), crashing, daemon(contract.NRIApp, n, true)},
			readyz: map[string]string{crashing.Name: "not ready: NVML: Driver Not Loaded; retrying every 10s\nsecond line\n"},
			want:   Row{Node: n, Mode: contract.DRAModeDevicePlugin, Model: a100, Published: 8, Healthy: 0, Driver: driver, Status: StatusBroken, Layer: LayerOwner},
			reason: []string{"single-gpu-device-plugin pod single-gpu-device-plugin-gpu-1 not Ready: readyz: not ready: NVML: Driver Not Loaded; retrying every 10s"},
			asked:  []string{contract.Namespace + "/" + crashing.Name + ":9481"}, fixWant: "kubectl -n nvidia-device-plugin logs single-gpu-device-plugin-gpu-1"},
		{name: "nvinject-nri not Ready, readyz unreachable: kubelet's words",
			objs:   []runtime.Object{draNode(n), slice(n, 1, "535.261.3"), daemon(contract.DRAApp, n, true), daemon(contract.NRIApp, n, false)},
			want:   Row{Node: n, Mode: contract.DRAModeDRA, Model: h100, Published: 1, Healthy: 1, Driver: driver, Status: StatusBroken, Layer: LayerNRI},
			reason: []string{"nvinject-nri pod nvinject-nri-gpu-1 not Ready: Running, container nvinject-nri running, not ready", "readyz unreadable: error trying to reach service"},
			asked:  []string{contract.Namespace + "/nvinject-nri-gpu-1:9482"}},
		{name: "no nvinject-nri on the node",
			objs:   []runtime.Object{dpNode(n, 8, 8), daemon(contract.DevicePluginApp, n, true)},
			want:   Row{Node: n, Mode: contract.DRAModeDevicePlugin, Model: a100, Published: 8, Healthy: 8, Driver: driver, Status: StatusBroken, Layer: LayerNRI},
			reason: []string{"no nvinject-nri pod on the node"}, fixWant: "get ds nvinject-nri"},
		{name: "left cordoned by a failed move",
			objs:   []runtime.Object{cordoned, daemon(contract.DevicePluginApp, n, true), daemon(contract.NRIApp, n, true)},
			want:   Row{Node: n, Mode: contract.DRAModeDevicePlugin, Model: a100, Published: 8, Healthy: 0, Driver: driver, Status: StatusBroken, Layer: LayerNode},
			reason: []string{"cordoned by a failed nvinject-move: wait: nvinject-dra did not publish"}, fixWant: "kubectl annotate node gpu-1 nvinject.io/move-failed-"},
		{name: "node NotReady",
			objs:   []runtime.Object{notReady, daemon(contract.DevicePluginApp, n, true), daemon(contract.NRIApp, n, true)},
			want:   Row{Node: n, Mode: contract.DRAModeDevicePlugin, Model: a100, Published: 8, Healthy: 8, Driver: driver, Status: StatusBroken, Layer: LayerNode},
			reason: []string{"NotReady: Ready=Unknown NodeStatusUnknown: Kubelet stopped posting node status."}},
		{name: "DRA node without devices",
			objs:   []runtime.Object{draNode(n), slice(n, 0, ""), daemon(contract.DRAApp, n, true), daemon(contract.NRIApp, n, true)},
			want:   Row{Node: n, Mode: contract.DRAModeDRA, Driver: driver, Status: StatusBroken, Layer: LayerPublished},
			reason: []string{"no device in gpu.nvinject.io's ResourceSlices"}},
		{name: "driver label and slices disagree",
			objs:   []runtime.Object{upgraded, slice(n, 2, "535.261.3"), daemon(contract.DRAApp, n, true), daemon(contract.NRIApp, n, true)},
			want:   Row{Node: n, Mode: contract.DRAModeDRA, Model: h100, Published: 2, Healthy: 2, Driver: "550.54.15,535.261.3", Status: StatusBroken, Layer: LayerDriver},
			reason: []string{"label nvidia.com/cuda.driver-version.full says 550.54.15, ResourceSlice gpu-1-gpu.nvinject.io-x device gpu-0 says 535.261.3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pr := &fakeProber{answers: tt.readyz}
			rows, err := Rows(context.Background(), fake.NewClientset(tt.objs...), Options{Prober: pr})
			if err != nil || len(rows) != 1 {
				t.Fatalf("Rows = %+v, %v; want one row", rows, err)
			}
			got := rows[0]
			reason, fix := got.Reason, got.Fix
			got.Reason, got.Fix = "", ""
			if got != tt.want {
				t.Errorf("row = %+v\nwant  %+v", got, tt.want)
			}
			if (tt.want.Status == StatusBroken) != (reason != "" && fix != "") {
				t.Errorf("reason %q fix %q for a %s row", reason, fix, tt.want.Status)
			}
			for _, s := range tt.reason {
				if !strings.Contains(reason, s) {
					t.Errorf("reason %q lacks %q", reason, s)
				}
			}
			if strings.Contains(reason, "second line") {
				t.Errorf("reason %q quotes more than the first line", reason)
			}
			if !strings.Contains(fix, tt.fixWant) {
				t.Errorf("fix %q lacks %q", fix, tt.fixWant)
			}
			if !slices.Equal(pr.asked, tt.asked) {
				t.Errorf("readyz asked %q, want %q", pr.asked, tt.asked)
			}
		})
	}
}

func TestRowsFleet(t *testing.T) {
	cpu := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-1"}}
	b := dpNode("b-gpu", 8, 8)
	b.Labels["pool"] = "train"
	a := dpNode("a-gpu", 4, 4)
	a.Labels["pool"] = "train"
	c := draNode("c-gpu")
	delete(c.Labels, contract.GFDLabelDriverVersion) // found by its slice alone
	old := daemon(contract.DevicePluginApp, "b-gpu", false)
	old.Name, old.CreationTimestamp = "old", metav1.NewTime(time.Unix(0, 0))
	objs := []runtime.Object{cpu, b, a, c, slice("c-gpu", 1, "535.261.3"), old,
		daemon(contract.DevicePluginApp, "a-gpu", true), daemon(contract.NRIApp, "a-gpu", true),
		daemon(contract.DevicePluginApp, "b-gpu", true), daemon(contract.NRIApp, "b-gpu", true),
		daemon(contract.DRAApp, "c-gpu", true), daemon(contract.NRIApp, "c-gpu", true)}
	cs := fake.NewClientset(objs...)
	rows, err := Rows(context.Background(), cs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rows {
		names = append(names, r.Node+"="+r.Status)
	}
	// The CPU node is left out; b-gpu's newest device-plugin pod counts.
	if want := []string{"a-gpu=ok", "b-gpu=ok", "c-gpu=ok"}; !slices.Equal(names, want) {
		t.Errorf("rows %q, want %q", names, want)
	}
	if Broken(rows) {
		t.Error("Broken = true for an all-ok fleet")
	}
	rows, err = Rows(context.Background(), cs, Options{Selector: "pool=train"})
	if err != nil || len(rows) != 2 || rows[0].Node != "a-gpu" {
		t.Errorf("--selector pool=train: %+v, %v", rows, err)
	}
}

func TestWrite(t *testing.T) {
	rows := []Row{
		{Node: "a", Mode: "dra", Model: h100, Published: 2, Healthy: 2, Driver: driver, Status: StatusOK},
		{Node: "b", Mode: "device-plugin", Published: 8, Healthy: 7, Status: StatusBroken, Layer: LayerHealth, Reason: "1 of 8 GPUs unhealthy", Fix: "nvinject-doctor --node-name b"},
	}
	var out bytes.Buffer
	if err := WriteTable(&out, rows); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NODE  MODE", "b     device-plugin  -", "8/7", "broken  health: 1 of 8 GPUs unhealthy", "fix: nvinject-doctor --node-name b", "2 GPU nodes: 1 ok, 1 broken"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := WriteJSON(&out, rows); err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || len(got) != 2 {
		t.Fatalf("json %s: %v", out.String(), err)
	}
	for _, k := range []string{"node", "mode", "model", "gpusPublished", "gpusHealthy", "driver", "status", "layer", "reason", "fix"} {
		if _, ok := got[1][k]; !ok {
			t.Errorf("broken row lacks %q: %v", k, got[1])
		}
	}
	if _, ok := got[0]["layer"]; ok {
		t.Errorf("ok row has a layer: %v", got[0])
	}
	out.Reset()
	if err := WriteJSON(&out, nil); err != nil || strings.TrimSpace(out.String()) != "[]" {
		t.Errorf("no rows: %q, %v", out.String(), err)
	}
}

func TestFirstLineBounds(t *testing.T) {
	long := "\n  " + strings.Repeat("é", 150) + "\nnext"
	got := firstLine(long)
	if len(got) > maxQuoted+len("…") || !strings.HasSuffix(got, "…") || strings.Contains(got, "next") || !strings.HasPrefix(got, "é") {
		t.Errorf("firstLine = %q (%d bytes)", got, len(got))
	}
	if !strings.HasSuffix(strings.TrimSuffix(got, "…"), "é") {
		t.Errorf("cut inside a character: %q", got)
	}
}
