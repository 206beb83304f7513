package render

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// celTrue evaluates a policy expression as the API server would on a pod's
// JSON (object as a dynamic value; these expressions use only standard CEL).
func celTrue(t *testing.T, expr string, pod *corev1.Pod) bool {
	t.Helper()
	env, err := cel.NewEnv(cel.Variable("object", cel.DynType))
	if err != nil {
		t.Fatal(err)
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		t.Fatalf("compile %q: %v", expr, iss.Err())
	}
	prg, err := env.Program(ast)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(data, &obj); err != nil {
		t.Fatal(err)
	}
	out, _, err := prg.Eval(map[string]any{"object": obj})
	if err != nil {
		t.Fatalf("eval %q: %v", expr, err)
	}
	b, ok := out.Value().(bool)
	if !ok {
		t.Fatalf("%q returned %v, not a bool", expr, out)
	}
	return b
}

func allConditions(t *testing.T, conds []admissionv1.MatchCondition, pod *corev1.Pod) bool {
	t.Helper()
	for _, c := range conds {
		if !celTrue(t, c.Expression, pod) {
			return false
		}
	}
	return true
}

// admissionPod builds a pod as a user writes it: the example's is
// RuntimeClass nvidia, limits <resource>: 1 and no annotation.
func admissionPod(runtimeClass string, limits, initLimits corev1.ResourceList, annotations map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "x", Resources: corev1.ResourceRequirements{Limits: limits}}}},
	}
	if runtimeClass != "" {
		p.Spec.RuntimeClassName = &runtimeClass
	}
	if initLimits != nil {
		p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "x", Resources: corev1.ResourceRequirements{Limits: initLimits}}}
	}
	return p
}

// checkAdmissionPolicies: the mutating policy annotates exactly the pods the
// validating policy demands the annotation of, unless they name required
// plugins themselves; after it, the example pod passes the validating
// policy, and pods that drop nvinject or override it per container are
// still refused.
func checkAdmissionPolicies(t *testing.T, o objects, runtimeClass, res, plugin string) {
	t.Helper()
	if len(o.mutators) != 1 || len(o.policies) != 1 {
		t.Fatalf("%d mutating and %d validating policies, want 1 each", len(o.mutators), len(o.policies))
	}
	m, v := o.mutators[0].Spec, o.policies[0].Spec
	if m.FailurePolicy == nil || *m.FailurePolicy != admissionv1.Fail || m.ReinvocationPolicy != admissionv1.IfNeededReinvocationPolicy {
		t.Errorf("mutating policy failurePolicy %v, reinvocationPolicy %q; want Fail, IfNeeded", m.FailurePolicy, m.ReinvocationPolicy)
	}
	if rr := m.MatchConstraints.ResourceRules; len(rr) != 1 || !slices.Equal(rr[0].Operations, []admissionv1.OperationType{admissionv1.Create}) || !slices.Equal(rr[0].Resources, []string{"pods"}) {
		t.Errorf("mutating policy matches %+v, want pod CREATE", rr)
	}
	want := `Object{metadata: Object.metadata{annotations: {'required-plugins.noderesource.dev/pod': '["` + plugin + `"]'}}}`
	if len(m.Mutations) != 1 || m.Mutations[0].PatchType != admissionv1.PatchTypeApplyConfiguration || m.Mutations[0].ApplyConfiguration == nil ||
		m.Mutations[0].ApplyConfiguration.Expression != want {
		t.Fatalf("mutations %+v; want one apply configuration %s (it merges into the pod's annotations)", m.Mutations, want)
	}
	added := map[string]string{requiredPlugins: `["` + plugin + `"]`}
	gpu := corev1.ResourceList{corev1.ResourceName(res): resource.MustParse("1")}
	other := corev1.ResourceList{"example.com/fpga": resource.MustParse("1")}
	tests := []struct {
		name   string
		pod    *corev1.Pod
		mutate bool
		// admitted: what the validating policy says after the mutation.
		admitted bool
	}{
		{"example pod", admissionPod(runtimeClass, gpu, nil, nil), true, true},
		{"RuntimeClass only", admissionPod(runtimeClass, nil, nil, nil), true, true},
		{"GPU request without the RuntimeClass", admissionPod("", gpu, nil, nil), true, true},
		{"GPU request in an init container", admissionPod("", nil, gpu, nil), true, true},
		{"other annotations kept", admissionPod(runtimeClass, gpu, nil, map[string]string{"team": "ml"}), true, true},
		{"already annotated", admissionPod(runtimeClass, gpu, nil, maps.Clone(added)), false, true},
		{"unscoped key naming the plugin", admissionPod(runtimeClass, gpu, nil, map[string]string{"required-plugins.noderesource.dev": `["` + plugin + `"]`}), false, true},
		{"pod annotation dropping the plugin", admissionPod(runtimeClass, gpu, nil, map[string]string{requiredPlugins: `["other"]`}), false, false},
		{"container-scoped override alone", admissionPod(runtimeClass, gpu, nil, map[string]string{"required-plugins.noderesource.dev/container.main": "[]"}), false, false},
		{"container-scoped override beside the pod annotation", admissionPod(runtimeClass, gpu, nil, map[string]string{requiredPlugins: added[requiredPlugins], "required-plugins.noderesource.dev/container.main": "[]"}), false, false},
	}
	for _, tc := range tests {
		if got := allConditions(t, m.MatchConditions, tc.pod); got != tc.mutate {
			t.Errorf("%s: mutating policy applies = %v, want %v", tc.name, got, tc.mutate)
		}
		if !allConditions(t, v.MatchConditions, tc.pod) {
			t.Errorf("%s: the validating policy does not match it", tc.name)
			continue
		}
		after := tc.pod.DeepCopy()
		if tc.mutate {
			if after.Annotations == nil {
				after.Annotations = map[string]string{}
			}
			maps.Copy(after.Annotations, added)
		}
		if got := celTrue(t, v.Validations[0].Expression, after); got != tc.admitted {
			t.Errorf("%s: validating policy admits %v after the mutation, want %v (annotations %v)", tc.name, got, tc.admitted, after.Annotations)
		}
	}
	for _, p := range []*corev1.Pod{admissionPod("", nil, nil, nil), admissionPod("runc", other, other, nil)} {
		if allConditions(t, m.MatchConditions, p) || allConditions(t, v.MatchConditions, p) {
			t.Errorf("a pod without RuntimeClass %s or %s (%+v) matches a policy", runtimeClass, res, p.Spec)
		}
	}
	if !strings.Contains(v.Validations[0].Message, "container-scoped") {
		t.Errorf("validating message %q does not name the container-scoped override it refuses", v.Validations[0].Message)
	}
}

