package scenarios

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nvinject/nvinject/doctor"
	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/gpunode/mps"
	"github.com/nvinject/nvinject/shared/contract"
)

// TestDRA moves the node from the device plugin to nvinject-dra by label,
// runs the DRA scenarios on it, and moves it back. Each subtest stands on
// the DRA node alone and can be run by name.
func TestDRA(t *testing.T) {
	d := need(t)
	failOnKubeletRefusedRegister(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := d.ImportDRAImage(ctx); err != nil {
		t.Fatal(err)
	}
	t.Run("DRA manifests pass the API server's dry run", func(t *testing.T) {
		repo, _ := filepath.Abs(filepath.Join("..", "..", ".."))
		for _, args := range [][]string{
			{"-k", filepath.Join(repo, "deploy", "overlays", "dra-node")},
			{"-k", filepath.Join(repo, "deploy", "overlays", "local-sim-dra")},
			{"-f", filepath.Join(repo, "deploy", "examples", "dra", "gpu-80gb-claim.yaml")},
			{"-f", filepath.Join(repo, "deploy", "examples", "dra", "shared-gpu-claim.yaml")},
			{"-f", filepath.Join(repo, "deploy", "examples", "dra", "gpu-share-claim.yaml")},
		} {
			out, err := d.Kube().Kubectl(ctx, "", append([]string{"apply", "--dry-run=server"}, args...)...)
			if err != nil || !strings.Contains(out, "(server dry run)") {
				t.Errorf("%s: %v\n%s", args[1], err, out)
			}
		}
	})
	switched, graceFrom := false, time.Time{}
	t.Cleanup(func() {
		if !switched {
			return
		}
		sw, err := d.SwitchToDevicePlugin(context.Background(), dep, 3*time.Minute)
		if err != nil {
			t.Errorf("switch back to the device plugin: %v", err)
			return
		}
		t.Logf("FIGURE switch DRA -> device plugin: nvinject-dra gone %s, allocatable 1 after %s, device plugin Ready and kubelet offering the GPU after %s",
			sw.OldOwnerGone.Round(time.Millisecond), sw.Allocatable.Round(time.Millisecond), sw.Ready.Round(time.Millisecond))
	})
	// The move is the test's set-up, not a step: every subtest below runs
	// on the DRA node alone (go test -run 'TestDRA/<name>'), creates what
	// it needs and deletes its pods.
	sw, err := d.SwitchToDRA(ctx, dep, 3*time.Minute)
	switched, graceFrom = true, time.Now()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE switch device plugin -> DRA: device plugin gone %s, allocatable nvidia.com/gpu 0 after %s, nvinject-dra Ready with its ResourceSlice after %s; capacity then %d",
		sw.OldOwnerGone.Round(time.Millisecond), sw.Allocatable.Round(time.Millisecond), sw.Ready.Round(time.Millisecond), sw.Capacity)

	t.Run("the node publishes its GPU through DRA only", func(t *testing.T) {
		// nvinject-dra's empty device-plugin endpoint replaces the device
		// plugin's at once, so no stale capacity is left for kubelet's
		// 5-minute endpoint grace.
		waitCapacity(t, ctx, 0, time.Minute)
		s, err := d.ResourceSlice(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkSliceDevice(t, s, false)
		if _, err := d.Kube().Client.ResourceV1().DeviceClasses().Get(ctx, contract.DRADriver, metav1.GetOptions{}); err != nil {
			t.Fatalf("DeviceClass %s: %v", contract.DRADriver, err)
		}
	})

	t.Run("example vLLM Deployment unchanged", func(t *testing.T) {
		t0 := time.Now()
		pod := runVLLMOnSelectedGPU(t, ctx, d)
		t.Logf("vLLM stand-in Ready %s after apply", time.Since(t0).Round(time.Millisecond))
		s := pod.Status.ExtendedResourceClaimStatus
		if s == nil || s.ResourceClaimName == "" || len(s.RequestMappings) != 1 || s.RequestMappings[0].ResourceName != contract.ResourceName {
			t.Fatalf("pod %s status.extendedResourceClaimStatus = %+v, want a claim for %s", pod.Name, s, contract.ResourceName)
		}
		checkAllocated(t, ctx, pod)
		if driver.Real() {
			checkLDCache(t, ctx, pod.Name)
		}
		t.Logf("pod %s: extendedResourceClaimStatus names ResourceClaim %s (request %s)", pod.Name, s.ResourceClaimName, s.RequestMappings[0].RequestName)

		createDRAPod(t, ctx, "dra-second", gpuPod, "")
		msg := waitEvent(t, ctx, "dra-second", "FailedScheduling", "0/1 nodes are available")
		waitPod(t, ctx, "dra-second", 5*time.Second, "Pending and unbound", func(p *corev1.Pod) bool { return p.Status.Phase == "Pending" && p.Spec.NodeName == "" })
		t.Logf("second GPU pod Pending: %s", msg)

		r := runDoctor(t, ctx, nil)
		wantBroken(t, r, doctor.LayerScheduling, "pod "+ns+"/dra-second Pending: 0/1 nodes are available", "every GPU on the node is allocated")
		for _, l := range []doctor.Layer{doctor.LayerDriver, doctor.LayerRegistration, doctor.LayerHealth, doctor.LayerAllocate, doctor.LayerInjection, doctor.LayerCDIRuntime, doctor.LayerApplication} {
			if v, _ := r.Verdict(l); v.Status != doctor.OK {
				t.Errorf("doctor on the DRA node: %s is %s, want ok: %v (fix: %s)", l, v.Status, v.Evidence, v.Fix)
			}
		}
		if v, _ := r.Verdict(doctor.LayerAllocate); !strings.Contains(strings.Join(v.Evidence, "\n"), "claim "+ns+"/"+s.ResourceClaimName+" (the scheduler's claim for "+contract.ResourceName) {
			t.Errorf("doctor's allocate layer does not name the pod's claim %s: %v", s.ResourceClaimName, v.Evidence)
		}
		if r.Evidence.Mode.Mode != contract.DRAModeDRA {
			t.Errorf("doctor took the node for %q (%s), want %s", r.Evidence.Mode.Mode, r.Evidence.Mode.Source, contract.DRAModeDRA)
		}
	})

	// Pod start through DRA against the device plugin is
	// BenchmarkGPUPodStart (make bench-node); here each way of asking runs.
	t.Run("claim pods see exactly their GPU", func(t *testing.T) {
		createTemplate(t, ctx)
		for _, p := range []struct {
			name, claim string
			spec        podSpec
		}{
			{"dra-ext", "", gpuPod},
			{"dra-claim", "gpu-80gb", podSpec{runtimeClass: true}},
		} {
			createDRAPod(t, ctx, p.name, p.spec, p.claim)
			waitPod(t, ctx, p.name, 2*time.Minute, "Running", running)
			if got := containerGPUs(t, ctx, p.name); !slices.Equal(got, []string{dep.UUID}) {
				t.Errorf("pod %s sees %v, want exactly %s", p.name, got, dep.UUID)
			}
			deletePod(t, p.name)
		}
	})

	t.Run("two pods share one claim by its GpuConfig (time-slicing)", func(t *testing.T) {
		claim := createSharedClaim(t, ctx, "", "")
		for _, n := range []string{"dra-shared-a", "dra-shared-b"} {
			createClaimPod(t, ctx, n, claim.Name, rig.BusyboxImage)
		}
		for _, n := range []string{"dra-shared-a", "dra-shared-b"} {
			waitPod(t, ctx, n, 2*time.Minute, "Running", running)
			if got := containerGPUs(t, ctx, n); !slices.Equal(got, []string{dep.UUID}) {
				t.Errorf("pod %s sees %v, want exactly the claim's GPU %s", n, got, dep.UUID)
			}
			out, err := d.Kube().Exec(ctx, ns, n, "", "/bin/sh", "-c", "echo $"+contract.EnvSharedClaim)
			if err != nil || strings.TrimSpace(out) != string(claim.UID) {
				t.Errorf("pod %s: %s=%q (%v), want the claim's UID %s", n, contract.EnvSharedClaim, strings.TrimSpace(out), err, claim.UID)
			}
		}
		// The claim holds the node's one GPU: a pod of its own claim waits.
		createTemplate(t, ctx)
		createDRAPod(t, ctx, "dra-unshared", podSpec{runtimeClass: true}, "gpu-80gb")
		waitPod(t, ctx, "dra-unshared", time.Minute, "Unschedulable", unschedulable)
		t.Logf("FIGURE DRA sharing: 2 pods Running on claim %s (TimeSlicing) on %s, a pod of another claim Unschedulable", claim.Name, dep.UUID)
		for _, n := range []string{"dra-unshared", "dra-shared-a", "dra-shared-b"} {
			deletePod(t, n)
		}
	})

	t.Run("two pods share one claim through its MPS daemon", func(t *testing.T) {
		if !driver.Real() {
			t.Skip("MPS runs NVIDIA's real control daemon: " + driver.String())
		}
		claim := createSharedClaim(t, ctx, "shared-mps", `{"apiVersion":"gpu.nvinject.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"20Gi"}}}`)
		names := []string{"dra-mps-a", "dra-mps-b"}
		for _, n := range names {
			createClaimPod(t, ctx, n, claim.Name, rig.VLLMImage)
		}
		for _, n := range names {
			waitPod(t, ctx, n, 2*time.Minute, "Running", running)
			if got := containerGPUs(t, ctx, n); !slices.Equal(got, []string{dep.UUID}) {
				t.Errorf("pod %s sees %v, want exactly the claim's GPU %s", n, got, dep.UUID)
			}
			out, err := d.Kube().Exec(ctx, ns, n, "", "/bin/sh", "-c",
				`env | grep '^CUDA_MPS_' | sort; echo get_default_active_thread_percentage | nvidia-cuda-mps-control; echo get_default_device_pinned_mem_limit 0 | nvidia-cuda-mps-control`)
			if err != nil {
				t.Fatalf("MPS client in %s: %v", n, err)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			for _, e := range []string{"CUDA_MPS_PIPE_DIRECTORY=" + mps.PathsOf(d.MPSDir(), string(claim.UID)).Pipe, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"} {
				if !slices.Contains(lines, e) {
					t.Errorf("pod %s lacks %s:\n%s", n, e, out)
				}
			}
			if len(lines) < 2 || lines[len(lines)-2] != "50.0" || lines[len(lines)-1] != "20G" {
				t.Errorf("pod %s: the claim's MPS daemon answered %q, want 50.0 and 20G", n, lines)
			}
		}
		t.Logf("FIGURE DRA MPS: 2 pods of claim %s on %s, clients of NVIDIA's real MPS control daemon for the claim (50%% threads, 20G pinned)", claim.Name, dep.UUID)
		for _, n := range names {
			deletePod(t, n)
		}
	})

	t.Run("GPU shares of 40Gi and 30Gi on one GPU, a third Pending", func(t *testing.T) { testDRAShares(t, ctx) })
	t.Run("admin-access monitor beside a GPU pod", func(t *testing.T) { testDRAAdminAccess(t, ctx) })

	// From here on the pods ask by ResourceClaimTemplate (the example's
	// nvidia.com/gpu: 1 has its own steps above and at the end).
	t.Run("Xid taints the device and the pod's health", func(t *testing.T) {
		createTemplate(t, ctx)
		createDRAPod(t, ctx, "dra-xid", podSpec{runtimeClass: true}, "gpu-80gb")
		waitPod(t, ctx, "dra-xid", 2*time.Minute, "Running", running)
		if err := d.DRASimDebug(ctx, "xid", "uuid="+dep.UUID+"&xid=79"); err != nil {
			t.Fatal(err)
		}
		recovered := false
		t.Cleanup(func() {
			if !recovered {
				_ = d.DRASimDebug(context.Background(), "recover", "uuid="+dep.UUID)
			}
		})
		t0 := time.Now()
		waitTaint(t, ctx, true)
		tTaint := time.Since(t0)
		p := waitPod(t, ctx, "dra-xid", time.Minute, "allocatedResourcesStatus Unhealthy", healthIs(corev1.ResourceHealthStatusUnhealthy))
		t.Logf("FIGURE Xid 79: device tainted after %s, pod allocatedResourcesStatus Unhealthy after %s: %+v",
			tTaint.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond), p.Status.ContainerStatuses[0].AllocatedResourcesStatus)
		r := waitDoctor(t, ctx, doctor.LayerHealth, nil)
		wantBroken(t, r, doctor.LayerHealth, "is tainted "+contract.DRATaintKey+"=xid:NoSchedule", "removes taint "+contract.DRATaintKey)
		if v, _ := r.Verdict(doctor.LayerHealth); !strings.Contains(strings.Join(v.Evidence, "\n"), ns+"/dra-xid[") {
			t.Errorf("doctor's health layer does not name the Unhealthy pod dra-xid: %v", v.Evidence)
		}
		if err := d.DRASimDebug(ctx, "recover", "uuid="+dep.UUID); err != nil {
			t.Fatal(err)
		}
		recovered = true
		t0 = time.Now()
		waitTaint(t, ctx, false)
		waitPod(t, ctx, "dra-xid", time.Minute, "allocatedResourcesStatus Healthy", healthIs(corev1.ResourceHealthStatusHealthy))
		t.Logf("recovered: taint removed and allocatedResourcesStatus Healthy after %s", time.Since(t0).Round(time.Millisecond))
		deletePod(t, "dra-xid")
	})

	for _, restart := range []string{"kubelet", "nvinject-dra"} {
		t.Run(restart+" restart with a claim prepared", func(t *testing.T) {
			name := "dra-keep-" + strings.TrimPrefix(restart, "nvinject-")
			createTemplate(t, ctx)
			createDRAPod(t, ctx, name, podSpec{runtimeClass: true}, "gpu-80gb")
			before := waitPod(t, ctx, name, 2*time.Minute, "Running", running)
			t0 := time.Now()
			if restart == "kubelet" {
				if err := d.Node().Restart(ctx, "kubelet"); err != nil {
					t.Fatal(err)
				}
				// kubelet re-reads its device-manager checkpoint and starts
				// a new endpoint grace for the device plugin's resource.
				graceFrom = time.Now()
			} else {
				restartDRA(t, ctx)
			}
			waitDRARegistered(t, ctx)
			t.Logf("%s restarted; nvinject-dra registered again after %s", restart, time.Since(t0).Round(time.Millisecond))
			after := waitPod(t, ctx, name, time.Minute, "Running", running)
			if after.UID != before.UID || after.Status.ContainerStatuses[0].RestartCount != before.Status.ContainerStatuses[0].RestartCount {
				t.Errorf("pod %s was replaced or restarted", name)
			}
			// Exec goes through kubelet, which needs a moment after its
			// restart before it serves the pod again.
			// The SIMULATED GPU's UUID query: the real nvidia-smi cannot talk
			// to a driver here. Bounded, so a broken exec fails the step.
			var got string
			execCtx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			err := rig.Poll(execCtx, 500*time.Millisecond, func(ctx context.Context) error {
				out, err := d.Kube().Exec(ctx, ns, name, "", "nvidia-smi-sim", "--query-gpu=uuid", "--format=csv,noheader")
				got = strings.TrimSpace(out)
				return err
			})
			if err != nil || got != dep.UUID {
				t.Errorf("after the restart %s sees %q (%v), want %s", name, got, err, dep.UUID)
			}
			t.Logf("%s still sees %s, answering exec %s after the %s restart", name, got, time.Since(t0).Round(time.Millisecond), restart)
			deletePod(t, name)
			next := name + "-next"
			createDRAPod(t, ctx, next, podSpec{runtimeClass: true}, "gpu-80gb")
			waitPod(t, ctx, next, 2*time.Minute, "Running", running)
			deletePod(t, next)
			if restart == "kubelet" {
				// kubelet rebuilds its device manager from its checkpoint,
				// which still lists the device plugin's pods: the example's
				// nvidia.com/gpu pod must run through DRA all the same.
				t1 := time.Now()
				createDRAPod(t, ctx, "dra-ext-after-restart", gpuPod, "")
				waitPod(t, ctx, "dra-ext-after-restart", 2*time.Minute, "Running", running)
				t.Logf("nvidia.com/gpu pod after the kubelet restart: Running %s after create", time.Since(t1).Round(time.Millisecond))
				deletePod(t, "dra-ext-after-restart")
			}
		})
	}

	t.Run("NRI refuses a claim pod without runtimeClassName", func(t *testing.T) {
		createTemplate(t, ctx)
		createDRAPod(t, ctx, "dra-no-rc", podSpec{}, "gpu-80gb")
		p := waitPod(t, ctx, "dra-no-rc", 2*time.Minute, "CreateContainerError", createError)
		_, msg := waitingReason(p)
		if !strings.Contains(msg, "runtimeClassName: nvidia") || !strings.Contains(msg, dep.UUID) {
			t.Errorf("CreateContainerError message = %q, want nvinject's refusal naming the claimed GPU and runtimeClassName: nvidia", msg)
		}
		t.Logf("refused: %s", msg)
	})

	// kubelet drops a stopped device plugin's endpoint 5 minutes after it
	// stopped or after kubelet's own restart (which re-reads its checkpoint);
	// from then on Kubernetes 1.37.2 failed every nvidia.com/gpu DRA
	// container of a node that had run the device plugin, unless an endpoint
	// for the resource stays registered (nvinject-dra's empty one;
	// dra/README.md).
	t.Run("the example's nvidia.com/gpu pod after kubelet's endpoint grace", func(t *testing.T) {
		// A fixed wait, the one in the suite: nothing observable marks the
		// grace's end. kubelet logs nothing when it drops the endpoint
		// (GetCapacity deletes the resource silently), no metric or
		// PodResources answer carries its stop time, and Node capacity is 0
		// all along through nvinject-dra's empty endpoint. 20 s covers
		// kubelet's node status sync after the 5 minutes.
		wait := time.Until(graceFrom.Add(kubeletEndpointGrace + 20*time.Second))
		t.Logf("waiting %s: 5 min 20 s after the switch or kubelet's last restart", wait.Round(time.Second))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		const name = "dra-ext-after-grace"
		createDRAPod(t, ctx, name, gpuPod, "")
		waitPod(t, ctx, name, 2*time.Minute, "Running", running)
		if got := containerGPUs(t, ctx, name); !slices.Equal(got, []string{dep.UUID}) {
			t.Errorf("pod %s sees %v, want exactly %s", name, got, dep.UUID)
		}
		deletePod(t, name)
	})
}

// kubeletEndpointGrace is how long kubelet keeps a stopped device plugin's
// endpoint (endpointStopGracePeriod in pkg/kubelet/cm/devicemanager).
const kubeletEndpointGrace = 5 * time.Minute

// waitCapacity waits until Node capacity of the GPU resource is want.
func waitCapacity(t testing.TB, ctx context.Context, want int64, timeout time.Duration) {
	t.Helper()
	d := need(t)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	got := int64(-1)
	err := rig.Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		n, err := d.Kube().Client.CoreV1().Nodes().Get(ctx, d.Node().Name(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		q := n.Status.Capacity[contract.ResourceName]
		if got = q.Value(); got != want {
			return fmt.Errorf("capacity %s=%d", contract.ResourceName, got)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Node capacity %s = %d, want %d: %v", contract.ResourceName, got, want, err)
	}
}

// createDRAPod is createPod with, when claim is set, the pod's GPU from
// ResourceClaimTemplate claim instead of the nvidia.com/gpu limit.
func createDRAPod(t testing.TB, ctx context.Context, name string, s podSpec, claim string) {
	t.Helper()
	if claim == "" {
		createPod(t, ctx, name, s)
		return
	}
	d := need(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"nvinject-e2e": "true"}, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &claim}},
			Containers: []corev1.Container{{
				Name: "main", Image: rig.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:   sleeper,
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
	if s.runtimeClass {
		rc := contract.RuntimeHandler
		pod.Spec.RuntimeClassName = &rc
		pod.Annotations[contract.RequiredPluginsAnnotation] = `["` + contract.NRIPluginName + `"]`
	}
	if _, err := d.Kube().Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { deletePod(t, name) })
}

// createSharedClaim creates the example shared ResourceClaim (one GPU,
// TimeSlicing by opaque GpuConfig) from deploy/examples/dra, deleted when
// t ends; name and params (the GpuConfig's JSON), when set, replace the
// example's.
func createSharedClaim(t testing.TB, ctx context.Context, name, params string) *resourceapi.ResourceClaim {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "examples", "dra", "shared-gpu-claim.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c resourceapi.ResourceClaim
	if err := yaml.UnmarshalStrict(bytes.Split(data, []byte("\n---"))[0], &c); err != nil {
		t.Fatal(err)
	}
	c.Namespace = ns
	if name != "" {
		c.Name = name
	}
	if params != "" {
		c.Spec.Devices.Config[0].Opaque.Parameters.Raw = []byte(params)
	}
	got, err := need(t).Kube().Client.ResourceV1().ResourceClaims(ns).Create(ctx, &c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = need(t).Kube().Client.ResourceV1().ResourceClaims(ns).Delete(context.Background(), c.Name, metav1.DeleteOptions{})
	})
	return got
}

// createClaimPod creates a sleeping nvidia pod whose GPU is the existing
// ResourceClaim claim, shared with the other pods that name it.
func createClaimPod(t testing.TB, ctx context.Context, name, claim, image string) {
	t.Helper()
	rc := contract.RuntimeHandler
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"nvinject-e2e": "true"},
			Annotations: map[string]string{contract.RequiredPluginsAnnotation: `["` + contract.NRIPluginName + `"]`}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			RuntimeClassName:              &rc,
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}},
			Containers: []corev1.Container{{
				Name: "main", Image: image, ImagePullPolicy: corev1.PullNever,
				Command:   sleeper,
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
	if _, err := need(t).Kube().Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { deletePod(t, name) })
}

