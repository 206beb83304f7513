package doctor

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvinject/nvinject/doctor/check"
	"github.com/nvinject/nvinject/shared/contract"
)

const (
	claimName = "vllm-demo-1-gpu-x7k2p"
	draText   = `nvinject_dra_registered 1
nvinject_dra_prepared_claims 1
nvinject_dra_health_streams 1
nvinject_dra_device_healthy{uuid="` + uuid + `",device="gpu-0"} 1
`
)

// draWorld is a DRA-mode node's API objects, each test changing what it
// breaks before the fake is built.
type draWorld struct {
	node    *corev1.Node
	slice   *resourceapi.ResourceSlice
	class   *resourceapi.DeviceClass
	claim   *resourceapi.ResourceClaim
	pod     *corev1.Pod
	daemons []*corev1.Pod
	extra   []runtime.Object
}

func newDRAWorld() *draWorld {
	node, ext := nodeName, contract.ResourceName
	uuidAttr := uuid
	pod := gpuPod("vllm-demo-1", nodeName, corev1.PodRunning)
	pod.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: claimName,
		RequestMappings: []corev1.ContainerExtendedResourceRequest{{ContainerName: "vllm", ResourceName: contract.ResourceName, RequestName: "container-0-request-0"}}}
	pod.Status.ContainerStatuses[0].AllocatedResourcesStatus = []corev1.ResourceStatus{{Name: "claim:container-0-request-0",
		Resources: []corev1.ResourceHealth{{ResourceID: corev1.ResourceID("nvidia.com/gpu=" + uuid), Health: corev1.ResourceHealthStatusHealthy}}}}
	return &draWorld{
		node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{contract.DRAModeLabel: contract.DRAModeDRA}}},
		slice: &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: nodeName + "-gpu.nvinject.io-abcde"},
			Spec: resourceapi.ResourceSliceSpec{Driver: contract.DRADriver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: nodeName, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "gpu-0",
					Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{contract.DRAAttrUUID: {StringValue: &uuidAttr}},
					Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{contract.DRACapacityMemory: {Value: resource.MustParse("80Gi")}}}}}},
		class: &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: contract.DRADriver}, Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: &ext}},
		claim: &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: claimName, Namespace: "default", Annotations: map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"}},
			Status: resourceapi.ResourceClaimStatus{
				Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
					{Request: "container-0-request-0", Driver: contract.DRADriver, Pool: nodeName, Device: "gpu-0"}}}},
				ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "vllm-demo-1", UID: "u1"}}}},
		pod:     pod,
		daemons: []*corev1.Pod{daemonPod(contract.DRAApp, nil), daemonPod(contract.NRIApp, nil)},
	}
}

func (w *draWorld) client() *fake.Clientset {
	objs := []runtime.Object{w.node, w.pod,
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: contract.ConfigMapName, Namespace: contract.Namespace}, Data: map[string]string{contract.ConfigMapKey: uuid}},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: contract.RuntimeHandler}, Handler: contract.RuntimeHandler}}
	// Typed nils would reach the fake as objects: add only what is set.
	if w.slice != nil {
		objs = append(objs, w.slice)
	}
	if w.class != nil {
		objs = append(objs, w.class)
	}
	if w.claim != nil {
		objs = append(objs, w.claim)
	}
	for _, d := range w.daemons {
		objs = append(objs, d)
	}
	return fake.NewClientset(append(objs, w.extra...)...)
}

