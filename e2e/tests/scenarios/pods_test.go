package scenarios

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/shared/contract"
)

const ns = "default"

// podSpec says how a test pod differs from a plain busybox pod.
type podSpec struct {
	gpu bool // limits nvidia.com/gpu: 1
	// resource, when set, is the extended resource limited to 1 instead
	// (nvidia.com/mig-1g.10gb).
	resource     string
	runtimeClass bool // runtimeClassName: nvidia
	privileged   bool // securityContext.privileged: true
	// asWritten: no required-plugins annotation, as a user writes pods;
	// the mutating admission policy adds it.
	asWritten   bool
	annotations map[string]string
	// image replaces the busybox image (the vLLM stand-in's glibc one).
	image string
}

// gpuPod is what an application asking for one GPU looks like.
var gpuPod = podSpec{gpu: true, runtimeClass: true}

// sleeper runs until SIGTERM and then exits at once: sh as PID 1 ignores
// SIGTERM without a trap, and kubelet then waits its minimum grace period
// (2 s) before SIGKILL, holding the pod's GPU that long.
var sleeper = []string{"/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"}

// createPod creates a busybox pod that sleeps, and deletes it when t ends.
func createPod(t testing.TB, ctx context.Context, name string, s podSpec) {
	t.Helper()
	d := need(t)
	ann := map[string]string{}
	for k, v := range s.annotations {
		ann[k] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"nvinject-e2e": "true"}, Annotations: ann},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "main", Image: rig.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: sleeper,
			}},
		},
	}
	if s.image != "" {
		pod.Spec.Containers[0].Image = s.image
	}
	if s.gpu {
		res := rig.Resource
		if s.resource != "" {
			res = s.resource
		}
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(res): resource.MustParse("1")}
	}
	if s.runtimeClass {
		rc := contract.RuntimeHandler
		pod.Spec.RuntimeClassName = &rc
	}
	if s.privileged {
		pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: new(true)}
	}
	// The validating admission policy requires the annotation on nvidia
	// pods and on GPU pods; written here, the mutating policy leaves it.
	if (s.runtimeClass || s.gpu) && !s.asWritten {
		ann[rig.RequiredPluginsAnnotation] = `["` + contract.NRIPluginName + `"]`
	}
	if _, err := d.Kube().Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { deletePod(t, name) })
}

// deletePod deletes a pod at once and waits until it is gone and, for a pod
// that may hold a GPU, until its containers have stopped on the node, so
// the GPU is free again. The API object goes at once with a zero grace
// period while kubelet still stops the containers; until they stop,
// nvinject-nri rightly refuses the next pod given the same GPU.
func deletePod(t testing.TB, name string) {
	t.Helper()
	d := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pods := d.Kube().Client.CoreV1().Pods(ns)
	p, err := pods.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("get pod %s: %v", name, err)
		return
	}
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete pod %s: %v", name, err)
		return
	}
	err = rig.Poll(ctx, 300*time.Millisecond, func(ctx context.Context) error {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("pod %s still exists (%v)", name, err)
	})
	if err != nil {
		t.Errorf("pod %s not gone: %v", name, err)
		return
	}
	if mayHoldGPU(p) {
		if err := waitSandboxStopped(ctx, d, p); err != nil {
			t.Errorf("pod %s: %v", name, err)
		}
	}
}

func mayHoldGPU(p *corev1.Pod) bool {
	if len(p.Spec.ResourceClaims) > 0 || (p.Spec.RuntimeClassName != nil && *p.Spec.RuntimeClassName == contract.RuntimeHandler) {
		return true
	}
	for _, c := range p.Spec.Containers {
		for res := range c.Resources.Limits {
			if strings.HasPrefix(string(res), "nvidia.com/") {
				return true
			}
		}
	}
	return false
}