// createTemplate creates the example ResourceClaimTemplate (GPU with at
// least 80 GiB by CEL) from deploy/examples/dra.
func createTemplate(t testing.TB, ctx context.Context) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "examples", "dra", "gpu-80gb-claim.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tmpl resourceapi.ResourceClaimTemplate
	if err := yaml.UnmarshalStrict(bytes.Split(data, []byte("\n---"))[0], &tmpl); err != nil {
		t.Fatal(err)
	}
	_, err = need(t).Kube().Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, &tmpl, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// checkAllocated: the pod's claim is allocated by nvinject-dra's GPU of
// this node, the one selected.
func checkAllocated(t *testing.T, ctx context.Context, pod *corev1.Pod) {
	t.Helper()
	d := need(t)
	c, err := d.ClaimOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s allocation = %+v", c.Name, c.Status.Allocation)
	}
	r := c.Status.Allocation.Devices.Results[0]
	s, err := d.ResourceSlice(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var uuid string
	for _, dev := range s.Spec.Devices {
		if dev.Name == r.Device && dev.Attributes[contract.DRAAttrUUID].StringValue != nil {
			uuid = *dev.Attributes[contract.DRAAttrUUID].StringValue
		}
	}
	if r.Driver != contract.DRADriver || r.Pool != d.Node().Name() || uuid != dep.UUID {
		t.Errorf("claim %s allocated %s/%s/%s (uuid %q), want %s's GPU %s on %s", c.Name, r.Driver, r.Pool, r.Device, uuid, contract.DRADriver, dep.UUID, d.Node().Name())
	}
	if got := containerGPUs(t, ctx, pod.Name); !slices.Equal(got, []string{dep.UUID}) {
		t.Errorf("container of %s sees %v, want exactly the allocated %s", pod.Name, got, dep.UUID)
	}
}

