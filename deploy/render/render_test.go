package render

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nvinject/nvinject/shared/contract"
)

const (
	devicePlugin = "single-gpu-device-plugin"
	nri          = "nvinject-nri"
	// devicePluginAccount labels the device plugin's Node.
	devicePluginAccount = "nvinject-device-plugin"
)

// simUUID mirrors shared/gpu/sim.UUID, which the local-sim overlay's default
// selected-gpu-uuid must equal for model a100-80gb, GPU 0.
func simUUID(model string, index int) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("nvinject-sim/%s/%d", model, index)))
	h[6] = (h[6] & 0x0f) | 0x50
	h[8] = (h[8] & 0x3f) | 0x80
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

type build struct {
	dir          string
	selectedGPU  string
	nodeSelector map[string]string
	images       map[string]string // container name -> image
	pullPolicy   corev1.PullPolicy
	nvml         string
	driverRoot   string
	// privileged: the device plugin's container, on CDI-only nodes.
	privileged bool
	// localAPI: the device plugin on hostNetwork with the API server's
	// loopback address (the local node has no kube-proxy).
	localAPI bool
}

var (
	gpuLabel = map[string]string{"nvidia.com/gpu.present": "true"}
	released = map[string]string{
		"device-plugin": "ghcr.io/nvinject/nvinject-device-plugin:v0.2.0",
		"nri":           "ghcr.io/nvinject/nvinject-nri:v0.2.0",
	}
	builds = []build{
		{dir: ".", selectedGPU: "all", nodeSelector: gpuLabel, images: released, pullPolicy: corev1.PullIfNotPresent, nvml: "real", driverRoot: "/"},
		{dir: "overlays/nvkind-worker", selectedGPU: "GPU-00000000-0000-0000-0000-000000000000",
			nodeSelector: map[string]string{"kubernetes.io/hostname": "k8s-ai-infra-worker"}, images: released, pullPolicy: corev1.PullIfNotPresent, nvml: "real", driverRoot: "/"},
		{dir: "overlays/multi-gpu", selectedGPU: "all", nodeSelector: gpuLabel, images: released, pullPolicy: corev1.PullIfNotPresent, nvml: "real", driverRoot: "/"},
		{dir: "overlays/cdi-only-node", selectedGPU: "all", nodeSelector: gpuLabel, images: released, pullPolicy: corev1.PullIfNotPresent, nvml: "real", driverRoot: "/", privileged: true},
		{dir: "overlays/local-sim", selectedGPU: simUUID("a100-80gb", 0),
			nodeSelector: map[string]string{"kubernetes.io/hostname": "nvinject-sim-worker"},
			images:       released, pullPolicy: corev1.PullNever, nvml: "sim:a100-80gb", driverRoot: "/var/lib/nvinject-sim/driver-root", localAPI: true},
	}
)

func kustomize(t *testing.T, dir string, opts ...Option) objects {
	t.Helper()
	out, err := Kustomize(dir, opts...)
	if err != nil {
		t.Fatalf("Kustomize(%q): %v", dir, err)
	}
	return decode(t, out)
}

// TestOverlaysCovered fails when an overlay directory is added without a
// row in builds.
func TestOverlaysCovered(t *testing.T) {
	dirs, err := filepath.Glob("../overlays/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		want := "overlays/" + filepath.Base(d)
		if !slices.ContainsFunc(builds, func(b build) bool { return b.dir == want }) && !slices.Contains(draOverlays, want) {
			t.Errorf("%s has no row in builds", want)
		}
	}
}

