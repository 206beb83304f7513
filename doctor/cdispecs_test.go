package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvinject/nvinject/doctor/check"
	"github.com/nvinject/nvinject/doctor/render"
	"github.com/nvinject/nvinject/shared/contract"
)

// specYAML is a CDI spec of nvidia.com/gpu defining uuid; driver, when set,
// is its contract.DriverVersionAnnotation, as nvinject's generator writes it.
func specYAML(driver string, minor int) string {
	s := "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\n"
	if driver != "" {
		s += "annotations:\n  " + contract.DriverVersionAnnotation + ": " + driver + "\n"
	}
	return s + "devices:\n- name: " + uuid + "\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/nvidia" + string(rune('0'+minor)) + ", type: c, major: 195, minor: " + string(rune('0'+minor)) + "}\n"
}

// TestCDISpecs: the cdi-runtime layer, through Run as the command calls
// it, reads every spec in the dirs containerd reads, in containerd's order,
// and judges the devices more than one file defines and the driver nvinject's
// spec was made from.
func TestCDISpecs(t *testing.T) {
	const installed = "580.95.05"
	tests := []struct {
		name string
		// files are the spec files, by dir ("etc", "run") and name, beside
		// nvinject's own run/nvidia.com-gpu.yaml (made from ownDriver).
		files     map[string]string
		ownDriver string
		// runFirst lists run before etc in containerd's cdi_spec_dirs.
		runFirst bool
		want     check.Status
		evidence []string
		fix      []string
		absent   []string
	}{
		{name: "no conflict", ownDriver: installed, want: check.OK,
			evidence: []string{"1 file(s) load; nvinject's spec RUN/nvidia.com-gpu.yaml is one of them; 0 device(s) defined in more than one file"},
			absent:   []string{"shadowed"}},
		{name: "conflict, nvinject's spec wins", ownDriver: installed, want: check.OK,
			files:    map[string]string{"etc/nvidia.yaml": specYAML("", 1)},
			evidence: []string{"CDI device nvidia.com/gpu=" + uuid + " is defined in [ETC/nvidia.yaml RUN/nvidia.com-gpu.yaml]; containerd takes nvinject's RUN/nvidia.com-gpu.yaml"}},
		{name: "conflict, a leftover in a later dir wins", ownDriver: installed, runFirst: true, want: check.Broken,
			files:    map[string]string{"etc/nvidia.com-gpu.yaml": specYAML("550.54.15", 1)},
			evidence: []string{"CDI device nvidia.com/gpu=" + uuid + " of nvinject's spec RUN/nvidia.com-gpu.yaml is shadowed: defined in [RUN/nvidia.com-gpu.yaml ETC/nvidia.com-gpu.yaml], containerd takes ETC/nvidia.com-gpu.yaml (an nvinject spec, of driver 550.54.15)"},
			fix:      []string{"remove [ETC/nvidia.com-gpu.yaml] from the node (rm ETC/nvidia.com-gpu.yaml), leaving nvinject's RUN/nvidia.com-gpu.yaml", "helm uninstall", "nvidia-ctk cdi generate"}},
		{name: "conflict in one dir: NVIDIA's toolkit spec beside nvinject's", ownDriver: installed, want: check.Broken,
			files:    map[string]string{"run/nvidia.yaml": specYAML("", 1)},
			evidence: []string{"shadowed: defined in [RUN/nvidia.com-gpu.yaml RUN/nvidia.yaml], containerd takes none: two files of one dir define it"},
			fix:      []string{"remove [RUN/nvidia.yaml]"}},
		{name: "malformed file beside good ones", ownDriver: installed, want: check.Broken,
			files:    map[string]string{"etc/broken.yaml": "cdiVersion: 0.6.0\nkind: [not a kind\n", "etc/other.yaml": strings.ReplaceAll(specYAML("", 1), uuid, "GPU-other")},
			evidence: []string{"CDI spec ETC/broken.yaml does not load (containerd skips it, the other files still count)", "2 file(s) load", "1 of the 1 CDI names pods need resolve"},
			fix:      []string{"fix or remove the bad spec file"},
			absent:   []string{"resolves to no device", "other.yaml does not load"}},
		{name: "stale driver spec", ownDriver: "535.261.03", want: check.Broken,
			evidence: []string{"nvinject's CDI spec RUN/nvidia.com-gpu.yaml was made from driver 535.261.03 (nvinject.io/driver-version) but driver 580.95.05 is installed in ROOT (/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05, from pod nvidia-device-plugin/single-gpu-device-plugin-x1"},
			fix:      []string{"kubectl -n nvidia-device-plugin delete pod single-gpu-device-plugin-x1", "writes the spec for driver 580.95.05", "start no new GPU container"}},
		{name: "driver spec current", ownDriver: installed, want: check.OK,
			evidence: []string{"nvinject's CDI spec RUN/nvidia.com-gpu.yaml was made from driver 580.95.05, the one installed in ROOT"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newNode(t).opts
			dir := t.TempDir()
			etc, run, root := filepath.Join(dir, "etc-cdi"), filepath.Join(dir, "run-cdi"), filepath.Join(dir, "driver-root")
			lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
			for _, d := range []string{etc, run, lib} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			write := func(p, s string) {
				if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write(filepath.Join(lib, "libnvidia-ml.so."+installed), "")
			if err := os.Symlink("libnvidia-ml.so."+installed, filepath.Join(lib, "libnvidia-ml.so.1")); err != nil {
				t.Fatal(err)
			}
			write(filepath.Join(run, "nvidia.com-gpu.yaml"), specYAML(tt.ownDriver, 0))
			for name, s := range tt.files {
				d, base, _ := strings.Cut(name, "/")
				write(filepath.Join(map[string]string{"etc": etc, "run": run}[d], base), s)
			}
			order := "'" + etc + "', '" + run + "'"
			if tt.runFirst {
				order = "'" + run + "', '" + etc + "'"
			}
			conf := filepath.Join(dir, "config.toml")
			write(conf, strings.ReplaceAll(ctrdConf, "'CDIDIR'", order))
			// The device plugin's pod says where it writes its spec and
			// which driver root it makes it from.
			client := cluster(uuid)
			pod, _ := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), contract.Namespace, contract.DevicePluginApp+"-x1")
			pod.(*corev1.Pod).Spec.Containers = []corev1.Container{{Name: "plugin", Args: []string{"--cdi-spec-dir=" + run, "--driver-root=/driver-root", "--host-driver-root", root}}}
			if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), pod, contract.Namespace); err != nil {
				t.Fatal(err)
			}
			o.Client, o.Node, o.CDISpecDirs, o.ContainerdConfig = client, nodeName, []string{etc, run}, conf

			r, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			v, _ := r.Verdict(check.LayerCDIRuntime)
			paths := strings.NewReplacer(etc, "ETC", run, "RUN", root, "ROOT")
			ev, fix := paths.Replace(strings.Join(v.Evidence, "\n")), paths.Replace(v.Fix)
			if v.Status != tt.want {
				t.Errorf("cdi-runtime %s, want %s\n%s\nfix: %s", v.Status, tt.want, ev, fix)
			}
			for _, w := range tt.evidence {
				if !strings.Contains(ev, w) {
					t.Errorf("evidence lacks %q:\n%s", w, ev)
				}
			}
			for _, w := range tt.absent {
				if strings.Contains(ev, w) {
					t.Errorf("evidence has %q:\n%s", w, ev)
				}
			}
			for _, w := range tt.fix {
				if !strings.Contains(fix, w) {
					t.Errorf("fix lacks %q: %s", w, fix)
				}
			}
			// --json carries what the verdict was judged from.
			var b bytes.Buffer
			if err := render.WriteJSON(&b, r); err != nil {
				t.Fatal(err)
			}
			var got struct {
				Evidence struct {
					CDI struct {
						OwnSpec string `json:"ownSpec"`
						Specs   []struct {
							Path string `json:"path"`
						} `json:"specs"`
					} `json:"cdi"`
					DriverRoot struct {
						Version string `json:"version"`
					} `json:"driverRoot"`
				} `json:"evidence"`
			}
			if err := json.Unmarshal(b.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if got.Evidence.CDI.OwnSpec != filepath.Join(run, "nvidia.com-gpu.yaml") || len(got.Evidence.CDI.Specs) == 0 || got.Evidence.DriverRoot.Version != installed {
				t.Errorf("JSON evidence %+v", got.Evidence)
			}
		})
	}
}