func checkSliceDevice(t *testing.T, s *resourceapi.ResourceSlice, tainted bool) {
	t.Helper()
	if len(s.Spec.Devices) != 1 {
		t.Fatalf("ResourceSlice %s has %d devices, want the selected GPU only", s.Name, len(s.Spec.Devices))
	}
	dev := s.Spec.Devices[0]
	for _, a := range []string{contract.DRAAttrUUID, contract.DRAAttrProductName, contract.DRAAttrIndex, contract.DRAAttrMinor, contract.DRAAttrDriverVersion,
		contract.DRAAttrCUDADriverVersion, contract.DRAAttrArchitecture, contract.DRAAttrComputeCapability, "resource.kubernetes.io/pciBusID"} {
		if _, ok := dev.Attributes[resourceapi.QualifiedName(a)]; !ok {
			t.Errorf("device %s lacks attribute %s", dev.Name, a)
		}
	}
	if m := dev.Capacity[contract.DRACapacityMemory].Value; m.Value() != 80<<30 {
		t.Errorf("device %s memory %s, want 80Gi", dev.Name, m.String())
	}
	if has := slices.ContainsFunc(dev.Taints, func(tt resourceapi.DeviceTaint) bool { return tt.Key == contract.DRATaintKey }); has != tainted {
		t.Errorf("device %s taints %+v, want tainted=%v", dev.Name, dev.Taints, tainted)
	}
}

