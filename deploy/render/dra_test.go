package render

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/nvinject/nvinject/shared/contract"
)

// draOverlays are the DRA-mode overlays, checked here rather than in
// builds: they carry a third DaemonSet and the DRA objects.
var draOverlays = []string{"overlays/dra-node", "overlays/local-sim-dra"}

const draDaemonSet = "nvinject-dra"

// draObjects are the DRA component's objects of a rendered stream.
type draObjects struct {
	classes  []resourceapi.DeviceClass
	accounts []corev1.ServiceAccount
	roles    []rbacv1.ClusterRole
	bindings []rbacv1.ClusterRoleBinding
}

// splitDRA decodes the DRA component's documents strictly and returns the
// rest for decode.
func splitDRA(t *testing.T, stream []byte) (draObjects, []byte) {
	t.Helper()
	var d draObjects
	var rest [][]byte
	for i, doc := range bytes.Split(stream, []byte("\n---")) {
		var tm struct {
			APIVersion, Kind string
			Metadata         struct{ Name string }
		}
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var err error
		kind := tm.APIVersion + "/" + tm.Kind
		if tm.Kind != "DeviceClass" && tm.Metadata.Name != draDaemonSet {
			kind = "" // nvinject-nri's RBAC is the base's
		}
		switch kind {
		case "resource.k8s.io/v1/DeviceClass":
			_, err = into(doc, &d.classes)
		case "v1/ServiceAccount":
			_, err = into(doc, &d.accounts)
		case "rbac.authorization.k8s.io/v1/ClusterRole":
			_, err = into(doc, &d.roles)
		case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
			_, err = into(doc, &d.bindings)
		default:
			rest = append(rest, doc)
		}
		if err != nil {
			t.Fatalf("document %d (%s): %v", i, tm.Kind, err)
		}
	}
	return d, bytes.Join(rest, []byte("\n---"))
}

func TestDRAOverlays(t *testing.T) {
	for _, dir := range draOverlays {
		t.Run(dir, func(t *testing.T) {
			out, err := Kustomize(dir)
			if err != nil {
				t.Fatal(err)
			}
			d, rest := splitDRA(t, out)
			o := decode(t, rest)
			checkDeviceClass(t, d)
			if len(d.accounts) != 1 || len(d.roles) != 1 || len(d.bindings) != 1 || d.bindings[0].Subjects[0].Name != d.accounts[0].Name ||
				d.bindings[0].RoleRef.Name != d.roles[0].Name || d.accounts[0].Namespace != "nvidia-device-plugin" {
				t.Errorf("RBAC: accounts %+v roles %d bindings %+v", d.accounts, len(d.roles), d.bindings)
			}
			if len(o.daemonSets) != 3 {
				t.Fatalf("%d DaemonSets, want the device plugin, the NRI plugin and nvinject-dra", len(o.daemonSets))
			}
			checkOneOwner(t, o.daemonSets[devicePlugin], o.daemonSets[draDaemonSet])
			checkDRADaemonSet(t, o.daemonSets[draDaemonSet], dir == "overlays/local-sim-dra")
		})
	}
}

func checkDeviceClass(t *testing.T, d draObjects) {
	t.Helper()
	want := map[string]string{
		"gpu.nvinject.io":       `device.driver == "gpu.nvinject.io" && device.attributes["gpu.nvinject.io"].type != "share"`,
		"gpu-share.nvinject.io": `device.driver == "gpu.nvinject.io" && device.attributes["gpu.nvinject.io"].type == "share"`,
	}
	if len(d.classes) != len(want) {
		t.Fatalf("%d DeviceClasses, want gpu.nvinject.io and gpu-share.nvinject.io", len(d.classes))
	}
	for _, c := range d.classes {
		expr, ok := want[c.Name]
		if !ok {
			t.Errorf("unexpected DeviceClass %s", c.Name)
			continue
		}
		serves := c.Spec.ExtendedResourceName != nil && *c.Spec.ExtendedResourceName == "nvidia.com/gpu"
		if serves != (c.Name == "gpu.nvinject.io") {
			t.Errorf("DeviceClass %s extendedResourceName %v; only gpu.nvinject.io serves nvidia.com/gpu (a share is no whole GPU)", c.Name, c.Spec.ExtendedResourceName)
		}
		if len(c.Spec.Selectors) != 1 || c.Spec.Selectors[0].CEL == nil || c.Spec.Selectors[0].CEL.Expression != expr {
			t.Errorf("DeviceClass %s selectors %+v, want %s", c.Name, c.Spec.Selectors, expr)
		}
	}
}