func TestRunDRA(t *testing.T) {
	crash := "level=ERROR msg=\"nvinject-dra failed\" error=\"register with kubelet: plugins_registry not found\""
	pending := gpuPod("second", "", corev1.PodPending)
	pending.Labels = nil
	pending.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
		Message: "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable, preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."}}
	tests := []struct {
		name    string
		change  func(*draWorld)
		metrics string
		mode    string
		want    map[check.Layer]check.Status
		// evidence and fix each layer's verdict must contain.
		evidence, fix map[check.Layer]string
	}{
		{name: "healthy", want: map[check.Layer]check.Status{check.LayerDriver: check.OK, check.LayerRegistration: check.OK, check.LayerHealth: check.OK, check.LayerScheduling: check.OK, check.LayerAllocate: check.OK, check.LayerInjection: check.OK, check.LayerCDIRuntime: check.OK, check.LayerApplication: check.OK},
			evidence: map[check.Layer]string{
				check.LayerRegistration: "DeviceClass gpu.nvinject.io serves extended resource nvidia.com/gpu",
				check.LayerHealth:       "default/vllm-demo-1[vllm]: claim:container-0-request-0 nvidia.com/gpu=" + uuid + " Healthy",
				check.LayerScheduling:   "1 of 1 published device(s) allocated, 0 tainted Unhealthy, 0 held by device-plugin pods, 0 with holders unknown, 0 free",
				check.LayerAllocate:     "claim default/" + claimName + " (the scheduler's claim for nvidia.com/gpu (KEP-5004)) allocated by the scheduler: request container-0-request-0 → gpu.nvinject.io/" + nodeName + "/gpu-0 " + uuid + ", reserved for default/vllm-demo-1",
				check.LayerCDIRuntime:   "1 of the 1 CDI names pods need resolve",
				check.LayerApplication:  "default/vllm-demo-1[vllm] running and ready"}},
		{name: "mode from the daemon when the node has no label", change: func(w *draWorld) { w.node.Labels = nil },
			want:     map[check.Layer]check.Status{check.LayerRegistration: check.OK, check.LayerAllocate: check.OK},
			evidence: map[check.Layer]string{check.LayerRegistration: "mode dra (an nvinject-dra pod and no single-gpu-device-plugin pod on the node)"}},
		{name: "nvinject-dra crash-loops", change: func(w *draWorld) { w.daemons[0] = daemonPod(contract.DRAApp, &crash) }, metrics: "-",
			want:     map[check.Layer]check.Status{check.LayerRegistration: check.Broken},
			evidence: map[check.Layer]string{check.LayerRegistration: "nvinject-dra is not running on " + nodeName + ": pod " + contract.Namespace + "/nvinject-dra-x1 Running ready=false restarts=4 waiting=CrashLoopBackOff; last run ended Error (exit code 1): " + crash},
			fix:      map[check.Layer]string{check.LayerRegistration: "correct what the daemon's last error says"}},
		{name: "nvinject-nri cannot mount the NRI socket dir on a DRA node", change: func(w *draWorld) {
			p := nriPending()
			w.daemons[1] = p[0].(*corev1.Pod)
			w.extra = append(w.extra, p[1])
		},
			want:     map[check.Layer]check.Status{check.LayerRegistration: check.OK, check.LayerAllocate: check.OK, check.LayerInjection: check.Broken},
			evidence: map[check.Layer]string{check.LayerInjection: "event FailedMount: " + nriMountFailed},
			fix:      map[check.Layer]string{check.LayerInjection: "volume nri-socket"}},
		{name: "not registered", metrics: strings.Replace(draText, "registered 1", "registered 0", 1), change: func(w *draWorld) { w.slice = nil },
			want:     map[check.Layer]check.Status{check.LayerRegistration: check.Broken},
			evidence: map[check.Layer]string{check.LayerRegistration: "kubelet has not accepted gpu.nvinject.io's registration (nvinject_dra_registered=0)"},
			fix:      map[check.Layer]string{check.LayerRegistration: "plugins_registry"}},
		{name: "no ResourceSlice", change: func(w *draWorld) { w.slice = nil },
			want:     map[check.Layer]check.Status{check.LayerRegistration: check.Broken, check.LayerAllocate: check.Broken},
			evidence: map[check.Layer]string{check.LayerRegistration: "no ResourceSlice of driver gpu.nvinject.io for node " + nodeName, check.LayerAllocate: "which no ResourceSlice of " + nodeName + " lists"},
			fix:      map[check.Layer]string{check.LayerRegistration: "RBAC of ServiceAccount nvinject-dra"}},
		{name: "no DeviceClass", change: func(w *draWorld) { w.class = nil },
			want:     map[check.Layer]check.Status{check.LayerRegistration: check.Broken},
			evidence: map[check.Layer]string{check.LayerRegistration: "DeviceClass gpu.nvinject.io does not exist"},
			fix:      map[check.Layer]string{check.LayerRegistration: "kubectl apply -k deploy/overlays/dra-node"}},
		{name: "DeviceClass without extendedResourceName", change: func(w *draWorld) { w.class.Spec.ExtendedResourceName = nil },
			want:     map[check.Layer]check.Status{check.LayerRegistration: check.Broken},
			evidence: map[check.Layer]string{check.LayerRegistration: `extendedResourceName "", want "nvidia.com/gpu": pods asking for nvidia.com/gpu: 1 stay Pending`}},
		{name: "two owners", change: func(w *draWorld) {
			w.daemons = append(w.daemons, daemonPod(contract.DevicePluginApp, nil))
			one := resource.MustParse("1")
			w.node.Status = corev1.NodeStatus{Capacity: corev1.ResourceList{contract.ResourceName: one}, Allocatable: corev1.ResourceList{contract.ResourceName: one}}
		},
			want: map[check.Layer]check.Status{check.LayerRegistration: check.Broken},
			evidence: map[check.Layer]string{check.LayerRegistration: "single-gpu-device-plugin also runs on " + nodeName + " (pod " + contract.Namespace + "/single-gpu-device-plugin-x1 Running ready=true restarts=0): two owners of nvidia.com/gpu\n" +
				"Node " + nodeName + " still has allocatable nvidia.com/gpu=1 from a device plugin"},
			fix: map[check.Layer]string{check.LayerRegistration: "label it nvinject.io/gpu-mode=dra or =device-plugin"}},
		{name: "Xid: tainted device, pod Unhealthy, next pod Pending", metrics: strings.Replace(draText, `device="gpu-0"} 1`, `device="gpu-0"} 0`, 1) + `nvinject_dra_health_events_total{kind="xid",xid="79",ignored="false"} 1` + "\n",
			change: func(w *draWorld) {
				w.slice.Spec.Devices[0].Taints = []resourceapi.DeviceTaint{{Key: contract.DRATaintKey, Value: "xid", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
				w.pod.Status.ContainerStatuses[0].AllocatedResourcesStatus[0].Resources[0].Health = corev1.ResourceHealthStatusUnhealthy
				w.claim.Status = resourceapi.ResourceClaimStatus{}
				w.pod.Status.ExtendedResourceClaimStatus = nil
				w.extra = append(w.extra, pending)
			},
			want: map[check.Layer]check.Status{check.LayerRegistration: check.OK, check.LayerHealth: check.Broken, check.LayerScheduling: check.Broken},
			evidence: map[check.Layer]string{
				check.LayerHealth:     "device " + nodeName + "/gpu-0 (" + uuid + ") is tainted gpu.nvinject.io/unhealthy=xid:NoSchedule: new claims avoid it (plugin counted health events: xid 79)",
				check.LayerScheduling: "pod default/second Pending: 0/1 nodes are available: 1 cannot allocate all claims"},
			fix: map[check.Layer]string{check.LayerHealth: "removes taint gpu.nvinject.io/unhealthy", check.LayerScheduling: "the free GPU is tainted Unhealthy: fix the health layer first"}},
		{name: "node moved to DRA under a device-plugin pod", change: func(w *draWorld) {
			w.slice.Spec.Devices[0].Taints = []resourceapi.DeviceTaint{{Key: contract.DRAHeldTaintKey, Value: contract.DRAHeldTaintValue, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
			w.claim = nil
			w.pod.Status.ExtendedResourceClaimStatus = nil
			w.extra = append(w.extra, pending)
		},
			want: map[check.Layer]check.Status{check.LayerHealth: check.OK, check.LayerScheduling: check.Broken},
			evidence: map[check.Layer]string{check.LayerHealth: "is tainted gpu.nvinject.io/device-plugin-pod=running:NoSchedule: a pod given it by the device plugin",
				check.LayerScheduling: "0 of 1 published device(s) allocated, 0 tainted Unhealthy, 1 held by device-plugin pods, 0 with holders unknown, 0 free"},
			fix: map[check.Layer]string{check.LayerScheduling: "still holds it (taint gpu.nvinject.io/device-plugin-pod)"}},
		{name: "nvinject-dra cannot read PodResources", change: func(w *draWorld) {
			w.slice.Spec.Devices[0].Taints = []resourceapi.DeviceTaint{{Key: contract.DRAHeldTaintKey, Value: contract.DRAHeldTaintUnknown, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
			w.claim = nil
			w.pod.Status.ExtendedResourceClaimStatus = nil
			w.extra = append(w.extra, pending)
		},
			want: map[check.Layer]check.Status{check.LayerHealth: check.Broken, check.LayerScheduling: check.Broken},
			evidence: map[check.Layer]string{check.LayerHealth: "is tainted gpu.nvinject.io/device-plugin-pod=unknown:NoSchedule: nvinject-dra cannot read kubelet's PodResources",
				check.LayerScheduling: "0 held by device-plugin pods, 1 with holders unknown, 0 free"},
			fix: map[check.Layer]string{check.LayerHealth: "mount kubelet's pod-resources dir", check.LayerScheduling: "--pod-resources-socket"}},
		{name: "pod's device health Unknown", change: func(w *draWorld) {
			w.pod.Status.ContainerStatuses[0].AllocatedResourcesStatus[0].Resources[0].Health = corev1.ResourceHealthStatusUnknown
		}, metrics: strings.Replace(draText, "health_streams 1", "health_streams 0", 1),
			want:     map[check.Layer]check.Status{check.LayerHealth: check.Broken},
			evidence: map[check.Layer]string{check.LayerHealth: "kubelet has no health stream (NodeWatchResources) open to nvinject-dra"},
			fix:      map[check.Layer]string{check.LayerHealth: "nvinject_dra_health_streams is 1"}},
		{name: "GPU taken", change: func(w *draWorld) { w.extra = append(w.extra, pending) },
			want:     map[check.Layer]check.Status{check.LayerScheduling: check.Broken, check.LayerAllocate: check.OK},
			evidence: map[check.Layer]string{check.LayerScheduling: "pod default/second Pending: 0/1 nodes are available: 1 cannot allocate all claims"},
			fix:      map[check.Layer]string{check.LayerScheduling: "every GPU on the node is allocated: free one (delete or scale down the pods holding default/" + claimName}},
		{name: "NodePrepareResources failed", change: func(w *draWorld) {
			w.pod.Status.Phase, w.pod.Status.ContainerStatuses = corev1.PodPending, nil
			w.extra = append(w.extra, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e1", Namespace: "default"}, Type: "Warning", Reason: "FailedPrepareDynamicResources",
				InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "vllm-demo-1"},
				Message:        "Failed to prepare dynamic resources: NodePrepareResources failed for ResourceClaim default/" + claimName + ": GPU gpu-0 is not in the CDI spec"})
		},
			want:     map[check.Layer]check.Status{check.LayerAllocate: check.Broken},
			evidence: map[check.Layer]string{check.LayerAllocate: "pod default/vllm-demo-1: Failed to prepare dynamic resources: NodePrepareResources failed for ResourceClaim default/" + claimName},
			fix:      map[check.Layer]string{check.LayerAllocate: "kubectl -n " + contract.Namespace + " logs ds/nvinject-dra"}},
		{name: "kubelet lost the resource's device-plugin endpoint", change: func(w *draWorld) {
			w.pod.Status.ContainerStatuses[0] = corev1.ContainerStatus{Name: "vllm", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason: "CreateContainerConfigError", Message: "endpoint not found in cache for a registered resource: nvidia.com/gpu"}}}
		},
			want:     map[check.Layer]check.Status{check.LayerAllocate: check.Broken},
			evidence: map[check.Layer]string{check.LayerAllocate: "default/vllm-demo-1[vllm] CreateContainerConfigError: endpoint not found in cache for a registered resource: nvidia.com/gpu"},
			fix:      map[check.Layer]string{check.LayerAllocate: "--hold-resource-endpoint"}},
		{name: "claim's GPU not in the CDI spec", change: func(w *draWorld) {
			other := "GPU-ffffffff-0000-0000-0000-000000000000"
			w.slice.Spec.Devices[0].Attributes[contract.DRAAttrUUID] = resourceapi.DeviceAttribute{StringValue: &other}
		},
			want:     map[check.Layer]check.Status{check.LayerCDIRuntime: check.Broken},
			evidence: map[check.Layer]string{check.LayerCDIRuntime: "nvidia.com/gpu=GPU-ffffffff-0000-0000-0000-000000000000 resolves to no device"}},
		{name: "forced device-plugin mode on a DRA node", mode: contract.DRAModeDevicePlugin,
			want:     map[check.Layer]check.Status{check.LayerRegistration: check.Broken},
			evidence: map[check.Layer]string{check.LayerRegistration: "nvinject-dra also runs on " + nodeName}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newDRAWorld()
			if tt.change != nil {
				tt.change(w)
			}
			text := draText
			if tt.metrics != "" {
				text = tt.metrics
			}
			srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { _, _ = rw.Write([]byte(text)) }))
			defer srv.Close()
			o := newNode(t).opts
			o.Node, o.Client, o.Mode, o.DRAMetrics = nodeName, w.client(), tt.mode, srv.URL
			if tt.metrics == "-" {
				o.DRAMetrics = ""
			}
			r, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			for layer, want := range tt.want {
				v, _ := r.Verdict(layer)
				ev := strings.Join(v.Evidence, "\n")
				if v.Status != want || !strings.Contains(ev, tt.evidence[layer]) || !strings.Contains(v.Fix, tt.fix[layer]) {
					t.Errorf("%s = %s, want %s with %q, fix %q\nevidence:\n%s\nfix: %s", layer, v.Status, want, tt.evidence[layer], tt.fix[layer], ev, v.Fix)
				}
			}
		})
	}
}
