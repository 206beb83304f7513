package render

import (
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const requiredPlugins = "required-plugins.noderesource.dev/pod"

// checkGPUPod: as a user writes it: RuntimeClass nvidia, one GPU by limit
// only (the example omits the request), and no required-plugins annotation.
func checkGPUPod(t *testing.T, name string, annotations map[string]string, spec corev1.PodSpec) {
	t.Helper()
	if spec.RuntimeClassName == nil || *spec.RuntimeClassName != "nvidia" {
		t.Errorf("%s: runtimeClassName = %v, want nvidia", name, spec.RuntimeClassName)
	}
	c := spec.Containers[0]
	if q, ok := c.Resources.Limits["nvidia.com/gpu"]; !ok || q.Cmp(resource.MustParse("1")) != 0 {
		t.Errorf("%s: limits nvidia.com/gpu = %v, want 1", name, c.Resources.Limits)
	}
	if _, ok := c.Resources.Requests["nvidia.com/gpu"]; ok {
		t.Errorf("%s: requests nvidia.com/gpu; the example sets the limit only", name)
	}
	if v, ok := annotations[requiredPlugins]; ok {
		t.Errorf("%s: annotation %s = %q; the example writes none (nvinject-add-required-nri-plugin adds it at admission)", name, requiredPlugins, v)
	}
}

func TestVLLMExample(t *testing.T) {
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "../examples/vllm")
	if err != nil {
		t.Fatal(err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, out)
	if len(o.deployments) != 1 || len(o.services) != 1 {
		t.Fatalf("want one Deployment and one Service, got %d and %d", len(o.deployments), len(o.services))
	}
	d, s := o.deployments[0], o.services[0]
	if d.Namespace != "default" || d.Spec.Template.Labels["app"] != "vllm-demo" || s.Spec.Selector["app"] != "vllm-demo" {
		t.Errorf("Deployment %s/%s labels %v, Service selector %v; want app=vllm-demo in default", d.Namespace, d.Name, d.Spec.Template.Labels, s.Spec.Selector)
	}
	checkGPUPod(t, "vllm-demo", d.Spec.Template.Annotations, d.Spec.Template.Spec)
	if p := d.Spec.Template.Spec.Containers[0].Ports; len(p) != 1 || p[0].ContainerPort != 8000 || s.Spec.Ports[0].Port != 8000 {
		t.Errorf("ports: container %v, service %v; want 8000", p, s.Spec.Ports)
	}
}

func TestGPUCheckPod(t *testing.T) {
	data, err := os.ReadFile("../examples/gpu-check-pod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, data)
	if len(o.pods) != 1 {
		t.Fatalf("want one Pod, got %d", len(o.pods))
	}
	p := o.pods[0]
	checkGPUPod(t, p.Name, p.Annotations, p.Spec)
	want := "nvidia-smi --query-gpu=uuid,name,memory.total --format=csv,noheader && ls -l /dev/nvidia*"
	if cmd := p.Spec.Containers[0].Command; len(cmd) != 3 || cmd[2] != want {
		t.Errorf("command = %q, want sh -c %q", cmd, want)
	}
}