// checkOneOwner: no node label value lets both the device plugin and
// nvinject-dra run.
func checkOneOwner(t *testing.T, dp, dra appsv1.DaemonSet) {
	t.Helper()
	aff := dp.Spec.Template.Spec.Affinity
	if aff == nil || aff.NodeAffinity == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatalf("device plugin has no required node affinity keeping it off DRA-mode nodes")
	}
	terms := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	want := corev1.NodeSelectorRequirement{Key: "nvinject.io/gpu-mode", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"dra"}}
	if len(terms) != 1 || !slices.ContainsFunc(terms[0].MatchExpressions, func(r corev1.NodeSelectorRequirement) bool { return reflect.DeepEqual(r, want) }) {
		t.Errorf("device plugin affinity %+v, want %+v", terms, want)
	}
	if dra.Spec.Template.Spec.NodeSelector["nvinject.io/gpu-mode"] != "dra" {
		t.Errorf("nvinject-dra nodeSelector %v lacks nvinject.io/gpu-mode=dra", dra.Spec.Template.Spec.NodeSelector)
	}
}

func checkDRADaemonSet(t *testing.T, ds appsv1.DaemonSet, local bool) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	if errs := validatePodSpec(field.NewPath("spec", "template", "spec"), ds.Spec.Template.ObjectMeta, spec); len(errs) > 0 {
		t.Errorf("nvinject-dra: %v", errs.ToAggregate())
	}
	if spec.ServiceAccountName != "nvinject-dra" || spec.PriorityClassName != "system-node-critical" {
		t.Errorf("serviceAccount %q priorityClass %q", spec.ServiceAccountName, spec.PriorityClassName)
	}
	c := spec.Containers[0]
	checkSecurity(t, draDaemonSet, c, false)
	if !slices.Contains(c.Args, "--metrics-addr=:9483") || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.Ports[0].ContainerPort != 9483 {
		t.Errorf("metrics/probes: args %v readiness %+v ports %+v", c.Args, c.ReadinessProbe, c.Ports)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["NODE_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME = %+v, want the downward API's spec.nodeName", e)
	}
	if e := env["NVIDIA_VISIBLE_DEVICES"]; e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil || e.ValueFrom.ConfigMapKeyRef.Key != "selected-gpu-uuid" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %+v, want the ConfigMap key", e)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil && slices.Contains([]string{"plugins-registry", "plugins", "device-plugins", "cdi-hook", "pod-resources"}, v.Name) && mounts[v.Name] != v.HostPath.Path {
			t.Errorf("volume %s: host %s mounted at %s; kubelet and the CDI spec name the host path, so it must be the same inside", v.Name, v.HostPath.Path, mounts[v.Name])
		}
	}
	// nvinject-dra rewrites the node's one CDI spec: hooks as the device
	// plugin's, from the hook its init container installs.
	for _, a := range []string{"--hook-binary=/var/lib/nvinject/bin/nvinject-cdi-hook", "--kubelet-dir=/var/lib/kubelet/device-plugins", "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock", "--owner-label=nvinject.io/gpu-mode"} {
		if !slices.Contains(c.Args, a) {
			t.Errorf("nvinject-dra args %v lack %s", c.Args, a)
		}
	}
	if ic := spec.InitContainers; len(ic) != 1 || len(ic[0].Command) == 0 || ic[0].Command[0] != "/usr/bin/nvinject-cdi-hook" || ic[0].Image != c.Image {
		t.Errorf("init containers %+v, want install-cdi-hook from nvinject-dra's image", ic)
	}
	wantImage := "ghcr.io/nvinject/nvinject-dra:v0.2.0"
	if local {
		wantImage = "ghcr.io/nvinject/nvinject-dra:v0.2.0"
		if !spec.HostNetwork || env["KUBERNETES_SERVICE_HOST"].Value != "127.0.0.1" || !slices.Contains(c.Args, "--nvml=sim:a100-80gb") {
			t.Errorf("local node: hostNetwork %v, KUBERNETES_SERVICE_HOST %q, args %v; want the loopback API server and the simulated NVML", spec.HostNetwork, env["KUBERNETES_SERVICE_HOST"].Value, c.Args)
		}
	} else if spec.HostNetwork {
		t.Error("nvinject-dra shares the host network outside the local node")
	}
	if c.Image != wantImage {
		t.Errorf("image %s, want %s", c.Image, wantImage)
	}
}