func TestKustomizeObjects(t *testing.T) {
	for _, b := range builds {
		t.Run(b.dir, func(t *testing.T) {
			o := kustomize(t, b.dir)
			if len(o.namespaces) != 1 || o.namespaces[0].Name != "nvidia-device-plugin" {
				t.Errorf("namespaces = %v, want nvidia-device-plugin", o.namespaces)
			}
			if len(o.configMaps) != 2 || o.configMaps[0].Name != devicePlugin || o.configMaps[0].Namespace != "nvidia-device-plugin" {
				t.Fatalf("configMaps = %+v", o.configMaps)
			}
			checkSharedSettings(t, o, contract.ResourceName, contract.CDIVendor, contract.CDIClass, contract.AnnotationPrefix)
			if got := o.configMaps[0].Data; !reflect.DeepEqual(got, map[string]string{"selected-gpu-uuid": b.selectedGPU}) {
				t.Errorf("ConfigMap data = %v, want selected-gpu-uuid %s", got, b.selectedGPU)
			}
			if len(o.runtimes) != 1 || o.runtimes[0].Name != "nvidia" || o.runtimes[0].Handler != "nvidia" {
				t.Errorf("RuntimeClass = %+v, want nvidia/nvidia", o.runtimes)
			}
			if len(o.policies) != 1 || len(o.bindings) != 1 || o.bindings[0].Spec.PolicyName != o.policies[0].Name {
				t.Errorf("admission policy %+v not bound by %+v", o.policies, o.bindings)
			}
			if len(o.mutators) != 1 || len(o.mutatorBind) != 1 || o.mutatorBind[0].Spec.PolicyName != o.mutators[0].Name {
				t.Errorf("mutating admission policy %+v not bound by %+v", o.mutators, o.mutatorBind)
			}
			if len(o.daemonSets) != 2 {
				t.Fatalf("daemonSets = %v, want %s and %s", len(o.daemonSets), devicePlugin, nri)
			}
			for name, ds := range o.daemonSets {
				checkDaemonSet(t, name, ds, b)
			}
		})
	}
}

// checkSharedSettings: the settings both daemons must agree on reach both
// from the one nvinject-settings ConfigMap, with the given values, and no
// DaemonSet overrides one with a flag.
func checkSharedSettings(t *testing.T, o objects, resource, vendor, class, prefix string) {
	t.Helper()
	var settings *corev1.ConfigMap
	for i := range o.configMaps {
		if o.configMaps[i].Name == "nvinject-settings" {
			settings = &o.configMaps[i]
		}
	}
	if settings == nil {
		t.Fatalf("no nvinject-settings ConfigMap among %d", len(o.configMaps))
	}
	want := map[string]string{
		"NVINJECT_RESOURCE_NAME": resource, "NVINJECT_CDI_VENDOR": vendor,
		"NVINJECT_CDI_CLASS": class, "NVINJECT_CDI_ANNOTATION_PREFIX": prefix,
	}
	if !reflect.DeepEqual(settings.Data, want) {
		t.Errorf("nvinject-settings = %v, want %v", settings.Data, want)
	}
	for _, name := range []string{devicePlugin, nri} {
		c := o.daemonSets[name].Spec.Template.Spec.Containers[0]
		if len(c.EnvFrom) != 1 || c.EnvFrom[0].ConfigMapRef == nil || c.EnvFrom[0].ConfigMapRef.Name != "nvinject-settings" {
			t.Errorf("%s does not read nvinject-settings: envFrom %+v", name, c.EnvFrom)
		}
		for _, a := range c.Args {
			for _, flag := range []string{"--resource-name", "--cdi-vendor", "--cdi-class", "--cdi-annotation-prefix", "--annotation-prefix"} {
				if strings.HasPrefix(a, flag+"=") {
					t.Errorf("%s overrides the shared setting with %s", name, a)
				}
			}
		}
		for _, e := range c.Env {
			if _, shared := want[e.Name]; shared {
				t.Errorf("%s overrides the shared setting with env %s", name, e.Name)
			}
		}
		if c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
			t.Errorf("%s: terminationMessagePolicy %q, want FallbackToLogsOnError (the doctor reads a crash's last error there)", name, c.TerminationMessagePolicy)
		}
	}
}