func TestAdmissionPolicies(t *testing.T) {
	t.Run("kustomize", func(t *testing.T) {
		checkAdmissionPolicies(t, kustomize(t, "."), "nvidia", "nvidia.com/gpu", "nvinject")
	})
	t.Run("helm", func(t *testing.T) {
		checkAdmissionPolicies(t, helm(t, nil), "nvidia", "nvidia.com/gpu", "nvinject")
	})
	t.Run("helm settings", func(t *testing.T) {
		o := helm(t, map[string]any{"resourceName": "example.com/gpu", "nri": map[string]any{"runtimeHandler": "gpu", "pluginName": "gpucheck"}})
		checkAdmissionPolicies(t, o, "gpu", "example.com/gpu", "gpucheck")
	})
}

// TestHelmAdmissionPolicyToggles: each policy is on by default and goes
// with its own value, leaving the other.
func TestHelmAdmissionPolicyToggles(t *testing.T) {
	off := map[string]any{"create": false}
	if o := helm(t, map[string]any{"addNRIAnnotationPolicy": off}); len(o.mutators)+len(o.mutatorBind) != 0 || len(o.policies) != 1 {
		t.Errorf("addNRIAnnotationPolicy.create=false: %d mutating objects, %d validating policies; want 0 and 1", len(o.mutators)+len(o.mutatorBind), len(o.policies))
	}
	if o := helm(t, map[string]any{"requireNRIPolicy": off}); len(o.policies)+len(o.bindings) != 0 || len(o.mutators) != 1 || len(o.mutatorBind) != 1 {
		t.Errorf("requireNRIPolicy.create=false: %d validating objects, %d mutating policies; want 0 and 1", len(o.policies)+len(o.bindings), len(o.mutators))
	}
}
