package render

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	corev1 "k8s.io/api/core/v1"

	"github.com/nvinject/nvinject/deploy"
)

// helmAll renders the chart in by-label mode, where all three DaemonSets
// exist, with values set over it.
func helmAll(t *testing.T, values map[string]any) objects {
	t.Helper()
	v := map[string]any{"mode": "by-label"}
	maps.Copy(v, values)
	out, err := Helm(v)
	if err != nil {
		t.Fatalf("Helm(%v): %v", v, err)
	}
	_, rest := splitDRA(t, out)
	return decode(t, rest)
}

// hostView flattens what a node's paths can change in the DaemonSets: each
// hostPath volume, each container's mount paths, args and command.
func hostView(o objects) map[string]string {
	view := map[string]string{}
	for name, ds := range o.daemonSets {
		spec := ds.Spec.Template.Spec
		for _, v := range spec.Volumes {
			if v.HostPath != nil {
				t := corev1.HostPathUnset
				if v.HostPath.Type != nil {
					t = *v.HostPath.Type
				}
				view[name+" volume "+v.Name] = v.HostPath.Path + " " + string(t)
			}
		}
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, m := range c.VolumeMounts {
				view[name+"/"+c.Name+" mount "+m.Name] = m.MountPath
			}
			for i, a := range c.Args {
				view[fmt.Sprintf("%s/%s arg %d", name, c.Name, i)] = a
			}
			for i, a := range c.Command {
				view[fmt.Sprintf("%s/%s command %d", name, c.Name, i)] = a
			}
		}
	}
	return view
}