func checkDaemonSet(t *testing.T, name string, ds appsv1.DaemonSet, b build) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	if errs := validatePodSpec(field.NewPath("spec", "template", "spec"), ds.Spec.Template.ObjectMeta, spec); len(errs) > 0 {
		t.Errorf("%s: %v", name, errs.ToAggregate())
	}
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("%s: selector %s=%s does not match the template labels", name, k, v)
		}
	}
	if ds.Namespace != "nvidia-device-plugin" || ds.Labels["app.kubernetes.io/part-of"] != "nvinject" {
		t.Errorf("%s: namespace %q labels %v", name, ds.Namespace, ds.Labels)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("%s: priorityClassName = %q", name, spec.PriorityClassName)
	}
	if !reflect.DeepEqual(spec.NodeSelector, b.nodeSelector) {
		t.Errorf("%s: nodeSelector = %v, want %v", name, spec.NodeSelector, b.nodeSelector)
	}
	if (spec.HostNetwork && !(name == devicePlugin && b.localAPI)) || spec.HostPID || spec.HostIPC {
		t.Errorf("%s: shares a host namespace", name)
	}
	// nvinject-nri's token creates its audit Events, the device plugin's
	// labels its Node.
	wantSA := map[string]string{nri: nri, devicePlugin: devicePluginAccount}[name]
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken != (wantSA != "") || spec.ServiceAccountName != wantSA {
		t.Errorf("%s: service account %q, token mounted %v; want %q and a token only for it", name, spec.ServiceAccountName, spec.AutomountServiceAccountToken, wantSA)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers", name, len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.Image != b.images[c.Name] || c.ImagePullPolicy != b.pullPolicy {
		t.Errorf("%s: image %s (%s), want %s (%s)", name, c.Image, c.ImagePullPolicy, b.images[c.Name], b.pullPolicy)
	}
	checkSecurity(t, name, c, b.privileged && name == devicePlugin)
	checkResources(t, name, c)
	checkProbes(t, name, c)
}

func checkSecurity(t *testing.T, name string, c corev1.Container, privileged bool) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Fatalf("%s: no securityContext", name)
	}
	if sc.Privileged == nil || *sc.Privileged != privileged {
		t.Errorf("%s: privileged must be explicitly %v", name, privileged)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation != privileged {
		t.Errorf("%s: allowPrivilegeEscalation must be %v", name, privileged)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: readOnlyRootFilesystem must be true", name)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("%s: capabilities = %+v, want drop [ALL] and no add", name, sc.Capabilities)
	}
}

func checkResources(t *testing.T, name string, c corev1.Container) {
	t.Helper()
	want := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("20m"), corev1.ResourceMemory: resource.MustParse("40Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
	for _, list := range []struct{ got, want corev1.ResourceList }{{c.Resources.Requests, want.Requests}, {c.Resources.Limits, want.Limits}} {
		if len(list.got) != len(list.want) {
			t.Errorf("%s: resources %v, want %v", name, c.Resources, want)
			return
		}
		for k, q := range list.want {
			if g := list.got[k]; g.Cmp(q) != 0 {
				t.Errorf("%s: %s = %s, want %s", name, k, g.String(), q.String())
			}
		}
	}
}

// checkProbes: liveness on /healthz and readiness on /readyz, at the port
// the daemon's --metrics-addr listens on.
func checkProbes(t *testing.T, name string, c corev1.Container) {
	t.Helper()
	wantPort := map[string]int32{"device-plugin": 9481, "nri": 9482}[c.Name]
	if !slices.Contains(c.Args, fmt.Sprintf("--metrics-addr=:%d", wantPort)) {
		t.Errorf("%s: args %v lack --metrics-addr=:%d", name, c.Args, wantPort)
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: missing HTTP probe for %s", name, p.path)
			continue
		}
		get := p.probe.HTTPGet
		idx := slices.IndexFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == get.Port.String() })
		if get.Path != p.path || idx < 0 || c.Ports[idx].ContainerPort != wantPort {
			t.Errorf("%s: probe %s on port %s, want %s on %d", name, get.Path, get.Port.String(), p.path, wantPort)
		}
	}
}

// TestDevicePluginEnvIsTheSeeds: the env block is the example's, verbatim,
// then NODE_NAME (the Node the GPU labels go on) and on the local node the
// API server's loopback address.
func TestDevicePluginEnvIsTheSeeds(t *testing.T) {
	seed := []corev1.EnvVar{
		{Name: "NVIDIA_VISIBLE_DEVICES", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "single-gpu-device-plugin"}, Key: "selected-gpu-uuid"}}},
		{Name: "MIG_STRATEGY", Value: "none"},
		{Name: "DEVICE_LIST_STRATEGY", Value: "cdi-annotations,cdi-cri"},
		{Name: "DEVICE_ID_STRATEGY", Value: "uuid"},
		{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
	}
	for _, b := range builds {
		o := kustomize(t, b.dir)
		want := seed
		if b.localAPI {
			want = append(slices.Clone(seed), corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: "16443"})
		}
		if got := o.daemonSets[devicePlugin].Spec.Template.Spec.Containers[0].Env; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: env = %+v, want %+v", b.dir, got, want)
		}
		// nvinject-nri's one variable names the node in its audit Events.
		if got := o.daemonSets[nri].Spec.Template.Spec.Containers[0].Env; len(got) != 1 || got[0].Name != "NODE_NAME" {
			t.Errorf("%s: nri env = %+v, want NODE_NAME only", b.dir, got)
		}
	}
}

