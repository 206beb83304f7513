package render

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// objects is a rendered stream decoded strictly into k8s.io/api types.
type objects struct {
	namespaces  []corev1.Namespace
	configMaps  []corev1.ConfigMap
	daemonSets  map[string]appsv1.DaemonSet
	runtimes    []nodev1.RuntimeClass
	policies    []admissionv1.ValidatingAdmissionPolicy
	bindings    []admissionv1.ValidatingAdmissionPolicyBinding
	mutators    []admissionv1.MutatingAdmissionPolicy
	mutatorBind []admissionv1.MutatingAdmissionPolicyBinding
	deployments []appsv1.Deployment
	services    []corev1.Service
	pods        []corev1.Pod
	accounts    []corev1.ServiceAccount
	roles       []rbacv1.ClusterRole
	roleBinds   []rbacv1.ClusterRoleBinding
	all         []metav1.Object
}

// decode splits a YAML stream and decodes each document into its API type,
// rejecting unknown and duplicate fields, then runs apimachinery's
// validation of names, labels and annotations.
func decode(t *testing.T, stream []byte) objects {
	t.Helper()
	o := objects{daemonSets: map[string]appsv1.DaemonSet{}}
	for i, doc := range bytes.Split(stream, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		var obj metav1.Object
		var err error
		switch tm.APIVersion + "/" + tm.Kind {
		case "v1/Namespace":
			obj, err = into(doc, &o.namespaces)
		case "v1/ConfigMap":
			obj, err = into(doc, &o.configMaps)
		case "apps/v1/DaemonSet":
			var list []appsv1.DaemonSet
			obj, err = into(doc, &list)
			if err == nil {
				o.daemonSets[list[0].Name] = list[0]
			}
		case "node.k8s.io/v1/RuntimeClass":
			obj, err = into(doc, &o.runtimes)
		case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy":
			obj, err = into(doc, &o.policies)
		case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding":
			obj, err = into(doc, &o.bindings)
		case "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy":
			obj, err = into(doc, &o.mutators)
		case "admissionregistration.k8s.io/v1/MutatingAdmissionPolicyBinding":
			obj, err = into(doc, &o.mutatorBind)
		case "apps/v1/Deployment":
			obj, err = into(doc, &o.deployments)
		case "v1/Service":
			obj, err = into(doc, &o.services)
		case "v1/Pod":
			obj, err = into(doc, &o.pods)
		case "v1/ServiceAccount":
			obj, err = into(doc, &o.accounts)
		case "rbac.authorization.k8s.io/v1/ClusterRole":
			obj, err = into(doc, &o.roles)
		case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
			obj, err = into(doc, &o.roleBinds)
		default:
			t.Fatalf("document %d: unexpected %s %s", i, tm.APIVersion, tm.Kind)
		}
		if err != nil {
			t.Fatalf("document %d (%s): %v\n%s", i, tm.Kind, err, doc)
		}
		o.all = append(o.all, obj)
		if errs := validateMeta(obj); len(errs) > 0 {
			t.Errorf("%s %s: %v", tm.Kind, obj.GetName(), errs.ToAggregate())
		}
	}
	return o
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// into decodes doc strictly and appends it to list; T's pointer is a
// metav1.Object for every API type used here.
func into[T any, PT interface {
	*T
	metav1.Object
}](doc []byte, list *[]T) (metav1.Object, error) {
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		return nil, err
	}
	*list = append(*list, v)
	return PT(&(*list)[len(*list)-1]), nil
}

func validateMeta(obj metav1.Object) field.ErrorList {
	p := field.NewPath("metadata")
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(obj.GetName()) {
		errs = append(errs, field.Invalid(p.Child("name"), obj.GetName(), msg))
	}
	if ns := obj.GetNamespace(); ns != "" {
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(p.Child("namespace"), ns, msg))
		}
	}
	errs = append(errs, metav1validation.ValidateLabels(obj.GetLabels(), p.Child("labels"))...)
	errs = append(errs, apivalidation.ValidateAnnotations(obj.GetAnnotations(), p.Child("annotations"))...)
	return errs
}

// validatePodSpec checks what the API server would reject in the fields
// these manifests use.
func validatePodSpec(p *field.Path, meta metav1.ObjectMeta, spec corev1.PodSpec) field.ErrorList {
	errs := metav1validation.ValidateLabels(meta.Labels, p.Child("metadata", "labels"))
	errs = append(errs, apivalidation.ValidateAnnotations(meta.Annotations, p.Child("metadata", "annotations"))...)
	volumes := map[string]bool{}
	for i, v := range spec.Volumes {
		vp := p.Child("volumes").Index(i)
		for _, msg := range validation.IsDNS1123Label(v.Name) {
			errs = append(errs, field.Invalid(vp.Child("name"), v.Name, msg))
		}
		if volumes[v.Name] {
			errs = append(errs, field.Duplicate(vp.Child("name"), v.Name))
		}
		volumes[v.Name] = true
		if v.HostPath != nil && !strings.HasPrefix(v.HostPath.Path, "/") {
			errs = append(errs, field.Invalid(vp.Child("hostPath", "path"), v.HostPath.Path, "must be absolute"))
		}
	}
	for i, c := range spec.Containers {
		cp := p.Child("containers").Index(i)
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			errs = append(errs, field.Invalid(cp.Child("name"), c.Name, msg))
		}
		for j, e := range c.Env {
			for _, msg := range validation.IsEnvVarName(e.Name) {
				errs = append(errs, field.Invalid(cp.Child("env").Index(j).Child("name"), e.Name, msg))
			}
		}
		for j, port := range c.Ports {
			for _, msg := range validation.IsValidPortName(port.Name) {
				errs = append(errs, field.Invalid(cp.Child("ports").Index(j).Child("name"), port.Name, msg))
			}
			for _, msg := range validation.IsValidPortNum(int(port.ContainerPort)) {
				errs = append(errs, field.Invalid(cp.Child("ports").Index(j).Child("containerPort"), port.ContainerPort, msg))
			}
		}
		for j, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				errs = append(errs, field.NotFound(cp.Child("volumeMounts").Index(j).Child("name"), m.Name))
			}
		}
		for name, q := range c.Resources.Requests {
			if lim, ok := c.Resources.Limits[name]; ok && q.Cmp(lim) > 0 {
				errs = append(errs, field.Invalid(cp.Child("resources", "requests").Key(string(name)), q.String(), fmt.Sprintf("must be <= limit %s", lim.String())))
			}
		}
	}
	return errs
}
