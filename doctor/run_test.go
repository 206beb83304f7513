package doctor

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvinject/nvinject/doctor/check"
	"github.com/nvinject/nvinject/shared/contract"
)

const uuid = "GPU-4f1c7a52-9b7e-4c1d-8a3e-000000000001"

// refusedMsg is containerd's default validator refusing a GPU container
// while nvinject-nri is not connected (kubelet's CreateContainerError).
const refusedMsg = `failed to create containerd container: validator "00-default-validator" rejected container adjustment, reason: validation error: required plugin "nvinject" not present`

// nriDialErr is nvinject-nri's last error when containerd's NRI socket is
// not there (its termination message, FallbackToLogsOnError).
var nriDialErr = `level=ERROR msg="nvinject-nri failed" error="connect to NRI socket /var/run/nri/nri.sock: dial unix /var/run/nri/nri.sock: connect: no such file or directory"`

const (
	nodeName   = "nvinject-sim-worker"
	pluginText = `nvinject_device_plugin_registrations_total{result="ok"} 1
nvinject_device_plugin_list_and_watch_streams 1
nvinject_device_plugin_device_healthy{uuid="` + uuid + `",device_id="` + uuid + `"} 1
nvinject_device_plugin_health_events_total{kind="xid",xid="13",ignored="true"} 2
nvinject_device_plugin_allocations_total{result="ok"} 1
`
	nriText  = "nvinject_nri_connected 1\nnvinject_nri_refusals_total{reason=\"unresolvable\"} 0\n"
	cdiSpec  = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: " + uuid + "\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/nvidia0, type: c, major: 195, minor: 0}\n"
	ctrdConf = "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  cdi_spec_dirs = ['CDIDIR']\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n  runtime_type = 'io.containerd.runc.v2'\n"
)

// node is a simulated worker's files, sockets and daemons.
type node struct{ opts Options }

func newNode(t *testing.T) node {
	t.Helper()
	dir := t.TempDir()
	kubelet, cdiDir := filepath.Join(dir, "dp"), filepath.Join(dir, "cdi")
	for _, d := range []string{kubelet, cdiDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{"kubelet.sock", "nvinject-gpu.sock"} {
		l, err := net.Listen("unix", filepath.Join(kubelet, s))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	write := func(p, s string, mode os.FileMode) {
		if err := os.WriteFile(p, []byte(s), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(cdiDir, "nvidia.com-gpu.yaml"), cdiSpec, 0o644)
	conf := filepath.Join(dir, "config.toml")
	write(conf, strings.ReplaceAll(ctrdConf, "CDIDIR", cdiDir), 0o644)
	smiPath := filepath.Join(dir, "nvidia-smi")
	write(smiPath, "#!/bin/sh\necho '0, "+uuid+", NVIDIA A100-SXM4-80GB [SIMULATED], Disabled'\n", 0o755)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/plugin":
			_, _ = w.Write([]byte(pluginText))
		case "/nri":
			_, _ = w.Write([]byte(nriText))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return node{opts: Options{
		KubeletDir: kubelet, CDISpecDirs: []string{cdiDir}, ContainerdConfig: conf, NvidiaSMI: smiPath, PodResourcesSocket: filepath.Join(dir, "pod-resources.sock"),
		DevicePluginMetrics: srv.URL + "/plugin", NRIMetrics: srv.URL + "/nri", HTTPClient: srv.Client(),
	}}
}

func gpuPod(name, node string, phase corev1.PodPhase) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "vllm-demo"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
	if phase == corev1.PodRunning {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "vllm", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	}
	return p
}

func cluster(selected string, extra ...runtime.Object) *fake.Clientset {
	one := resource.MustParse("1")
	objs := []runtime.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}, Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{"nvidia.com/gpu": one}, Allocatable: corev1.ResourceList{"nvidia.com/gpu": one}}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "single-gpu-device-plugin", Namespace: "nvidia-device-plugin"},
			Data: map[string]string{"selected-gpu-uuid": selected}},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "nvidia"}, Handler: "nvidia"},
		gpuPod("vllm-demo-1", nodeName, corev1.PodRunning),
		daemonPod(contract.DevicePluginApp, nil),
		daemonPod(contract.NRIApp, nil),
	}
	return fake.NewClientset(append(objs, extra...)...)
}