type mount struct {
	host      string
	hostType  corev1.HostPathType
	path      string
	readOnly  bool
	propagate corev1.MountPropagationMode
}

func TestHostPaths(t *testing.T) {
	for _, b := range builds {
		driverType := corev1.HostPathDirectory
		if strings.HasPrefix(b.nvml, "sim:") {
			driverType = corev1.HostPathDirectoryOrCreate
		}
		want := map[string][]mount{
			devicePlugin: {
				{"/var/lib/kubelet/device-plugins", corev1.HostPathDirectory, "/var/lib/kubelet/device-plugins", false, ""},
				{"/var/run/cdi", corev1.HostPathDirectoryOrCreate, "/var/run/cdi", false, ""},
				{b.driverRoot, driverType, "/driver-root", true, corev1.MountPropagationHostToContainer},
				{"/var/lib/nvinject/bin", corev1.HostPathDirectoryOrCreate, "/var/lib/nvinject/bin", true, ""},
				{"/var/lib/nvinject/device-plugin", corev1.HostPathDirectoryOrCreate, "/var/lib/nvinject/device-plugin", false, ""},
				{"/var/lib/kubelet/pod-resources", corev1.HostPathDirectory, "/var/lib/kubelet/pod-resources", true, ""},
				// The optional ConfigMap nvinject-sharing: no host path.
				{path: "/etc/nvinject/sharing"},
				{host: "/run/nvinject/mps", hostType: "DirectoryOrCreate", path: "/run/nvinject/mps"},
				{host: "/run/nvinject/mps/shm", hostType: "DirectoryOrCreate", path: "/dev/shm"},
			},
			nri: {
				{"/var/run/nri", corev1.HostPathDirectory, "/var/run/nri", false, ""},
				{"/var/run/cdi", corev1.HostPathDirectoryOrCreate, "/var/run/cdi", true, ""},
				{"/etc/cdi", corev1.HostPathDirectoryOrCreate, "/etc/cdi", true, ""},
				{"/var/lib/kubelet/pod-resources", corev1.HostPathDirectory, "/var/lib/kubelet/pod-resources", true, ""},
			},
		}
		if b.nvml != "real" {
			// SIMULATION: nvinject-nri reads the simulated driver's state.
			want[nri] = append(want[nri], mount{b.driverRoot, corev1.HostPathDirectoryOrCreate, "/driver-root", true, ""})
		}
		o := kustomize(t, b.dir)
		for name, ds := range o.daemonSets {
			if got := mounts(ds.Spec.Template.Spec); !reflect.DeepEqual(got, want[name]) {
				t.Errorf("%s %s: mounts\n got %+v\nwant %+v", b.dir, name, got, want[name])
			}
		}
	}
}

func mounts(spec corev1.PodSpec) []mount {
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	var out []mount
	for _, m := range spec.Containers[0].VolumeMounts {
		v := vols[m.Name]
		if v.HostPath == nil {
			out = append(out, mount{path: m.MountPath})
			continue
		}
		mt := mount{host: v.HostPath.Path, path: m.MountPath, readOnly: m.ReadOnly}
		if v.HostPath.Type != nil {
			mt.hostType = *v.HostPath.Type
		}
		if m.MountPropagation != nil {
			mt.propagate = *m.MountPropagation
		}
		out = append(out, mt)
	}
	return out
}