// waitSandboxStopped waits until the node has no ready sandbox of pod p.
// kubelet stops a sandbox only after each of its containers stopped, and
// containerd tells NRI plugins of a container's stop within that stop, so
// from then on nvinject-nri holds none of the pod's GPUs.
func waitSandboxStopped(ctx context.Context, d *rig.Deployer, p *corev1.Pod) error {
	return rig.Poll(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		out, err := crictl(ctx, d, "pods", "-q", "--state", "ready", "--label", "io.kubernetes.pod.uid="+string(p.UID))
		if err != nil {
			return err
		}
		if ids := strings.Fields(out); len(ids) > 0 {
			return fmt.Errorf("sandbox %s of the deleted pod is still ready", ids[0])
		}
		return nil
	})
}

// crictl runs the pinned crictl against the node's containerd.
func crictl(ctx context.Context, d *rig.Deployer, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(os.Getenv("NVINJECT_TOOLS_BIN"), "crictl"),
		append([]string{"--runtime-endpoint", "unix://" + d.Node().ContainerdSocket()}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(ee.Stderr))
		}
		return "", fmt.Errorf("crictl %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

// waitPod polls pod name until cond accepts it.
func waitPod(t testing.TB, ctx context.Context, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	d := need(t)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last *corev1.Pod
	err := rig.Poll(ctx, 300*time.Millisecond, func(ctx context.Context) error {
		p, err := d.Kube().Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		last = p
		if !cond(p) {
			return fmt.Errorf("pod %s is not %s", name, what)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pod %s: %v; status %s", name, err, describe(last))
	}
	return last
}

func running(p *corev1.Pod) bool {
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil {
			return false
		}
	}
	return p.Status.Phase == corev1.PodRunning
}

// waitingReason returns the first container's waiting reason and message.
func waitingReason(p *corev1.Pod) (string, string) {
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			return w.Reason, w.Message
		}
	}
	return "", ""
}

func createError(p *corev1.Pod) bool {
	r, _ := waitingReason(p)
	return r == "CreateContainerError"
}

func describe(p *corev1.Pod) string {
	if p == nil {
		return "<none>"
	}
	r, m := waitingReason(p)
	return fmt.Sprintf("phase=%s node=%q waiting=%s %s", p.Status.Phase, p.Spec.NodeName, r, m)
}

// waitEvent waits for an event about pod name with reason whose message contains text.
func waitEvent(t *testing.T, ctx context.Context, name, reason, text string) string {
	t.Helper()
	d := need(t)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var msg string
	err := rig.Poll(ctx, 500*time.Millisecond, func(ctx context.Context) error {
		evs, err := d.Kube().Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": name, "reason": reason}.String()})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, text) {
				msg = e.Message
				return nil
			}
		}
		return fmt.Errorf("no %s event for %s containing %q (%d %s events)", reason, name, text, len(evs.Items), reason)
	})
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// containerGPUs runs nvidia-smi-sim (the SIMULATED GPUs' UUID query, in the
// test images) in pod name and returns its GPU UUIDs.
func containerGPUs(t testing.TB, ctx context.Context, name string) []string {
	t.Helper()
	out, err := need(t).Kube().Exec(ctx, ns, name, "", "nvidia-smi-sim", "--query-gpu=uuid,name,memory.total", "--format=csv,noheader")
	if err != nil {
		t.Fatalf("nvidia-smi in %s: %v", name, err)
	}
	var uuids []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		uuid, _, _ := strings.Cut(line, ",")
		uuids = append(uuids, uuid)
	}
	return uuids
}

// waitAllocatable waits until the node's GPU capacity and allocatable are as given.
func waitAllocatable(t *testing.T, ctx context.Context, capacity, allocatable int64, timeout time.Duration) time.Duration {
	t.Helper()
	d := need(t)
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := rig.Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		c, a, err := d.NodeGPUs(ctx)
		if err != nil {
			return err
		}
		if c != capacity || a != allocatable {
			return fmt.Errorf("capacity %d allocatable %d, want %d and %d", c, a, capacity, allocatable)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("node %s: %v", d.Node().Name(), err)
	}
	return time.Since(t0)
}
