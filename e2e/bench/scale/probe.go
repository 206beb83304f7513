package scale

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/shared/contract"
)

// avoid keeps a pod off the named nodes (the storm's flapping ones), by their
// hostname label: a field selector takes one name only.
func avoid(pod *corev1.Pod, nodes []string) {
	if len(nodes) == 0 {
		return
	}
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: nodes}},
		}}},
	}}
}

// probe creates rate pods a second per path for d, kept off the avoided
// nodes, and deletes each once it runs so the free capacity stays as it was;
// it returns once every one ran.
func probe(ctx context.Context, client kubernetes.Interface, t *tracker, phase string, d time.Duration, rate float64, avoided []string, timeout time.Duration) error {
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	end := time.Now().Add(d)
	reap := func() error { return t.reap(ctx, client, phase) }
	for i := 0; time.Now().Before(end); i++ {
		for _, path := range []string{PathDevicePlugin, PathDRA} {
			pod := podObject(fmt.Sprintf("%s-%s-%06d", path, phase, i), path)
			avoid(pod, avoided)
			if err := t.createPod(ctx, client, pod, path, phase); err != nil {
				return err
			}
		}
		if err := reap(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	if err := t.waitRunning(ctx, phase, timeout); err != nil {
		return err
	}
	return reap()
}

// celTemplate names the ResourceClaimTemplate whose request selects, by a
// CEL expression over nvinject-dra's memory capacity, GPUs of 80 GiB or more.
const celTemplate = "gpu-80gi"

// celSelector is that expression (capacity gpu.nvinject.io/memory, bytes).
var celSelector = fmt.Sprintf(`device.capacity[%q].%s.compareTo(quantity("80Gi")) >= 0`, contract.DRADriver, contract.DRACapacityMemory)

// createCELTemplate creates the claim template the CEL phase's pods use.
func createCELTemplate(ctx context.Context, client kubernetes.Interface) error {
	tpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: celTemplate, Namespace: Namespace},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: contract.DRADriver,
				Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: celSelector}}},
			}}},
		}}},
	}
	if _, err := client.ResourceV1().ResourceClaimTemplates(Namespace).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ResourceClaimTemplate %s: %w", celTemplate, err)
	}
	return nil
}

// celPod asks for a GPU through the claim template, not the extended resource.
func celPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{"app": "nvinject-scale", "path": PathCEL}},
		Spec: corev1.PodSpec{
			NodeSelector:   map[string]string{contract.DRAModeLabel: PathDRA},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptrTo(celTemplate)}},
			Containers: []corev1.Container{{Name: "gpu", Image: "registry.k8s.io/pause:3.10.1",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
		},
	}
}

func ptrTo[T any](v T) *T { return &v }

// cel creates n pods of the claim template, rate a second, and waits until
// they run (the caller deletes them once their claims are counted).
func cel(ctx context.Context, client kubernetes.Interface, t *tracker, n int, rate float64, timeout time.Duration) error {
	if err := createCELTemplate(ctx, client); err != nil {
		return err
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for i := range n {
		if err := t.createPod(ctx, client, celPod(fmt.Sprintf("cel-%06d", i)), PathCEL, phaseCEL); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return t.waitRunning(ctx, phaseCEL, timeout)
}