func TestArgs(t *testing.T) {
	for _, b := range builds {
		o := kustomize(t, b.dir)
		dp := o.daemonSets[devicePlugin].Spec.Template.Spec.Containers[0].Args
		wantDP := []string{"--nvml=" + b.nvml, "--kubelet-dir=/var/lib/kubelet/device-plugins",
			"--cdi-spec-dir=/var/run/cdi", "--driver-root=/driver-root", "--host-driver-root=" + b.driverRoot, "--metrics-addr=:9481",
			"--hook-binary=/var/lib/nvinject/bin/nvinject-cdi-hook", "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
			"--sharing-config=/etc/nvinject/sharing/config.yaml", "--mps-dir=/run/nvinject/mps", "--host-mps-dir=/run/nvinject/mps", "--node-labels=true"}
		if !slices.Equal(dp, wantDP) {
			t.Errorf("%s: device plugin args\n got %v\nwant %v", b.dir, dp, wantDP)
		}
		wantNRI := []string{"--socket-path=/var/run/nri/nri.sock", "--plugin-name=nvinject", "--plugin-idx=10",
			"--cdi-spec-dir=/etc/cdi", "--cdi-spec-dir=/var/run/cdi", "--runtime-handler=nvidia",
			"--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock", "--metrics-addr=:9482"}
		if b.nvml != "real" {
			wantNRI = append(wantNRI, "--nvml="+b.nvml, "--driver-root=/driver-root")
		}
		if got := o.daemonSets[nri].Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, wantNRI) {
			t.Errorf("%s: nri args\n got %v\nwant %v", b.dir, got, wantNRI)
		}
	}
}

// TestImagesComeFromOneVariable: the raw manifests name only the image
// placeholders that kustomization.yaml's images: maps.
func TestImagesComeFromOneVariable(t *testing.T) {
	files, err := filepath.Glob("../base/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range decode(t, data).daemonSets {
			for _, c := range pod.Spec.Template.Spec.Containers {
				if c.Image != "nvinject-device-plugin" && c.Image != "nvinject-nri" {
					t.Errorf("%s: container %s uses image %q, not a placeholder mapped by kustomization.yaml images:", f, c.Name, c.Image)
				}
			}
		}
	}
}

func TestKustomizeOptions(t *testing.T) {
	o := kustomize(t, "overlays/local-sim",
		WithSelectedGPU(simUUID("a100-80gb", 3)),
		WithImages("localhost/dp:test", "localhost/nri:test"))
	if got := o.configMaps[0].Data["selected-gpu-uuid"]; got != simUUID("a100-80gb", 3) {
		t.Errorf("selected-gpu-uuid = %s", got)
	}
	for name, want := range map[string]string{devicePlugin: "localhost/dp:test", nri: "localhost/nri:test"} {
		c := o.daemonSets[name].Spec.Template.Spec.Containers[0]
		if c.Image != want || c.ImagePullPolicy != corev1.PullNever {
			t.Errorf("%s: image %s (%s), want %s (Never)", name, c.Image, c.ImagePullPolicy, want)
		}
	}
	if _, err := Kustomize("overlays/nope"); err == nil || !strings.Contains(err.Error(), "overlays/<name>") {
		t.Errorf("unknown overlay error = %v", err)
	}
}

