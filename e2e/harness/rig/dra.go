package rig

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nvinject/nvinject/shared/contract"
)

// DRA mode of the local node: nvinject-dra instead of the device plugin,
// chosen by the node label deploy/components/dra schedules by.
const (
	DRADaemonSet = "nvinject-dra"
)

// ImportDRAImage imports nvinject-dra's image (`make sim-images`) into
// the node's containerd.
func (d *Deployer) ImportDRAImage(ctx context.Context) error {
	archive := filepath.Join(d.repo, SimImagesDir, "nvinject-dra.oci.tar")
	if _, err := os.Stat(archive); err != nil {
		return fmt.Errorf("image %s: %w; run `make sim-images`", archive, err)
	}
	return d.node.ImportImage(ctx, archive)
}

// Switch is what moving the node between owners took, each time measured
// from the label change.
type Switch struct {
	// OldOwnerGone: the previous owner's pod is deleted.
	OldOwnerGone time.Duration
	// Allocatable: Node allocatable nvidia.com/gpu reached the new owner's
	// value (0 under DRA: the scheduler's KEP-5004 test; 1 under the device plugin).
	Allocatable time.Duration
	// Ready: the new owner's DaemonSet is Ready (DRA: registered with kubelet
	// and the ResourceSlice published).
	Ready time.Duration
	// Capacity is Node capacity nvidia.com/gpu at Ready; under DRA a
	// non-zero value is the stopped device plugin's, which kubelet keeps
	// for its endpoint grace period.
	Capacity int64
}

// draKustomization is the local node's DRA overlay: the device-plugin
// kustomization Deploy wrote, plus components/local-sim-dra, with
// nvinject-dra's kubelet and CDI paths moved to the node's run dir.
func (d *Deployer) draKustomization(dep Deployment) (string, error) {
	dir := filepath.Join(d.node.RunDir(), "deploy", "nvinject-dra")
	base, err := filepath.Rel(dir, dep.Kustomization)
	if err != nil {
		return "", err
	}
	comp, err := filepath.Rel(dir, filepath.Join(d.repo, "deploy", "components", "local-sim-dra"))
	if err != nil {
		return "", err
	}
	root := d.node.KubeletRootDir()
	reg, plugins := filepath.Join(root, "plugins_registry"), filepath.Join(root, "plugins")
	content := fmt.Sprintf(`# Written by e2e/harness/rig: the local node %s in DRA mode (label %s=%s).
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
components:
  - %s
patches:
  - target: {kind: DaemonSet, name: %s}
    patch: |-
      - {op: test, path: /spec/template/spec/containers/0/args/1, value: --kubelet-registrar-dir=/var/lib/kubelet/plugins_registry}
      - {op: replace, path: /spec/template/spec/containers/0/args/1, value: --kubelet-registrar-dir=%s}
      - {op: test, path: /spec/template/spec/containers/0/args/2, value: --kubelet-plugins-dir=/var/lib/kubelet/plugins}
      - {op: replace, path: /spec/template/spec/containers/0/args/2, value: --kubelet-plugins-dir=%s}
      - {op: replace, path: /spec/template/spec/containers/0/volumeMounts/0/mountPath, value: %s}
      - {op: replace, path: /spec/template/spec/containers/0/volumeMounts/1/mountPath, value: %s}
      - {op: replace, path: /spec/template/spec/volumes/0/hostPath, value: {path: %s, type: Directory}}
      - {op: replace, path: /spec/template/spec/volumes/1/hostPath, value: {path: %s, type: DirectoryOrCreate}}
      - {op: test, path: /spec/template/spec/volumes/2/name, value: cdi-specs}
      - {op: replace, path: /spec/template/spec/volumes/2/hostPath, value: {path: %s, type: DirectoryOrCreate}}
      - {op: test, path: /spec/template/spec/volumes/6/name, value: pod-resources}
      - {op: replace, path: /spec/template/spec/volumes/6/hostPath, value: {path: %s, type: Directory}}
      - {op: test, path: /spec/template/spec/volumes/7/name, value: mps}
      - {op: replace, path: /spec/template/spec/volumes/7/hostPath, value: {path: %s, type: DirectoryOrCreate}}
      - {op: test, path: /spec/template/spec/volumes/8/name, value: mps-shm}
      - {op: replace, path: /spec/template/spec/volumes/8/hostPath, value: {path: %s/shm, type: DirectoryOrCreate}}
      - {op: test, path: /spec/template/spec/containers/0/args/12, value: "--host-mps-dir=%s"}
      - {op: replace, path: /spec/template/spec/containers/0/args/12, value: "--host-mps-dir=%s"}
`, d.node.Name(), contract.DRAModeLabel, contract.DRAModeDRA, base, comp, DRADaemonSet,
		reg, plugins, reg, plugins, reg, plugins, d.node.CDIDir(), d.node.PodResourcesDir(), d.MPSDir(), d.MPSDir(), contract.MPSDir, d.MPSDir())
	if dep.NVML != DefaultNVML {
		// The same simulated inventory as the device plugin's (writeKustomization).
		// Quoted: a MIG layout's commas would end a flow value.
		content += fmt.Sprintf(`      - {op: test, path: /spec/template/spec/containers/0/args/0, value: "--nvml=%s"}
      - {op: replace, path: /spec/template/spec/containers/0/args/0, value: "--nvml=%s"}
`, DefaultNVML, dep.NVML)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(content), 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", dir, err)
	}
	return dir, nil
}