// daemonPod is a running daemon pod on the node, or one crash-looping with
// lastMessage as its previous run's termination message.
func daemonPod(app string, lastMessage *string) *corev1.Pod {
	cs := corev1.ContainerStatus{Name: app, Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	if lastMessage != nil {
		cs = corev1.ContainerStatus{Name: app, RestartCount: 4,
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1, Message: *lastMessage}}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: app + "-x1", Namespace: contract.Namespace, Labels: map[string]string{contract.AppLabel: app}},
		Spec:       corev1.PodSpec{NodeName: nodeName},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.5", ContainerStatuses: []corev1.ContainerStatus{cs}},
	}
}

// nriMountFailed is nvinject-nri's pod stuck Pending because kubelet cannot
// mount the node's NRI socket dir, with kubelet's FailedMount event.
const nriMountFailed = `MountVolume.SetUp failed for volume "nri-socket" : hostPath type check failed: /var/run/nri is not a directory`

func nriPending() []runtime.Object {
	p := daemonPod(contract.NRIApp, nil)
	p.Status = corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: "nri",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}}
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: p.Name + ".mount", Namespace: p.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name},
		Type:           corev1.EventTypeWarning, Reason: "FailedMount", Message: nriMountFailed}
	return []runtime.Object{p, ev}
}

// withNRI is cluster(uuid, extra...) with nvinject-nri's pod replaced (nil
// pod: none on the node).
func withNRI(nri []runtime.Object, extra ...runtime.Object) *fake.Clientset {
	c := cluster(uuid, extra...)
	c.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), contract.Namespace, contract.NRIApp+"-x1")
	for _, o := range nri {
		c.Tracker().Add(o)
	}
	return c
}

// refusedGPUPod is a GPU pod containerd refuses fail-closed.
func refusedGPUPod() *corev1.Pod {
	p := gpuPod("vllm-refused", nodeName, corev1.PodPending)
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "vllm",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: refusedMsg}}}}
	return p
}