// TestNRIAuditAccess: nvinject-nri's service account may create and patch
// Events (core and events.k8s.io) and nothing else, in the Kustomize base
// and overlays and the Helm chart alike; its pod knows its node's name.
func TestNRIAuditAccess(t *testing.T) {
	dra, err := Helm(map[string]any{"mode": "dra"})
	if err != nil {
		t.Fatal(err)
	}
	_, rest := splitDRA(t, dra)
	rendered := map[string]objects{"helm": helm(t, nil), "helm mode=dra": decode(t, rest)}
	for _, b := range builds {
		rendered[b.dir] = kustomize(t, b.dir)
	}
	for _, dir := range draOverlays {
		out, err := Kustomize(dir)
		if err != nil {
			t.Fatal(err)
		}
		_, rest := splitDRA(t, out)
		rendered[dir] = decode(t, rest)
	}
	for name, o := range rendered {
		t.Run(name, func(t *testing.T) {
			sa := slices.IndexFunc(o.accounts, func(a corev1.ServiceAccount) bool { return a.Name == nri })
			role := slices.IndexFunc(o.roles, func(r rbacv1.ClusterRole) bool { return r.Name == nri })
			bind := slices.IndexFunc(o.roleBinds, func(b rbacv1.ClusterRoleBinding) bool { return b.Name == nri })
			if sa < 0 || role < 0 || bind < 0 {
				t.Fatalf("service account %d, ClusterRole %d, binding %d: want all of %s", sa, role, bind, nri)
			}
			want := []rbacv1.PolicyRule{{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}}
			if got := o.roles[role].Rules; !reflect.DeepEqual(got, want) {
				t.Errorf("ClusterRole %s rules %+v, want %+v", nri, got, want)
			}
			rb := o.roleBinds[bind]
			if rb.RoleRef.Name != nri || len(rb.Subjects) != 1 || rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != nri ||
				rb.Subjects[0].Namespace != o.accounts[sa].Namespace || o.accounts[sa].Namespace != contract.Namespace {
				t.Errorf("binding %+v for account %s/%s", rb, o.accounts[sa].Namespace, o.accounts[sa].Name)
			}
			spec := o.daemonSets[nri].Spec.Template.Spec
			env := slices.IndexFunc(spec.Containers[0].Env, func(e corev1.EnvVar) bool {
				return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
			})
			if spec.ServiceAccountName != nri || env < 0 {
				t.Errorf("%s DaemonSet: service account %q, NODE_NAME from spec.nodeName %v", nri, spec.ServiceAccountName, env >= 0)
			}
		})
	}
}

// TestDevicePluginNodeAccess: the device plugin's service account may get
// and patch nodes and nothing else (its GPU labels on its own Node), in the
// Kustomize base and overlays and the Helm chart alike; its pod knows its
// node's name. devicePlugin.nodeLabels=false renders no account, no token
// and --node-labels=false.
func TestDevicePluginNodeAccess(t *testing.T) {
	rendered := map[string]objects{"helm": helm(t, nil)}
	for _, b := range builds {
		rendered[b.dir] = kustomize(t, b.dir)
	}
	for name, o := range rendered {
		t.Run(name, func(t *testing.T) {
			sa := slices.IndexFunc(o.accounts, func(a corev1.ServiceAccount) bool { return a.Name == devicePluginAccount })
			role := slices.IndexFunc(o.roles, func(r rbacv1.ClusterRole) bool { return r.Name == devicePluginAccount })
			bind := slices.IndexFunc(o.roleBinds, func(b rbacv1.ClusterRoleBinding) bool { return b.Name == devicePluginAccount })
			if sa < 0 || role < 0 || bind < 0 {
				t.Fatalf("service account %d, ClusterRole %d, binding %d: want all of %s", sa, role, bind, devicePluginAccount)
			}
			want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}}}
			if got := o.roles[role].Rules; !reflect.DeepEqual(got, want) {
				t.Errorf("ClusterRole %s rules %+v, want %+v", devicePluginAccount, got, want)
			}
			rb := o.roleBinds[bind]
			if rb.RoleRef.Name != devicePluginAccount || len(rb.Subjects) != 1 || rb.Subjects[0].Name != devicePluginAccount || rb.Subjects[0].Namespace != contract.Namespace {
				t.Errorf("binding %+v", rb)
			}
			spec := o.daemonSets[devicePlugin].Spec.Template.Spec
			if spec.ServiceAccountName != devicePluginAccount || !slices.Contains(spec.Containers[0].Args, "--node-labels=true") {
				t.Errorf("DaemonSet: service account %q, args %v", spec.ServiceAccountName, spec.Containers[0].Args)
			}
		})
	}
	off := helm(t, map[string]any{"devicePlugin": map[string]any{"nodeLabels": false}})
	spec := off.daemonSets[devicePlugin].Spec.Template.Spec
	if slices.ContainsFunc(off.accounts, func(a corev1.ServiceAccount) bool { return a.Name == devicePluginAccount }) ||
		spec.ServiceAccountName != "" || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken ||
		!slices.Contains(spec.Containers[0].Args, "--node-labels=false") {
		t.Errorf("nodeLabels=false: accounts %v, pod account %q token %v, args %v; want no account, no token, --node-labels=false",
			off.accounts, spec.ServiceAccountName, spec.AutomountServiceAccountToken, spec.Containers[0].Args)
	}
}
