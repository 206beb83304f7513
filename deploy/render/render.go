// Package render builds nvinject's Kubernetes objects from the embedded
// deploy tree: the kustomize base or an overlay with krusty, or the Helm
// chart with helm's engine. The local-node harness applies its output.
package render

import (
	"fmt"
	"io/fs"
	"path"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/nvinject/nvinject/deploy"

	"github.com/nvinject/nvinject/shared/contract"
)

const (
	treeRoot = "/nvinject/deploy"
	wrapRoot = "/nvinject/wrap"
)

type options struct {
	selectedGPU     string
	devicePluginImg string
	nriImg          string
	components      []string
}

func (o options) empty() bool {
	return o.selectedGPU == "" && o.devicePluginImg == "" && o.nriImg == "" && len(o.components) == 0
}

// Option adjusts a kustomize build the way an extra overlay would.
type Option func(*options)

// WithSelectedGPU sets the ConfigMap's selected-gpu-uuid (NVIDIA_VISIBLE_DEVICES
// of the device plugin), e.g. a simulated GPU's UUID.
func WithSelectedGPU(uuid string) Option {
	return func(o *options) { o.selectedGPU = uuid }
}

// WithImages sets the device plugin's and the NRI plugin's image references;
// an empty reference keeps the overlay's.
func WithImages(devicePlugin, nri string) Option {
	return func(o *options) { o.devicePluginImg, o.nriImg = devicePlugin, nri }
}

// WithComponents adds the deploy tree's components/<name> kustomize
// components, in order, e.g. "dra-mig-on-demand" over overlays/dra-node.
func WithComponents(names ...string) Option {
	return func(o *options) { o.components = append(o.components, names...) }
}

// Kustomize builds the kustomization at dir inside the deploy tree: "." for
// the base, "overlays/local-sim" for an overlay. Options add one overlay
// layer on top.
func Kustomize(dir string, opts ...Option) ([]byte, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	mem, err := memTree()
	if err != nil {
		return nil, err
	}
	target := path.Join(treeRoot, dir)
	if !mem.Exists(path.Join(target, "kustomization.yaml")) {
		return nil, fmt.Errorf("render kustomization %q: no kustomization.yaml there; use \".\" or overlays/<name>", dir)
	}
	for _, c := range o.components {
		if !mem.Exists(path.Join(treeRoot, "components", c, "kustomization.yaml")) {
			return nil, fmt.Errorf("render kustomization %q: no component %q; see deploy/components", dir, c)
		}
	}
	if !o.empty() {
		if err := writeWrapper(mem, target, o); err != nil {
			return nil, err
		}
		target = wrapRoot
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, target)
	if err != nil {
		return nil, fmt.Errorf("render kustomization %q: %w", dir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("render kustomization %q as YAML: %w", dir, err)
	}
	return out, nil
}

// memTree copies the embedded deploy tree into an in-memory filesystem, so
// builds do not depend on the working directory.
func memTree() (filesys.FileSystem, error) {
	mem := filesys.MakeFsInMemory()
	err := fs.WalkDir(deploy.Files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := deploy.Files.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(path.Join(treeRoot, p), data)
	})
	if err != nil {
		return nil, fmt.Errorf("copy embedded deploy tree: %w", err)
	}
	return mem, nil
}

type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value string `json:"value"`
}

type patch struct {
	Patch  string            `json:"patch"`
	Target map[string]string `json:"target,omitempty"`
}

// writeWrapper writes an overlay on top of target that carries the options.
func writeWrapper(mem filesys.FileSystem, target string, o options) error {
	var bodies []any
	var targets []map[string]string
	if o.selectedGPU != "" {
		bodies = append(bodies, map[string]any{
			"apiVersion": "v1",
			"kind":       "ConfigMap",
			"metadata":   map[string]any{"name": contract.ConfigMapName, "namespace": contract.Namespace},
			"data":       map[string]any{contract.ConfigMapKey: o.selectedGPU},
		})
		targets = append(targets, nil)
	}
	images := []struct{ daemonSet, ref string }{
		{contract.DevicePluginApp, o.devicePluginImg},
		{contract.NRIApp, o.nriImg},
	}
	for _, img := range images {
		if img.ref == "" {
			continue
		}
		bodies = append(bodies, []jsonPatchOp{{Op: "replace", Path: "/spec/template/spec/containers/0/image", Value: img.ref}})
		targets = append(targets, map[string]string{"kind": "DaemonSet", "name": img.daemonSet})
	}
	patches := make([]patch, len(bodies))
	for i, b := range bodies {
		data, err := yaml.Marshal(b)
		if err != nil {
			return fmt.Errorf("encode wrapper patch: %w", err)
		}
		patches[i] = patch{Patch: string(data), Target: targets[i]}
	}
	k := map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1",
		"kind":       "Kustomization",
		"resources":  []string{"../" + strings.TrimPrefix(target, "/nvinject/")},
		"patches":    patches,
	}
	if len(o.components) > 0 {
		comps := make([]string, len(o.components))
		for i, c := range o.components {
			comps[i] = "../" + strings.TrimPrefix(path.Join(treeRoot, "components", c), "/nvinject/")
		}
		k["components"] = comps
	}
	data, err := yaml.Marshal(k)
	if err != nil {
		return fmt.Errorf("encode wrapper kustomization: %w", err)
	}
	return mem.WriteFile(path.Join(wrapRoot, "kustomization.yaml"), data)
}