// SwitchToDRA applies the DRA objects, labels the node for DRA and waits
// until the device plugin is gone, allocatable nvidia.com/gpu is 0 and
// nvinject-dra is Ready with its ResourceSlice naming dep's GPU.
func (d *Deployer) SwitchToDRA(ctx context.Context, dep Deployment, timeout time.Duration) (Switch, error) {
	dir, err := d.draKustomization(dep)
	if err != nil {
		return Switch{}, err
	}
	if _, err := d.kube.Kubectl(ctx, "", "apply", "-k", dir); err != nil {
		return Switch{}, fmt.Errorf("apply nvinject in DRA mode (%s): %w", dir, err)
	}
	t0 := time.Now()
	if _, err := d.kube.Kubectl(ctx, "", "label", "node", d.node.Name(), contract.DRAModeLabel+"="+contract.DRAModeDRA, "--overwrite"); err != nil {
		return Switch{}, err
	}
	return d.WaitOnDRA(ctx, dep, t0, timeout)
}

// WaitOnDRA waits until the device plugin is gone, allocatable nvidia.com/gpu
// is 0 and nvinject-dra is Ready with its ResourceSlice naming dep's GPU,
// timing each from t0 (when the move began).
func (d *Deployer) WaitOnDRA(ctx context.Context, dep Deployment, t0 time.Time, timeout time.Duration) (Switch, error) {
	return d.waitSwitch(ctx, t0, timeout, DevicePlugin, DRADaemonSet, 0, func(ctx context.Context) error {
		devs, err := d.SliceDevices(ctx)
		if err != nil {
			return err
		}
		for _, dev := range devs {
			if u := dev.Attributes[contract.DRAAttrUUID].StringValue; u != nil && *u == dep.UUID {
				return nil
			}
		}
		return fmt.Errorf("the node's ResourceSlices do not publish %s", dep.UUID)
	})
}

// SwitchToDevicePlugin removes the DRA label, deletes the driver's
// ResourceSlices of the node (nvinject-dra leaves them for its next
// instance) and waits until the device plugin publishes dep's GPU again.
func (d *Deployer) SwitchToDevicePlugin(ctx context.Context, dep Deployment, timeout time.Duration) (Switch, error) {
	return d.switchToDevicePlugin(ctx, dep, timeout, false)
}

// SwitchToDevicePluginHeld is SwitchToDevicePlugin while a DRA pod still
// holds dep's GPU: the device plugin publishes it withheld, so the switch
// is complete at capacity 1 and allocatable 0.
func (d *Deployer) SwitchToDevicePluginHeld(ctx context.Context, dep Deployment, timeout time.Duration) (Switch, error) {
	return d.switchToDevicePlugin(ctx, dep, timeout, true)
}

func (d *Deployer) switchToDevicePlugin(ctx context.Context, dep Deployment, timeout time.Duration, held bool) (Switch, error) {
	t0 := time.Now()
	if _, err := d.kube.Kubectl(ctx, "", "label", "node", d.node.Name(), contract.DRAModeLabel+"-"); err != nil {
		return Switch{}, err
	}
	allocatable, published := int64(1), func(ctx context.Context) error {
		return d.WaitKubeletAllocatable(ctx, dep.DeviceID, time.Second)
	}
	if held {
		allocatable, published = 0, func(ctx context.Context) error {
			if c, _, err := d.NodeGPUs(ctx); err != nil || c != 1 {
				return fmt.Errorf("capacity %s is %d (%v), want the withheld GPU listed", Resource, c, err)
			}
			return nil
		}
	}
	sw, err := d.waitSwitch(ctx, t0, timeout, DRADaemonSet, DevicePlugin, allocatable, published)
	if err != nil {
		return sw, err
	}
	sel := fields.Set{"spec.nodeName": d.node.Name(), "spec.driver": contract.DRADriver}.String()
	err = d.kube.Client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return sw, fmt.Errorf("delete %s ResourceSlices of node %s: %w", contract.DRADriver, d.node.Name(), err)
	}
	return sw, nil
}