// The ResourceClaimTemplate example selects by the memory capacity the
// driver publishes.
func TestDRAClaimExample(t *testing.T) {
	data, err := os.ReadFile("../examples/dra/gpu-80gb-claim.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs := bytes.Split(data, []byte("\n---"))
	if len(docs) != 2 {
		t.Fatalf("%d documents, want the template and a pod", len(docs))
	}
	var tmpl []resourceapi.ResourceClaimTemplate
	if _, err := into(docs[0], &tmpl); err != nil {
		t.Fatal(err)
	}
	req := tmpl[0].Spec.Spec.Devices.Requests[0]
	if req.Exactly == nil || req.Exactly.DeviceClassName != "gpu.nvinject.io" || len(req.Exactly.Selectors) != 1 ||
		!strings.Contains(req.Exactly.Selectors[0].CEL.Expression, fmt.Sprintf(`device.capacity[%q].memory`, "gpu.nvinject.io")) ||
		!strings.Contains(req.Exactly.Selectors[0].CEL.Expression, `quantity("80Gi")`) {
		t.Errorf("request %+v, want gpu.nvinject.io with memory >= 80Gi by CEL", req)
	}
	o := decode(t, docs[1])
	p := o.pods[0]
	if p.Spec.ResourceClaims[0].ResourceClaimTemplateName == nil || *p.Spec.ResourceClaims[0].ResourceClaimTemplateName != tmpl[0].Name ||
		p.Spec.Containers[0].Resources.Claims[0].Name != p.Spec.ResourceClaims[0].Name || *p.Spec.RuntimeClassName != "nvidia" {
		t.Errorf("pod %+v does not use the template's claim under RuntimeClass nvidia", p.Spec)
	}
}

// checkOwnerLabel: nvinject-dra is told by --owner-label the node label its
// DaemonSet selects by, with the value that selects it (contract.DRAModeLabel=
// contract.DRAModeDRA), so it tells a node leaving DRA from a restart.
func checkOwnerLabel(t *testing.T, what string, ds appsv1.DaemonSet) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	if got := spec.NodeSelector[contract.DRAModeLabel]; got != contract.DRAModeDRA {
		t.Errorf("%s: nvinject-dra's nodeSelector %v lacks %s=%s", what, spec.NodeSelector, contract.DRAModeLabel, contract.DRAModeDRA)
	}
	if !slices.Contains(spec.Containers[0].Args, "--owner-label="+contract.DRAModeLabel) {
		t.Errorf("%s: nvinject-dra args %v lack --owner-label=%s", what, spec.Containers[0].Args, contract.DRAModeLabel)
	}
}

