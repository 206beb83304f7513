package rig

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nvinject/nvinject/shared/contract"
)

// HelmRelease is the release name the Helm install uses.
const HelmRelease = "nvinject"

// HelmValues are the chart values that install nvinject on this node the
// way Deploy's kustomization does: the node's CDI dir, NRI socket, kubelet
// root dir (pod-resources, plugins_registry and plugins follow it) and
// state dir, the SIMULATED NVML and driver root, the selected GPU, the
// imported images, and the device plugin, nvinject-nri and nvinject-dra on
// hostNetwork pointed at the API server's loopback address (no kube-proxy
// here), as the kustomization and components/local-sim-dra do.
func (d *Deployer) HelmValues(dep Deployment) map[string]any {
	host, port := d.node.APIServerAddress()
	apiEnv := []any{
		map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": host},
		map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": strconv.Itoa(port)},
	}
	never := map[string]any{"pullPolicy": "Never"}
	v := map[string]any{
		"selectedGPU":  dep.UUID,
		"nvml":         dep.NVML,
		"driverRoot":   DriverRoot,
		"nodeSelector": map[string]any{"nvidia.com/gpu.present": nil, "kubernetes.io/hostname": d.node.Name()},
		"images":       map[string]any{"devicePlugin": never, "nri": never, "dra": never},
		"kubelet":      map[string]any{"rootDir": d.node.KubeletRootDir()},
		"cdi":          map[string]any{"specDir": d.node.CDIDir()},
		"nri":          map[string]any{"socketPath": d.node.NRISocket(), "hostNetwork": true, "extraEnv": apiEnv},
		"devicePlugin": map[string]any{"stateDir": d.StateDir(), "mpsDir": d.MPSDir(), "hostNetwork": true, "extraEnv": apiEnv},
		"containerd":   map[string]any{"configPath": d.node.ContainerdConfig(), "dropInDir": filepath.Join(filepath.Dir(d.node.ContainerdConfig()), "conf.d")},
		"dra":          map[string]any{"hostNetwork": true, "extraEnv": apiEnv},
	}
	if dep.IDStrategy == "index" {
		v["deviceIDStrategy"] = "index"
	}
	return v
}

// Helm runs the real helm CLI against the node, with its own config,
// cache and data dirs under the run dir.
type Helm struct {
	d      *Deployer
	bin    string
	chart  string
	values string
	home   string
}

// NewHelm writes dep's HelmValues to a values file and returns the helm
// CLI at bin (e2e/harness/helm/build.sh) for the chart in the checkout.
func (d *Deployer) NewHelm(bin string, dep Deployment) (*Helm, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("helm CLI %s: %w; run `make helm` (e2e/harness/helm/build.sh)", bin, err)
	}
	dir := filepath.Join(d.node.RunDir(), "deploy", "helm")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	out, err := yaml.Marshal(d.HelmValues(dep))
	if err != nil {
		return nil, fmt.Errorf("encode the node's Helm values: %w", err)
	}
	values := filepath.Join(dir, "values.yaml")
	header := fmt.Sprintf("# Written by e2e/harness/rig: chart values for the local node %s (run dir %s).\n", d.node.Name(), d.node.RunDir())
	if err := os.WriteFile(values, append([]byte(header), out...), 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", values, err)
	}
	return &Helm{d: d, bin: bin, chart: filepath.Join(d.repo, "deploy", "helm", "nvinject"), values: values, home: filepath.Join(dir, "home")}, nil
}

// Values is the values file the release is installed with.
func (h *Helm) Values() string { return h.values }

// Args is the helm command line for args, as a user would type it.
func (h *Helm) Args(args ...string) []string {
	return append([]string{h.bin, "--kubeconfig", h.d.node.Kubeconfig()}, args...)
}

