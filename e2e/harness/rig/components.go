package rig

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/nvinject/nvinject/deploy"
)

// ApplyDRAComponent patches nvinject-dra's running DaemonSet with the
// shipped deploy/components/<name> (its JSON patch operations on that
// DaemonSet, read from the embedded deploy tree, so the file users add is
// the one exercised) followed by extra, and waits until the new pod is
// Ready. restore puts the container back as it was and waits again.
func (d *Deployer) ApplyDRAComponent(ctx context.Context, name string, extra ...map[string]any) (restore func(context.Context) error, err error) {
	ds := d.kube.Client.AppsV1().DaemonSets(Namespace)
	cur, err := ds.Get(ctx, DRADaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get DaemonSet %s: %w", DRADaemonSet, err)
	}
	saved := cur.Spec.Template.Spec.Containers[0]
	ops, err := ComponentOps(name, DRADaemonSet)
	if err != nil {
		return nil, err
	}
	if err := d.patchDaemonSet(ctx, DRADaemonSet, append(ops, extra...)); err != nil {
		return nil, fmt.Errorf("deploy/components/%s: %w", name, err)
	}
	return func(ctx context.Context) error {
		return d.patchDaemonSet(ctx, DRADaemonSet, []map[string]any{{"op": "replace", "path": "/spec/template/spec/containers/0", "value": saved}})
	}, nil
}

// ComponentOps are the JSON patch operations the deploy tree's
// components/<name> applies to DaemonSet target.
func ComponentOps(name, target string) ([]map[string]any, error) {
	data, err := deploy.Files.ReadFile("components/" + name + "/kustomization.yaml")
	if err != nil {
		return nil, fmt.Errorf("no component %s in deploy/components: %w", name, err)
	}
	var k struct {
		Patches []struct {
			Target struct{ Kind, Name string }
			Patch  string
		}
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("deploy/components/%s: %w", name, err)
	}
	var ops []map[string]any
	for _, p := range k.Patches {
		if p.Target.Kind != "DaemonSet" || p.Target.Name != target {
			continue
		}
		var o []map[string]any
		if err := yaml.Unmarshal([]byte(p.Patch), &o); err != nil {
			return nil, fmt.Errorf("deploy/components/%s's patch of %s: %w", name, target, err)
		}
		ops = append(ops, o...)
	}
	if len(ops) == 0 {
		return nil, fmt.Errorf("deploy/components/%s patches no DaemonSet %s", name, target)
	}
	return ops, nil
}

// patchDaemonSet applies JSON patch ops to DaemonSet name and waits until
// its rollout is Ready.
func (d *Deployer) patchDaemonSet(ctx context.Context, name string, ops []map[string]any) error {
	patch, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	if _, err := d.kube.Client.AppsV1().DaemonSets(Namespace).Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch DaemonSet %s: %w", name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := Poll(wctx, 200*time.Millisecond, func(ctx context.Context) error { return d.daemonSetReady(ctx, name) }); err != nil {
		return fmt.Errorf("DaemonSet %s not Ready after the patch: %w; see kubectl -n %s describe ds/%s", name, err, Namespace, name)
	}
	return nil
}

// Privileged reports whether c runs privileged.
func Privileged(c corev1.Container) bool {
	return c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
}

// WaitSliceDevice waits up to 2 minutes until nvinject-dra's slices on the
// node publish (present) or no longer publish the device name.
func (d *Deployer) WaitSliceDevice(ctx context.Context, name string, present bool) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		devs, err := d.SliceDevices(ctx)
		if err != nil {
			return err
		}
		if has := slices.ContainsFunc(devs, func(dv resourceapi.Device) bool { return dv.Name == name }); has != present {
			return fmt.Errorf("device %s published: %v", name, has)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("nvinject-dra's slices on node %s, want device %s published %v: %w", d.node.Name(), name, present, err)
	}
	return nil
}