func waitTaint(t *testing.T, ctx context.Context, tainted bool) {
	t.Helper()
	d := need(t)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := rig.Poll(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		s, err := d.ResourceSlice(ctx)
		if err != nil {
			return err
		}
		has := slices.ContainsFunc(s.Spec.Devices[0].Taints, func(tt resourceapi.DeviceTaint) bool { return tt.Key == contract.DRATaintKey })
		if has != tainted {
			return fmt.Errorf("device %s taints %+v, want tainted=%v", s.Spec.Devices[0].Name, s.Spec.Devices[0].Taints, tainted)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// healthIs: the first container's allocatedResourcesStatus reports every
// device with health h.
func healthIs(h corev1.ResourceHealthStatus) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		if len(p.Status.ContainerStatuses) == 0 {
			return false
		}
		n := 0
		for _, rs := range p.Status.ContainerStatuses[0].AllocatedResourcesStatus {
			for _, r := range rs.Resources {
				if r.Health != h {
					return false
				}
				n++
			}
		}
		return n > 0
	}
}

func restartDRA(t *testing.T, ctx context.Context) {
	t.Helper()
	d := need(t)
	p, err := d.DRAPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Kube().Client.CoreV1().Pods(rig.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = rig.Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		np, err := d.DRAPod(ctx)
		if err != nil {
			return err
		}
		if np.UID == p.UID {
			return errString("the old nvinject-dra pod still runs")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitDRARegistered waits until nvinject-dra's metrics say kubelet accepted it.
func waitDRARegistered(t *testing.T, ctx context.Context) {
	t.Helper()
	d := need(t)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := rig.Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		m, err := d.DRAMetrics(ctx)
		if err != nil {
			return err
		}
		if !strings.Contains(m, contract.MetricDRARegistered+" 1") {
			return errString("nvinject-dra is not registered with kubelet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