// Run runs helm with args and returns its combined output.
func (h *Helm) Run(ctx context.Context, args ...string) (string, error) {
	argv := h.Args(args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"), "HELM_DATA_HOME="+filepath.Join(h.home, "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Install is the README's Helm install: the namespace, labeled for the
// privileged Pod Security level, then helm install with the node's values
// and set (--set key=value items).
func (h *Helm) Install(ctx context.Context, set ...string) (string, error) {
	k := h.d.kube
	if _, err := k.Kubectl(ctx, "", "create", "namespace", Namespace); err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
		return "", err
	}
	if _, err := k.Kubectl(ctx, "", "label", "--overwrite", "namespace", Namespace, "pod-security.kubernetes.io/enforce=privileged"); err != nil {
		return "", err
	}
	return h.Run(ctx, append([]string{"install", HelmRelease, h.chart, "-n", Namespace, "-f", h.values}, setArgs(set)...)...)
}

// Upgrade is helm upgrade of the release with the node's values and set.
func (h *Helm) Upgrade(ctx context.Context, set ...string) (string, error) {
	return h.Run(ctx, append([]string{"upgrade", HelmRelease, h.chart, "-n", Namespace, "-f", h.values}, setArgs(set)...)...)
}

// Uninstall is helm uninstall, waiting until the release's objects are gone.
func (h *Helm) Uninstall(ctx context.Context, timeout time.Duration) (string, error) {
	return h.Run(ctx, "uninstall", HelmRelease, "-n", Namespace, "--wait", "--timeout", timeout.String())
}

func setArgs(set []string) []string {
	var args []string
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// RemoveKustomize deletes what Deploy and SwitchToDRA applied with kubectl,
// the namespace included, and waits until the namespace is gone.
func (d *Deployer) RemoveKustomize(ctx context.Context, dep Deployment, timeout time.Duration) error {
	for _, dir := range []string{filepath.Join(d.node.RunDir(), "deploy", "nvinject-dra"), dep.Kustomization} {
		if _, err := os.Stat(filepath.Join(dir, "kustomization.yaml")); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if _, err := d.kube.Kubectl(ctx, "", "delete", "-k", dir, "--ignore-not-found", "--wait", "--timeout", timeout.String()); err != nil {
			return fmt.Errorf("remove nvinject's Kustomize install (%s): %w", dir, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		_, err := d.kube.Client.CoreV1().Namespaces().Get(ctx, Namespace, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("namespace %s still there (%v)", Namespace, err)
	})
}

// UninstallLeaves are the files nvinject leaves on a node after helm
// uninstall and the README's removal of the CDI spec (deploy/README.md,
// "Uninstall"), as globs relative to the chart value naming their
// directory; none can give a GPU to a container.
var UninstallLeaves = map[string][]string{
	"cdiHookDir":            {"nvinject-cdi-hook"},
	"devicePlugin.stateDir": {"health.json"},
	"kubelet.pluginsDir":    {contract.DRADriver, contract.DRADriver + "/*"},
}

// NodeFile is one of nvinject's files on the host: its path, its path
// relative to the directory a chart value names, and that value.
type NodeFile struct {
	Value, Rel, Path string
	Mode             os.FileMode
}

// NodeFiles lists nvinject's files on the host: everything under
// cdiHookDir, devicePlugin.stateDir and kubelet.pluginsDir/<driver>; in the
// CDI spec dirs, kubelet's plugin registry and its device-plugins dir
// (shared with others) the entries named after nvinject.
func (d *Deployer) NodeFiles() ([]NodeFile, error) {
	root := d.node.KubeletRootDir()
	all := func(string) bool { return true }
	ours := func(name string) bool {
		return strings.Contains(name, "nvinject") || strings.HasPrefix(name, contract.DRADriver)
	}
	dirs := []struct {
		value, dir string
		keep       func(string) bool
	}{
		{"cdiHookDir", "/var/lib/nvinject/bin", all},
		{"devicePlugin.stateDir", d.StateDir(), all},
		{"kubelet.pluginsDir", filepath.Join(root, "plugins"), ours},
		{"kubelet.pluginsRegistryDir", filepath.Join(root, "plugins_registry"), ours},
		{"kubelet.devicePluginsDir", "/var/lib/kubelet/device-plugins", ours},
		{"cdi.specDir", d.node.CDIDir(), all},
		{"cdi.staticSpecDir", "/etc/cdi", ours},
	}
	var found []NodeFile
	for _, dd := range dirs {
		err := filepath.WalkDir(dd.dir, func(p string, e os.DirEntry, err error) error {
			if errors.Is(err, os.ErrNotExist) || p == dd.dir {
				return nil
			}
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dd.dir, p)
			top, _, _ := strings.Cut(rel, string(filepath.Separator))
			if !dd.keep(top) {
				if e.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			found = append(found, NodeFile{Value: dd.value, Rel: rel, Path: p, Mode: e.Type()})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list nvinject's files in %s: %w", dd.dir, err)
		}
	}
	return found, nil
}
