package rig

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
)

// daemonSets decodes the DaemonSets of a rendered stream by name.
func daemonSets(t *testing.T, stream []byte) map[string]appsv1.DaemonSet {
	t.Helper()
	out := map[string]appsv1.DaemonSet{}
	for _, doc := range bytes.Split(stream, []byte("\n---")) {
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal(doc, &ds); err != nil {
			t.Fatalf("decode: %v\n%s", err, doc)
		}
		if ds.Kind == "DaemonSet" {
			out[ds.Name] = ds
		}
	}
	return out
}

// byName orders a pod spec's volumes and env by name: kustomize's strategic
// merge patches put the patched items first.
func byName(spec corev1.PodSpec) corev1.PodSpec {
	spec.Volumes = slices.Clone(spec.Volumes)
	slices.SortFunc(spec.Volumes, func(a, b corev1.Volume) int { return strings.Compare(a.Name, b.Name) })
	spec.Containers = slices.Clone(spec.Containers)
	for i := range spec.Containers {
		env := slices.Clone(spec.Containers[i].Env)
		slices.SortFunc(env, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
		spec.Containers[i].Env = env
	}
	return spec
}

// TestHelmValuesAreTheKustomizeLayout: the real helm CLI renders the chart
// with HelmValues into the same DaemonSet pod specs (paths, flags, images,
// scheduling) as kubectl builds the kustomizations Deploy and SwitchToDRA
// apply on the same node, in device-plugin and in DRA mode.
func TestHelmValuesAreTheKustomizeLayout(t *testing.T) {
	tools, helmBin := os.Getenv("NVINJECT_TOOLS_BIN"), os.Getenv("NVINJECT_HELM_BIN")
	if tools == "" || helmBin == "" {
		t.Skip("NVINJECT_TOOLS_BIN or NVINJECT_HELM_BIN is unset: run `make tools helm` (make test sets both)")
	}
	repo, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	run := t.TempDir()
	node := kubelocal.New(kubelocal.WithRunDir(run))
	d := &Deployer{node: node, repo: repo}
	dep := Deployment{GPUs: GPUs{NVML: "sim:a100-80gb*8", Selected: 5, IDStrategy: "index"}, UUID: "GPU-00000000-0000-0000-0000-000000000005",
		Kustomization: filepath.Join(run, "deploy", "nvinject")}
	if err := d.writeKustomization(dep); err != nil {
		t.Fatal(err)
	}
	draDir, err := d.draKustomization(dep)
	if err != nil {
		t.Fatal(err)
	}
	h, err := d.NewHelm(filepath.Join(helmBin, "helm"), dep)
	if err != nil {
		t.Fatal(err)
	}
	build := func(argv ...string) map[string]appsv1.DaemonSet {
		t.Helper()
		out, err := exec.Command(argv[0], argv[1:]...).Output()
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(argv, " "), err)
		}
		return daemonSets(t, out)
	}
	kubectl := filepath.Join(tools, "kubectl")
	for _, tc := range []struct {
		mode, kustomization string
		want                int
	}{{"device-plugin", dep.Kustomization, 2}, {"by-label", draDir, 3}} {
		k := build(kubectl, "kustomize", tc.kustomization)
		hh := build(h.Args("template", HelmRelease, h.chart, "-n", Namespace, "-f", h.Values(), "--set", "mode="+tc.mode)...)
		if len(k) != tc.want || len(hh) != tc.want {
			t.Fatalf("%s: kustomize %d DaemonSets, helm %d, want %d", tc.mode, len(k), len(hh), tc.want)
		}
		for name, kds := range k {
			if got, want := byName(hh[name].Spec.Template.Spec), byName(kds.Spec.Template.Spec); !reflect.DeepEqual(got, want) {
				gy, _ := yaml.Marshal(got)
				wy, _ := yaml.Marshal(want)
				t.Errorf("%s: DaemonSet %s pod spec differs\nhelm:\n%s\nkustomize:\n%s", tc.mode, name, gy, wy)
			}
		}
	}
}

// TestUninstallLeavesAreDocumented: deploy/README.md's uninstall section
// names every file TestHelmInstall accepts on the node afterwards.
func TestUninstallLeavesAreDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../../deploy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Uninstall\n")
	if !ok {
		t.Fatal("deploy/README.md has no ## Uninstall section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for value, globs := range UninstallLeaves {
		if !strings.Contains(section, "`"+value+"`") {
			t.Errorf("deploy/README.md's Uninstall section does not name the value %s", value)
		}
		for _, g := range globs {
			if !strings.Contains(section, strings.TrimSuffix(g, "/*")) {
				t.Errorf("deploy/README.md's Uninstall section does not name %s (under %s)", g, value)
			}
		}
	}
}