// TestHelmModes: mode=by-label renders the dra-node overlay's DaemonSets;
// mode=dra has the overlay's nvinject-dra and no device plugin; the default
// has no DRA objects.
func TestHelmModes(t *testing.T) {
	render := func(values map[string]any) (draObjects, objects) {
		t.Helper()
		out, err := Helm(values)
		if err != nil {
			t.Fatalf("Helm(%v): %v", values, err)
		}
		d, rest := splitDRA(t, out)
		return d, decode(t, rest)
	}
	kout, err := Kustomize("overlays/dra-node")
	if err != nil {
		t.Fatal(err)
	}
	_, krest := splitDRA(t, kout)
	k := decode(t, krest)
	hd, h := render(map[string]any{"mode": "by-label"})
	checkDeviceClass(t, hd)
	if len(h.daemonSets) != 3 {
		t.Fatalf("by-label: %d DaemonSets, want 3", len(h.daemonSets))
	}
	for name, kds := range k.daemonSets {
		if hds := h.daemonSets[name]; !reflect.DeepEqual(important(hds), important(kds)) {
			t.Errorf("by-label: DaemonSet %s differs:\nhelm      %+v\nkustomize %+v", name, important(hds), important(kds))
		}
	}
	dd, dra := render(map[string]any{"mode": "dra"})
	checkDeviceClass(t, dd)
	if _, ok := dra.daemonSets[devicePlugin]; ok || len(dra.daemonSets) != 2 {
		t.Errorf("mode=dra renders DaemonSets %v; want nvinject-dra and the NRI plugin only", len(dra.daemonSets))
	}
	// The overlays' nvinject-dra: selected by nvinject.io/gpu-mode=dra and
	// told so by --owner-label, so unlabeling a node deletes its slices at
	// once rather than kubelet 30 s after the plugin is gone.
	if hds, kds := dra.daemonSets[draDaemonSet], k.daemonSets[draDaemonSet]; !reflect.DeepEqual(important(hds), important(kds)) {
		t.Errorf("mode=dra: DaemonSet %s differs from overlays/dra-node's:\nhelm      %+v\nkustomize %+v", draDaemonSet, important(hds), important(kds))
	}
	checkOwnerLabel(t, "mode=dra", dra.daemonSets[draDaemonSet])
	checkOwnerLabel(t, "mode=by-label", h.daemonSets[draDaemonSet])
	checkOwnerLabel(t, "overlays/dra-node", k.daemonSets[draDaemonSet])
	nd, def := render(nil)
	if len(nd.classes)+len(nd.roles) != 0 || len(def.daemonSets) != 2 {
		t.Errorf("default mode renders DRA objects or %d DaemonSets", len(def.daemonSets))
	}
	if _, err := Helm(map[string]any{"mode": "both"}); err == nil {
		t.Error("mode=both accepted")
	}
}

// TestDRAComponents: components/dra-gpu-shares and dra-mig-on-demand over
// overlays/dra-node add their flag to nvinject-dra, the second also making
// it privileged (the MIG config capability) with its driver root still
// read-only; the chart's dra.gpuShares and dra.migOnDemand render the same
// DaemonSets; an unknown component is refused by name.
func TestDRAComponents(t *testing.T) {
	for _, tc := range []struct {
		components []string
		values     map[string]any
		flags      []string
		privileged bool
	}{
		{nil, map[string]any{}, nil, false},
		{[]string{"dra-gpu-shares"}, map[string]any{"gpuShares": true}, []string{"--gpu-shares"}, false},
		{[]string{"dra-mig-on-demand"}, map[string]any{"migOnDemand": true}, []string{"--mig-on-demand"}, true},
		{[]string{"dra-gpu-shares", "dra-mig-on-demand"}, map[string]any{"gpuShares": true, "migOnDemand": true}, []string{"--gpu-shares", "--mig-on-demand"}, true},
	} {
		t.Run(fmt.Sprint(tc.components), func(t *testing.T) {
			out, err := Kustomize("overlays/dra-node", WithComponents(tc.components...))
			if err != nil {
				t.Fatal(err)
			}
			_, rest := splitDRA(t, out)
			k := decode(t, rest)
			ds := k.daemonSets[draDaemonSet]
			c := ds.Spec.Template.Spec.Containers[0]
			checkSecurity(t, draDaemonSet, c, tc.privileged)
			for _, f := range []string{"--gpu-shares", "--mig-on-demand"} {
				if got, want := slices.Contains(c.Args, f), slices.Contains(tc.flags, f); got != want {
					t.Errorf("args %v: %s present %v, want %v", c.Args, f, got, want)
				}
			}
			for _, m := range c.VolumeMounts {
				if m.Name == "driver-root" && !m.ReadOnly {
					t.Error("the driver root is mounted writable")
				}
			}
			checkSecurity(t, devicePlugin, k.daemonSets[devicePlugin].Spec.Template.Spec.Containers[0], false)
			out, err = Helm(map[string]any{"mode": "by-label", "dra": tc.values})
			if err != nil {
				t.Fatal(err)
			}
			_, hrest := splitDRA(t, out)
			h := decode(t, hrest)
			if hds := h.daemonSets[draDaemonSet]; !reflect.DeepEqual(important(hds), important(ds)) {
				t.Errorf("helm dra=%v differs from the components:\nhelm      %+v\nkustomize %+v", tc.values, important(hds), important(ds))
			}
		})
	}
	if _, err := Kustomize("overlays/dra-node", WithComponents("dra-mig-on-demnad")); err == nil || !strings.Contains(err.Error(), "dra-mig-on-demnad") {
		t.Errorf("a misspelt component: %v, want an error naming it", err)
	}
}