// TestHelmHostPathValues: each host path value changes exactly the
// hostPaths and flags it names and nothing else. Container-side paths stay
// fixed except where a daemon must name the host path: the CDI hook and the
// driver root in the CDI spec, kubelet's DRA registration and plugin dirs.
func TestHelmHostPathValues(t *testing.T) {
	base := hostView(helmAll(t, nil))
	const dp, dra = devicePlugin, draDaemonSet
	tests := []struct {
		name   string
		values map[string]any
		want   map[string]string // view entries that change, with their new value
	}{
		{"kubelet root dir, derived dirs follow", map[string]any{"kubelet": map[string]any{"rootDir": "/k0s/kubelet"}}, map[string]string{
			dp + " volume pod-resources":        "/k0s/kubelet/pod-resources Directory",
			nri + " volume pod-resources":       "/k0s/kubelet/pod-resources Directory",
			dra + " volume pod-resources":       "/k0s/kubelet/pod-resources Directory",
			dra + " volume plugins-registry":    "/k0s/kubelet/plugins_registry Directory",
			dra + " volume plugins":             "/k0s/kubelet/plugins DirectoryOrCreate",
			dra + "/dra mount plugins-registry": "/k0s/kubelet/plugins_registry",
			dra + "/dra mount plugins":          "/k0s/kubelet/plugins",
			dra + "/dra arg 1":                  "--kubelet-registrar-dir=/k0s/kubelet/plugins_registry",
			dra + "/dra arg 2":                  "--kubelet-plugins-dir=/k0s/kubelet/plugins",
		}},
		{"pod-resources dir", map[string]any{"kubelet": map[string]any{"podResourcesDir": "/pr"}}, map[string]string{
			dp + " volume pod-resources":  "/pr Directory",
			nri + " volume pod-resources": "/pr Directory",
			dra + " volume pod-resources": "/pr Directory",
		}},
		{"plugins registry dir", map[string]any{"kubelet": map[string]any{"pluginsRegistryDir": "/reg"}}, map[string]string{
			dra + " volume plugins-registry":    "/reg Directory",
			dra + "/dra mount plugins-registry": "/reg",
			dra + "/dra arg 1":                  "--kubelet-registrar-dir=/reg",
		}},
		{"plugins dir", map[string]any{"kubelet": map[string]any{"pluginsDir": "/plugins"}}, map[string]string{
			dra + " volume plugins":    "/plugins DirectoryOrCreate",
			dra + "/dra mount plugins": "/plugins",
			dra + "/dra arg 2":         "--kubelet-plugins-dir=/plugins",
		}},
		{"device-plugins dir", map[string]any{"kubelet": map[string]any{"devicePluginsDir": "/dp"}}, map[string]string{
			dp + " volume device-plugins":  "/dp Directory",
			dra + " volume device-plugins": "/dp Directory",
		}},
		{"NRI socket", map[string]any{"nri": map[string]any{"socketPath": "/run/k3s/nri/custom.sock"}}, map[string]string{
			nri + " volume nri-socket": "/run/k3s/nri Directory",
			nri + "/nri arg 0":         "--socket-path=/var/run/nri/custom.sock",
		}},
		{"CDI spec dir", map[string]any{"cdi": map[string]any{"specDir": "/run/cdi2"}}, map[string]string{
			dp + " volume cdi-specs":  "/run/cdi2 DirectoryOrCreate",
			nri + " volume cdi-specs": "/run/cdi2 DirectoryOrCreate",
			dra + " volume cdi-specs": "/run/cdi2 DirectoryOrCreate",
		}},
		{"static CDI spec dir", map[string]any{"cdi": map[string]any{"staticSpecDir": "/etc/cdi2"}}, map[string]string{
			nri + " volume cdi-static-specs": "/etc/cdi2 DirectoryOrCreate",
		}},
		{"device plugin state dir", map[string]any{"devicePlugin": map[string]any{"stateDir": "/state"}}, map[string]string{
			dp + " volume state": "/state DirectoryOrCreate",
		}},
		{"driver root", map[string]any{"driverRoot": "/run/nvidia/driver"}, map[string]string{
			dp + " volume driver-root":  "/run/nvidia/driver Directory",
			dra + " volume driver-root": "/run/nvidia/driver Directory",
			dp + "/device-plugin arg 4": "--host-driver-root=/run/nvidia/driver",
			dra + "/dra arg 5":          "--host-driver-root=/run/nvidia/driver",
		}},
		{"dev root", map[string]any{"driverRoot": "/home/kubernetes/bin/nvidia", "devRoot": "/"}, map[string]string{
			dp + " volume driver-root":           "/home/kubernetes/bin/nvidia Directory",
			dra + " volume driver-root":          "/home/kubernetes/bin/nvidia Directory",
			dp + "/device-plugin arg 4":          "--host-driver-root=/home/kubernetes/bin/nvidia",
			dra + "/dra arg 5":                   "--host-driver-root=/home/kubernetes/bin/nvidia",
			dp + " volume dev-root":              "/ Directory",
			dra + " volume dev-root":             "/ Directory",
			dp + "/device-plugin mount dev-root": "/dev-root",
			dra + "/dra mount dev-root":          "/dev-root",
			dp + "/device-plugin arg 12":         "--dev-root=/dev-root",
			dra + "/dra arg 13":                  "--dev-root=/dev-root",
		}},
		{"CDI hook dir", map[string]any{"cdiHookDir": "/opt/nvinject/bin"}, map[string]string{
			dp + " volume cdi-hook":                  "/opt/nvinject/bin DirectoryOrCreate",
			dra + " volume cdi-hook":                 "/opt/nvinject/bin DirectoryOrCreate",
			dp + "/install-cdi-hook mount cdi-hook":  "/opt/nvinject/bin",
			dra + "/install-cdi-hook mount cdi-hook": "/opt/nvinject/bin",
			dp + "/install-cdi-hook command 2":       "/opt/nvinject/bin",
			dra + "/install-cdi-hook command 2":      "/opt/nvinject/bin",
			dp + "/device-plugin mount cdi-hook":     "/opt/nvinject/bin",
			dra + "/dra mount cdi-hook":              "/opt/nvinject/bin",
			dp + "/device-plugin arg 6":              "--hook-binary=/opt/nvinject/bin/nvinject-cdi-hook",
			dra + "/dra arg 8":                       "--hook-binary=/opt/nvinject/bin/nvinject-cdi-hook",
		}},
		{"containerd paths are the installer's, not the daemons'", map[string]any{"containerd": map[string]any{
			"configPath": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml", "dropInDir": "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d"}},
			map[string]string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := hostView(helmAll(t, tc.values))
			changed := map[string]string{}
			for k, v := range got {
				if base[k] != v {
					changed[k] = v
				}
			}
			for k := range base {
				if _, ok := got[k]; !ok {
					changed[k] = "(gone)"
				}
			}
			if !reflect.DeepEqual(changed, tc.want) {
				t.Errorf("changes:\n got %v\nwant %v", changed, tc.want)
			}
		})
	}
}

// TestHelmRejectsRelativeHostPaths: the schema refuses a relative or empty
// host path and names the value; the derived kubelet dirs take "" (derive).
func TestHelmRejectsRelativeHostPaths(t *testing.T) {
	paths := []struct {
		value   string
		derived bool
		set     func(string) map[string]any
	}{
		{"/driverRoot", false, func(p string) map[string]any { return map[string]any{"driverRoot": p} }},
		{"/cdiHookDir", false, func(p string) map[string]any { return map[string]any{"cdiHookDir": p} }},
		{"/kubelet/rootDir", false, func(p string) map[string]any { return map[string]any{"kubelet": map[string]any{"rootDir": p}} }},
		{"/kubelet/devicePluginsDir", false, func(p string) map[string]any { return map[string]any{"kubelet": map[string]any{"devicePluginsDir": p}} }},
		{"/kubelet/podResourcesDir", true, func(p string) map[string]any { return map[string]any{"kubelet": map[string]any{"podResourcesDir": p}} }},
		{"/kubelet/pluginsRegistryDir", true, func(p string) map[string]any {
			return map[string]any{"kubelet": map[string]any{"pluginsRegistryDir": p}}
		}},
		{"/kubelet/pluginsDir", true, func(p string) map[string]any { return map[string]any{"kubelet": map[string]any{"pluginsDir": p}} }},
		{"/nri/socketPath", false, func(p string) map[string]any { return map[string]any{"nri": map[string]any{"socketPath": p}} }},
		{"/cdi/specDir", false, func(p string) map[string]any { return map[string]any{"cdi": map[string]any{"specDir": p}} }},
		{"/cdi/staticSpecDir", false, func(p string) map[string]any { return map[string]any{"cdi": map[string]any{"staticSpecDir": p}} }},
		{"/devicePlugin/stateDir", false, func(p string) map[string]any { return map[string]any{"devicePlugin": map[string]any{"stateDir": p}} }},
		{"/containerd/configPath", false, func(p string) map[string]any { return map[string]any{"containerd": map[string]any{"configPath": p}} }},
		{"/containerd/dropInDir", false, func(p string) map[string]any { return map[string]any{"containerd": map[string]any{"dropInDir": p}} }},
	}
	for _, p := range paths {
		t.Run(p.value, func(t *testing.T) {
			for _, bad := range []string{"var/lib/x", "./x", ""} {
				_, err := Helm(p.set(bad))
				if bad == "" && p.derived {
					if err != nil {
						t.Errorf("%s=%q (derive): %v", p.value, bad, err)
					}
					continue
				}
				if err == nil || !strings.Contains(err.Error(), "at '"+p.value+"'") || !strings.Contains(err.Error(), "does not match pattern") {
					t.Errorf("%s=%q: error %v, want the schema's refusal naming %s", p.value, bad, err, p.value)
				}
			}
			if _, err := Helm(p.set("/abs/path")); err != nil {
				t.Errorf("%s=/abs/path: %v", p.value, err)
			}
		})
	}
}

// TestHelmPathDefaultsAreTheDropIns: the chart's CDI dirs and NRI socket
// default to what deploy/containerd/nvinject.toml configures containerd
// with, and the install notes say so.
func TestHelmPathDefaultsAreTheDropIns(t *testing.T) {
	var dropIn struct {
		Plugins map[string]struct {
			CDISpecDirs []string `toml:"cdi_spec_dirs"`
			SocketPath  string   `toml:"socket_path"`
		} `toml:"plugins"`
	}
	if err := toml.Unmarshal(deploy.ContainerdDropIn, &dropIn); err != nil {
		t.Fatal(err)
	}
	o := helmAll(t, nil)
	vol := func(ds, name string) string {
		for _, v := range o.daemonSets[ds].Spec.Template.Spec.Volumes {
			if v.Name == name {
				return v.HostPath.Path
			}
		}
		return ""
	}
	nriArgs := o.daemonSets[nri].Spec.Template.Spec.Containers[0].Args
	gotSocket := vol(nri, "nri-socket") + "/" + strings.TrimPrefix(nriArgs[0], "--socket-path=/var/run/nri/")
	if want := dropIn.Plugins["io.containerd.nri.v1.nri"].SocketPath; gotSocket != want {
		t.Errorf("chart's NRI socket %s, drop-in's %s", gotSocket, want)
	}
	if got, want := []string{vol(nri, "cdi-static-specs"), vol(nri, "cdi-specs")}, dropIn.Plugins["io.containerd.cri.v1.runtime"].CDISpecDirs; !slices.Equal(got, want) {
		t.Errorf("chart's CDI dirs %v, drop-in's cdi_spec_dirs %v", got, want)
	}
	notes, err := HelmNotes(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nvinject-node install-containerd-config --config /etc/containerd/config.toml --dropin-dir /etc/containerd/conf.d",
		"this release uses the same", "rm -f /var/run/cdi/nvidia.com-gpu.yaml"} {
		if !strings.Contains(notes, want) {
			t.Errorf("install notes lack %q:\n%s", want, notes)
		}
	}
	notes, err = HelmNotes(map[string]any{"mode": "dra", "nri": map[string]any{"socketPath": "/run/k3s/nri/nri.sock"},
		"containerd": map[string]any{"configPath": "/etc/k0s/containerd.toml", "dropInDir": "/etc/k0s/containerd.d"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--config /etc/k0s/containerd.toml --dropin-dir /etc/k0s/containerd.d",
		"/run/k3s/nri/nri.sock: make containerd's", "kubectl label node NODE nvinject.io/gpu-mode=dra"} {
		if !strings.Contains(notes, want) {
			t.Errorf("install notes (dra, other paths) lack %q:\n%s", want, notes)
		}
	}
}

// localSimValues are the chart values of overlays/local-sim: the simulated
// NVML and driver root, pinned to the node, images imported.
func localSimValues() map[string]any {
	return map[string]any{
		"selectedGPU":  simUUID("a100-80gb", 0),
		"nvml":         "sim:a100-80gb",
		"driverRoot":   "/var/lib/nvinject-sim/driver-root",
		"nodeSelector": map[string]any{"nvidia.com/gpu.present": nil, "kubernetes.io/hostname": "nvinject-sim-worker"},
		"images": map[string]any{
			"devicePlugin": map[string]any{"pullPolicy": "Never"},
			"nri":          map[string]any{"pullPolicy": "Never"},
			"dra":          map[string]any{"pullPolicy": "Never"},
		},
		"devicePlugin": localAPIServer(),
	}
}

// TestHelmExpressesLocalSimDRA: the values express the local node's DRA
// overlay (overlays/local-sim-dra) exactly, hostNetwork and the API
// server's address for nvinject-dra included.
func TestHelmExpressesLocalSimDRA(t *testing.T) {
	v := localSimValues()
	v["dra"] = localAPIServer()
	h := helmAll(t, v)
	kout, err := Kustomize("overlays/local-sim-dra")
	if err != nil {
		t.Fatal(err)
	}
	_, krest := splitDRA(t, kout)
	k := decode(t, krest)
	if len(h.daemonSets) != 3 || len(k.daemonSets) != 3 {
		t.Fatalf("helm renders %d DaemonSets, kustomize %d; want 3 each", len(h.daemonSets), len(k.daemonSets))
	}
	for name, kds := range k.daemonSets {
		if hds := h.daemonSets[name]; !reflect.DeepEqual(important(hds), important(kds)) {
			t.Errorf("DaemonSet %s differs:\nhelm      %+v\nkustomize %+v", name, important(hds), important(kds))
		}
	}
}
