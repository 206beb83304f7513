package render

import (
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

func helm(t *testing.T, values map[string]any) objects {
	t.Helper()
	out, err := Helm(values)
	if err != nil {
		t.Fatalf("Helm(%v): %v", values, err)
	}
	return decode(t, out)
}

// TestHelmMatchesKustomize: for the base and the local-sim overlay, the
// chart with the matching values renders the same DaemonSets (pod specs,
// selectors, update strategy), ConfigMap, RuntimeClass and admission
// policies.
func TestHelmMatchesKustomize(t *testing.T) {
	tests := []struct {
		dir    string
		values map[string]any
	}{
		{dir: ".", values: nil},
		{dir: "overlays/nvkind-worker", values: map[string]any{
			"selectedGPU":  "GPU-00000000-0000-0000-0000-000000000000",
			"nodeSelector": map[string]any{"nvidia.com/gpu.present": nil, "kubernetes.io/hostname": "k8s-ai-infra-worker"},
		}},
		{dir: "overlays/cdi-only-node", values: map[string]any{
			"devicePlugin": map[string]any{"privileged": true},
		}},
		{dir: "overlays/local-sim", values: map[string]any{
			"selectedGPU":  simUUID("a100-80gb", 0),
			"nvml":         "sim:a100-80gb",
			"driverRoot":   "/var/lib/nvinject-sim/driver-root",
			"nodeSelector": map[string]any{"nvidia.com/gpu.present": nil, "kubernetes.io/hostname": "nvinject-sim-worker"},
			"images": map[string]any{
				"devicePlugin": map[string]any{"pullPolicy": "Never"},
				"nri":          map[string]any{"pullPolicy": "Never"},
			},
			"devicePlugin": localAPIServer(),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.dir, func(t *testing.T) {
			k, h := kustomize(t, tc.dir), helm(t, tc.values)
			if len(h.daemonSets) != len(k.daemonSets) {
				t.Fatalf("helm renders %d DaemonSets, kustomize %d", len(h.daemonSets), len(k.daemonSets))
			}
			for name, kds := range k.daemonSets {
				hds, ok := h.daemonSets[name]
				if !ok {
					t.Errorf("helm lacks DaemonSet %s", name)
					continue
				}
				if !reflect.DeepEqual(important(hds), important(kds)) {
					t.Errorf("DaemonSet %s differs:\nhelm      %+v\nkustomize %+v", name, important(hds), important(kds))
				}
			}
			if !reflect.DeepEqual(h.configMaps[0].Data, k.configMaps[0].Data) {
				t.Errorf("ConfigMap data: helm %v, kustomize %v", h.configMaps[0].Data, k.configMaps[0].Data)
			}
			if h.runtimes[0].Handler != k.runtimes[0].Handler || h.runtimes[0].Name != k.runtimes[0].Name {
				t.Errorf("RuntimeClass: helm %+v, kustomize %+v", h.runtimes[0], k.runtimes[0])
			}
			if !reflect.DeepEqual(h.policies[0].Spec, k.policies[0].Spec) || !reflect.DeepEqual(h.bindings[0].Spec, k.bindings[0].Spec) {
				t.Errorf("admission policy differs:\nhelm      %+v\nkustomize %+v", h.policies[0].Spec, k.policies[0].Spec)
			}
			if !reflect.DeepEqual(h.mutators[0].Spec, k.mutators[0].Spec) || !reflect.DeepEqual(h.mutatorBind[0].Spec, k.mutatorBind[0].Spec) {
				t.Errorf("mutating admission policy differs:\nhelm      %+v\nkustomize %+v", h.mutators[0].Spec, k.mutators[0].Spec)
			}
		})
	}
}

// important is a DaemonSet without the labels each tool adds for itself.
func important(ds appsv1.DaemonSet) any {
	return struct {
		Name, Namespace string
		Selector        any
		Update          any
		Template        any
		Component       string
	}{ds.Name, ds.Namespace, ds.Spec.Selector, ds.Spec.UpdateStrategy, ds.Spec.Template.Spec, ds.Spec.Template.Labels["app.kubernetes.io/component"]}
}

func TestHelmRejectsBadValues(t *testing.T) {
	tests := []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"unknown id strategy", map[string]any{"deviceIDStrategy": "serial"}, "deviceIDStrategy"},
		{"unknown list strategy", map[string]any{"deviceListStrategy": "envvar"}, "deviceListStrategy"},
		{"malformed nvml", map[string]any{"nvml": "fake"}, "nvml"},
		{"relative driver root", map[string]any{"driverRoot": "driver"}, "driverRoot"},
		{"three-digit plugin index", map[string]any{"nri": map[string]any{"pluginIndex": "100"}}, "pluginIndex"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Helm(tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Helm(%v) error = %v, want one naming %s", tc.values, err, tc.want)
			}
		})
	}
}

// TestHelmPassesSharedSettingsToBothDaemons: non-default values for the
// settings the daemons share reach both DaemonSets (a custom resource name
// that reached only the device plugin refused every GPU pod).
func TestHelmPassesSharedSettingsToBothDaemons(t *testing.T) {
	o := helm(t, map[string]any{
		"resourceName": "example.com/accel",
		"cdi":          map[string]any{"vendor": "example.com", "class": "accel", "annotationPrefix": "ex.accel"},
	})
	checkSharedSettings(t, o, "example.com/accel", "example.com", "accel", "ex.accel")
}

// localAPIServer is what a daemon needs on the local node to reach its API
// server (no kube-proxy): hostNetwork and the loopback address.
func localAPIServer() map[string]any {
	return map[string]any{"hostNetwork": true, "extraEnv": []any{
		map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
		map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": "16443"},
	}}
}