func (d *Deployer) waitSwitch(ctx context.Context, t0 time.Time, timeout time.Duration, oldDS, newDS string, allocatable int64, published func(context.Context) error) (Switch, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var sw Switch
	err := Poll(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		var pending []string
		if sw.OldOwnerGone == 0 {
			pods, err := d.kube.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + oldDS})
			if err == nil && len(pods.Items) == 0 {
				sw.OldOwnerGone = time.Since(t0)
			} else {
				pending = append(pending, oldDS+" pod still there")
			}
		}
		c, a, err := d.NodeGPUs(ctx)
		if err != nil {
			return err
		}
		if sw.Allocatable == 0 && a == allocatable {
			sw.Allocatable = time.Since(t0)
		} else if sw.Allocatable == 0 {
			pending = append(pending, fmt.Sprintf("allocatable %s is %d", Resource, a))
		}
		if sw.Ready == 0 {
			if err := d.daemonSetReady(ctx, newDS); err != nil {
				pending = append(pending, newDS+": "+err.Error())
			} else if err := published(ctx); err != nil {
				pending = append(pending, err.Error())
			} else {
				sw.Ready, sw.Capacity = time.Since(t0), c
			}
		}
		if len(pending) > 0 {
			return fmt.Errorf("switching from %s to %s: %s", oldDS, newDS, strings.Join(pending, "; "))
		}
		return nil
	})
	return sw, err
}

// ResourceSlice is nvinject-dra's ResourceSlice of the node.
func (d *Deployer) ResourceSlice(ctx context.Context) (*resourceapi.ResourceSlice, error) {
	sel := fields.Set{"spec.nodeName": d.node.Name(), "spec.driver": contract.DRADriver}.String()
	l, err := d.kube.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices (%s): %w", sel, err)
	}
	if len(l.Items) != 1 {
		return nil, fmt.Errorf("%d ResourceSlices of %s on node %s, want 1", len(l.Items), contract.DRADriver, d.node.Name())
	}
	return &l.Items[0], nil
}

// SliceDevices are the devices of every ResourceSlice of nvinject-dra on
// this node (a MIG node's pool has a second slice, its shared counters).
func (d *Deployer) SliceDevices(ctx context.Context) ([]resourceapi.Device, error) {
	sel := fields.Set{"spec.nodeName": d.node.Name(), "spec.driver": contract.DRADriver}.String()
	l, err := d.kube.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices (%s): %w", sel, err)
	}
	var out []resourceapi.Device
	for _, s := range l.Items {
		out = append(out, s.Spec.Devices...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%d ResourceSlices of %s on node %s, none with a device", len(l.Items), contract.DRADriver, d.node.Name())
	}
	return out, nil
}

// DRAPod is nvinject-dra's running pod (hostNetwork: its IP is the node's).
func (d *Deployer) DRAPod(ctx context.Context) (*corev1.Pod, error) {
	return d.DaemonSetPod(ctx, DRADaemonSet)
}

// DRASimDebug POSTs to nvinject-dra's simulation-only /debug/sim/<action>.
func (d *Deployer) DRASimDebug(ctx context.Context, action, query string) error {
	p, err := d.DRAPod(ctx)
	if err != nil {
		return err
	}
	_, err = httpDo(ctx, http.MethodPost, fmt.Sprintf("http://%s:%d/debug/sim/%s?%s", p.Status.PodIP, contract.DRAMetricsPort, action, query))
	return err
}

// DRAMetrics reads nvinject-dra's Prometheus text.
func (d *Deployer) DRAMetrics(ctx context.Context) (string, error) {
	p, err := d.DRAPod(ctx)
	if err != nil {
		return "", err
	}
	return httpDo(ctx, http.MethodGet, fmt.Sprintf("http://%s:%d/metrics", p.Status.PodIP, contract.DRAMetricsPort))
}

// ClaimOf returns a pod's ResourceClaim by its name in the pod status
// (resourceClaimStatuses) or, for an extended-resource claim, its
// status.extendedResourceClaimStatus.
func (d *Deployer) ClaimOf(ctx context.Context, p *corev1.Pod) (*resourceapi.ResourceClaim, error) {
	name := ""
	if s := p.Status.ExtendedResourceClaimStatus; s != nil {
		name = s.ResourceClaimName
	}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			name = *s.ResourceClaimName
		}
	}
	if name == "" {
		return nil, fmt.Errorf("pod %s/%s names no ResourceClaim in its status", p.Namespace, p.Name)
	}
	c, err := d.kube.Client.ResourceV1().ResourceClaims(p.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("pod %s/%s names ResourceClaim %s, which does not exist", p.Namespace, p.Name, name)
	}
	return c, err
}