func TestRun(t *testing.T) {
	pending := gpuPod("second", "", corev1.PodPending)
	pending.Labels = nil
	pending.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
		Message: "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."}}
	mig := "level=ERROR msg=\"nvinject-device-plugin failed\" error=\"GPU 0 GPU-4f1c7a52 has MIG mode on; disable MIG with `nvidia-smi -i 0 -mig 0`\""
	stopped := cluster(uuid)
	stopped.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), contract.Namespace, contract.DevicePluginApp+"-x1")
	stopped.Tracker().Add(daemonPod(contract.DevicePluginApp, &mig))
	zero := resource.MustParse("0")
	n, _ := stopped.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", nodeName)
	n.(*corev1.Node).Status.Allocatable["nvidia.com/gpu"] = zero
	stopped.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, "")
	tests := []struct {
		name      string
		client    *fake.Clientset
		noKube    bool
		remote    bool
		noMetrics bool
		probe     string
		// nriMetrics, when set, is what nvinject-nri's /metrics serves.
		nriMetrics string
		want       map[check.Layer]check.Status
		evidence   map[check.Layer]string
		fix        map[check.Layer]string
		// firstBroken is the first broken layer, the one the table says to
		// fix first; set, the report must have one (exit status 1).
		firstBroken check.Layer
	}{
		{name: "healthy", client: cluster(uuid),
			want: map[check.Layer]check.Status{check.LayerDriver: check.OK, check.LayerRegistration: check.OK, check.LayerHealth: check.OK, check.LayerScheduling: check.OK, check.LayerAllocate: check.OK, check.LayerCDIRuntime: check.OK, check.LayerApplication: check.OK}},
		{name: "GPU taken", client: cluster(uuid, pending),
			want:     map[check.Layer]check.Status{check.LayerScheduling: check.Broken, check.LayerCDIRuntime: check.OK},
			evidence: map[check.Layer]string{check.LayerScheduling: "default/second Pending: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu"}},
		{name: "selected GPU has no CDI device", client: cluster("GPU-ffffffff-0000-0000-0000-000000000000"),
			want:     map[check.Layer]check.Status{check.LayerDriver: check.Broken, check.LayerCDIRuntime: check.Broken},
			evidence: map[check.Layer]string{check.LayerCDIRuntime: "nvidia.com/gpu=GPU-ffffffff-0000-0000-0000-000000000000 resolves to no device"}},
		{name: "device plugin crash-loops on MIG", client: stopped, noMetrics: true,
			want: map[check.Layer]check.Status{check.LayerRegistration: check.Broken, check.LayerHealth: check.Broken},
			evidence: map[check.Layer]string{
				check.LayerRegistration: "waiting=CrashLoopBackOff; last run ended Error (exit code 1): " + mig,
				check.LayerHealth:       "allocatable=0 because nvinject-device-plugin stopped"}},
		{name: "probe: every library loads, CUDA sees no device", client: cluster(uuid),
			probe:    `{"libraries":[{"name":"libcuda.so.1","ok":true}],"calls":[{"call":"cuInit(0)","code":100,"name":"CUDA_ERROR_NO_DEVICE"}],"all_loaded":true}`,
			want:     map[check.Layer]check.Status{check.LayerApplication: check.OK},
			evidence: map[check.Layer]string{check.LayerApplication: "gpu-probe: all 1 driver libraries load; cuInit(0) = 100 CUDA_ERROR_NO_DEVICE"}},
		{name: "probe: a driver library does not load", client: cluster(uuid),
			probe:    `{"libraries":[{"name":"libcuda.so.1","ok":true},{"name":"libnvidia-nvvm.so.4","ok":false,"error":"cannot open shared object file"}],"calls":[],"all_loaded":false}`,
			want:     map[check.Layer]check.Status{check.LayerApplication: check.Broken},
			evidence: map[check.Layer]string{check.LayerApplication: "libnvidia-nvvm.so.4 does not load in the container (driver/user-space compatibility): cannot open shared object file"}},
		{name: "probe: cuInit fails", client: cluster(uuid),
			probe:    `{"libraries":[{"name":"libcuda.so.1","ok":true}],"calls":[{"call":"cuInit(0)","code":803,"name":"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"}],"all_loaded":true}`,
			want:     map[check.Layer]check.Status{check.LayerApplication: check.Broken},
			evidence: map[check.Layer]string{check.LayerApplication: "cuInit(0) = 803 CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"}},
		{name: "probe not in the image", client: cluster(uuid), probe: "-",
			want:     map[check.Layer]check.Status{check.LayerApplication: check.OK},
			evidence: map[check.Layer]string{check.LayerApplication: "no in-container probe"}},
		{name: "nvinject-nri cannot mount the NRI socket dir", client: withNRI(nriPending()),
			want:     map[check.Layer]check.Status{check.LayerInjection: check.Broken},
			evidence: map[check.Layer]string{check.LayerInjection: "nvinject-nri is not running on " + nodeName + ", so containerd refuses every GPU pod there (fail-closed): pod nvidia-device-plugin/nvinject-nri-x1 Pending ready=false restarts=0 waiting=ContainerCreating; event FailedMount: " + nriMountFailed},
			fix:      map[check.Layer]string{check.LayerInjection: "set its hostPath in the nvinject-nri DaemonSet (volume nri-socket in deploy/base/nri-daemonset.yaml"}},
		{name: "nvinject-nri crash-loops", client: withNRI([]runtime.Object{daemonPod(contract.NRIApp, &nriDialErr)}),
			want:     map[check.Layer]check.Status{check.LayerInjection: check.Broken},
			evidence: map[check.Layer]string{check.LayerInjection: "waiting=CrashLoopBackOff; last run ended Error (exit code 1): " + nriDialErr},
			fix:      map[check.Layer]string{check.LayerInjection: "correct what the daemon's last error says"}},
		{name: "nvinject-nri runs, not connected", client: cluster(uuid), nriMetrics: "nvinject_nri_connected 0\n",
			want:     map[check.Layer]check.Status{check.LayerInjection: check.Broken, check.LayerCDIRuntime: check.OK},
			evidence: map[check.Layer]string{check.LayerInjection: "nvinject-nri is not connected to containerd (nvinject_nri_connected 0)"},
			fix:      map[check.Layer]string{check.LayerInjection: "containerd's NRI is enabled"}},
		{name: "nvinject-nri runs and is connected", client: cluster(uuid),
			want:     map[check.Layer]check.Status{check.LayerInjection: check.OK},
			evidence: map[check.Layer]string{check.LayerInjection: "nvinject-nri is connected to containerd's NRI"}},
		{name: "no nvinject-nri pod on the node", client: withNRI(nil),
			want:     map[check.Layer]check.Status{check.LayerInjection: check.Broken},
			evidence: map[check.Layer]string{check.LayerInjection: "no nvinject-nri pod on " + nodeName},
			fix:      map[check.Layer]string{check.LayerInjection: "does not select the node"}},
		{name: "GPU pod refused while nvinject-nri cannot mount", client: withNRI(nriPending(), refusedGPUPod()),
			want: map[check.Layer]check.Status{check.LayerAllocate: check.OK, check.LayerInjection: check.Broken, check.LayerCDIRuntime: check.OK, check.LayerApplication: check.Broken},
			evidence: map[check.Layer]string{
				check.LayerInjection:   "containerd refused default/vllm-refused[vllm] fail-closed: " + strconv.Quote(refusedMsg),
				check.LayerApplication: "default/vllm-refused[vllm] CreateContainerError: refused fail-closed because nvinject-nri is not connected: see the injection layer"},
			fix:         map[check.Layer]string{check.LayerInjection: "volume nri-socket", check.LayerApplication: "fix the injection layer (nvinject-nri) first"},
			firstBroken: check.LayerInjection},
		{name: "node only", noKube: true,
			want: map[check.Layer]check.Status{check.LayerDriver: check.OK, check.LayerRegistration: check.Unknown, check.LayerHealth: check.OK, check.LayerScheduling: check.Unknown, check.LayerAllocate: check.Unknown, check.LayerCDIRuntime: check.Unknown, check.LayerApplication: check.Unknown}},
		{name: "remote", client: cluster(uuid), remote: true,
			want: map[check.Layer]check.Status{check.LayerDriver: check.Unknown, check.LayerRegistration: check.OK, check.LayerHealth: check.OK, check.LayerScheduling: check.OK, check.LayerAllocate: check.OK, check.LayerCDIRuntime: check.Unknown, check.LayerApplication: check.OK}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newNode(t).opts
			o.Node, o.NoKube, o.Remote = nodeName, tt.noKube, tt.remote
			if tt.noMetrics {
				o.DevicePluginMetrics = ""
			}
			if tt.probe != "" {
				o.Exec = func(_ context.Context, _, _, _ string, cmd ...string) (string, error) {
					if tt.probe == "-" {
						return "", errors.New(`exec: "gpu-probe": executable file not found in $PATH`)
					}
					return tt.probe, nil
				}
			}
			if tt.client != nil {
				o.Client = tt.client
			}
			if tt.nriMetrics != "" {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(tt.nriMetrics)) }))
				t.Cleanup(srv.Close)
				o.NRIMetrics = srv.URL
			}
			r, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			for layer, want := range tt.want {
				v, _ := r.Verdict(layer)
				if v.Status != want || !strings.Contains(strings.Join(v.Evidence, "\n"), tt.evidence[layer]) {
					t.Errorf("%s = %s, want %s with %q\n%s", layer, v.Status, want, tt.evidence[layer], strings.Join(v.Evidence, "\n"))
				}
				if !strings.Contains(v.Fix, tt.fix[layer]) || (want == check.Broken && v.Fix == "") {
					t.Errorf("%s fix %q, want it to contain %q", layer, v.Fix, tt.fix[layer])
				}
			}
			if b := r.Broken(); tt.firstBroken != "" && (len(b) == 0 || b[0] != tt.firstBroken) {
				t.Errorf("broken layers %v, want %s first", b, tt.firstBroken)
			}
		})
	}
}

// TestRunExplain: the explain pipeline turns a pod it can read into its
// chain and a pod it cannot read into an error naming it.
func TestRunExplain(t *testing.T) {
	cs := fake.NewClientset(gpuPod("vllm-demo-1", nodeName, corev1.PodRunning))
	r, err := RunExplain(context.Background(), Options{Client: cs, PodNamespace: "default"}, "vllm-demo-1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Explanation.Pod != "default/vllm-demo-1" || len(r.Explanation.Containers) != 1 || r.Explanation.Containers[0].Name != "vllm" || r.Evidence.Node != nodeName {
		t.Errorf("explanation %+v from evidence %+v", r.Explanation, r.Evidence)
	}
	if _, err := RunExplain(context.Background(), Options{Client: cs}, "absent"); err == nil || !strings.Contains(err.Error(), "get pod default/absent") {
		t.Errorf("absent pod: %v", err)
	}
}
