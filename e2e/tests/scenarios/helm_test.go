package scenarios

import (
	"context"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/shared/contract"
)

// TestHelmInstall installs nvinject as a Helm user does, with the real helm
// CLI: the suite's Kustomize install removed, helm install with the node's
// paths as values (rig.HelmValues), the example GPU pod as a user
// writes it through the device plugin, helm upgrade --set mode=dra and the
// same pod through DRA (KEP-5004), then the README's uninstall: only the
// files it names stay on the node and none gives a GPU to a container.
// The suite's Kustomize install is restored when the test ends.
func TestHelmInstall(t *testing.T) {
	d := need(t)
	bin := os.Getenv("NVINJECT_HELM_BIN")
	if bin == "" {
		t.Skip("NVINJECT_HELM_BIN is unset: run `make e2e`, or export it as `e2e/harness/helm/build.sh` prints it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	if err := d.ImportDRAImage(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := d.NewHelm(filepath.Join(bin, "helm"), dep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restoreKustomize(t, h) })
	t0 := time.Now()
	if err := d.RemoveKustomize(ctx, dep, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("Kustomize install removed (namespace %s gone) in %s", rig.Namespace, time.Since(t0).Round(time.Millisecond))
	example := podSpec{gpu: true, runtimeClass: true, asWritten: true}

	if !t.Run("helm install, the example pod through the device plugin", func(t *testing.T) {
		t0 := time.Now()
		out, err := h.Install(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tInstalled := time.Since(t0)
		t.Logf("$ %s\n%s", strings.Join(h.Args("install", rig.HelmRelease, "deploy/helm/nvinject", "-n", rig.Namespace, "-f", h.Values()), " "), out)
		if err := d.WaitReady(ctx, dep, 3*time.Minute); err != nil {
			t.Fatal(err)
		}
		tReady := time.Since(t0)
		createPod(t, ctx, "helm-example", example)
		p := waitPod(t, ctx, "helm-example", 2*time.Minute, "Running", running)
		t.Logf("FIGURE helm install: returned %s, both DaemonSets Ready and the GPU allocatable %s, the example pod Running %s after helm install began",
			tInstalled.Round(time.Millisecond), tReady.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
		if got := p.Annotations[contract.RequiredPluginsAnnotation]; got != `["`+contract.NRIPluginName+`"]` {
			t.Errorf("example pod's %s = %q: the chart's mutating admission policy did not add it", contract.RequiredPluginsAnnotation, got)
		}
		if got := containerGPUs(t, ctx, "helm-example"); !slices.Equal(got, []string{dep.UUID}) {
			t.Errorf("example pod sees %v, want exactly %s", got, dep.UUID)
		}
		deletePod(t, "helm-example")
	}) {
		return
	}

	if !t.Run("helm upgrade --set mode=dra, the example pod through DRA", func(t *testing.T) {
		if _, err := d.Kube().Kubectl(ctx, "", "label", "node", d.Node().Name(), contract.DRAModeLabel+"="+contract.DRAModeDRA, "--overwrite"); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if _, err := h.Upgrade(ctx, "mode=dra"); err != nil {
			t.Fatal(err)
		}
		sw, err := d.WaitOnDRA(ctx, dep, t0, 3*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("FIGURE helm upgrade --set mode=dra: device plugin gone %s, allocatable %s 0 after %s, nvinject-dra Ready with its ResourceSlice after %s",
			sw.OldOwnerGone.Round(time.Millisecond), contract.ResourceName, sw.Allocatable.Round(time.Millisecond), sw.Ready.Round(time.Millisecond))
		t1 := time.Now()
		createPod(t, ctx, "helm-example-dra", example)
		p := waitPod(t, ctx, "helm-example-dra", 2*time.Minute, "Running", running)
		t.Logf("FIGURE the example pod through DRA: Running %s after creation", time.Since(t1).Round(time.Millisecond))
		if s := p.Status.ExtendedResourceClaimStatus; s == nil || s.ResourceClaimName == "" {
			t.Fatalf("pod %s has no status.extendedResourceClaimStatus: not served through DRA", p.Name)
		}
		checkAllocated(t, ctx, p)
		deletePod(t, "helm-example-dra")
	}) {
		return
	}

	t.Run("helm uninstall leaves only the README's files, none giving a GPU", func(t *testing.T) {
		// deploy/README.md, "Uninstall": unlabel (nvinject-dra then deletes
		// its ResourceSlices at once), helm uninstall, remove the CDI spec.
		if _, err := d.Kube().Kubectl(ctx, "", "label", "node", d.Node().Name(), contract.DRAModeLabel+"-"); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if _, err := h.Uninstall(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := d.WaitPodsGone(ctx, rig.Namespace, "app.kubernetes.io/part-of=nvinject"); err != nil {
			t.Fatal(err)
		}
		t.Logf("FIGURE helm uninstall: objects and pods gone in %s", time.Since(t0).Round(time.Millisecond))
		waitNoSlices(t, ctx, 30*time.Second)
		checkUninstalledObjects(t, ctx)

		// Nothing gives the GPU now: the node offers none to a pod asking
		// for it, and a pod naming it in a cdi.k8s.io annotation gets no
		// NVIDIA device node, the CDI spec still there (containerd resolves
		// only the CDI names kubelet passes it from a device plugin or a
		// DRA driver).
		spec := filepath.Join(d.Node().CDIDir(), contract.CDIVendor+"-"+contract.CDIClass+".yaml")
		if _, err := os.Stat(spec); err != nil {
			t.Fatalf("the CDI spec the README says helm uninstall leaves: %v", err)
		}
		createPod(t, ctx, "helm-after-gpu", podSpec{gpu: true, asWritten: true})
		msg := waitEvent(t, ctx, "helm-after-gpu", "FailedScheduling", "Insufficient "+contract.ResourceName)
		t.Logf("a GPU pod after the uninstall stays Pending: %s", msg)
		deletePod(t, "helm-after-gpu")
		createPod(t, ctx, "helm-spoof", podSpec{annotations: map[string]string{
			"cdi.k8s.io/helm_spoof": contract.CDIKind(contract.CDIVendor, contract.CDIClass) + "=" + dep.UUID}})
		waitPod(t, ctx, "helm-spoof", 2*time.Minute, "Running", running)
		if devs := containerNVIDIANodes(t, "helm-spoof"); len(devs) > 0 {
			t.Errorf("after the uninstall a pod naming the GPU in a cdi.k8s.io annotation has %v", devs)
		}
		deletePod(t, "helm-spoof")
		checkLeaves(t, true)
		// The README's last step: the stale spec would shadow another
		// provider's nvidia.com/gpu devices in /etc/cdi and serve whatever
		// names them later.
		if err := os.Remove(spec); err != nil {
			t.Fatal(err)
		}
		checkLeaves(t, false)
	})
}

// checkLeaves: every nvinject file on the node is one deploy/README.md's
// Uninstall section names (the CDI spec only before its removal), and none
// is a socket anything could still dial.
func checkLeaves(t *testing.T, withSpec bool) {
	t.Helper()
	d := need(t)
	files, err := d.NodeFiles()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Path)
		if !leaveNamed(f.Value, f.Rel, withSpec) {
			t.Errorf("helm uninstall left %s (in the directory of %s), which deploy/README.md does not name", f.Path, f.Value)
		}
		if f.Mode&os.ModeSocket != 0 {
			t.Errorf("helm uninstall left the socket %s", f.Path)
		}
	}
	t.Logf("nvinject's files on the node (CDI spec removed: %t): %s", !withSpec, strings.Join(names, " "))
}

// leaveNamed: rel, under the directory of chart value value, is one of
// rig.UninstallLeaves, or the CDI spec while withSpec.
func leaveNamed(value, rel string, withSpec bool) bool {
	if withSpec && value == "cdi.specDir" && rel == contract.CDIVendor+"-"+contract.CDIClass+".yaml" {
		return true
	}
	for _, glob := range rig.UninstallLeaves[value] {
		if ok, _ := path.Match(glob, rel); ok {
			return true
		}
	}
	return false
}

// waitNoSlices waits until the node has no ResourceSlice of nvinject's driver.
func waitNoSlices(t *testing.T, ctx context.Context, timeout time.Duration) {
	t.Helper()
	d := need(t)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sel := fields.Set{"spec.nodeName": d.Node().Name(), "spec.driver": contract.DRADriver}.String()
	err := rig.Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		l, err := d.Kube().Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return errString(l.Items[0].Name + " remains")
		}
		return nil
	})
	if err != nil {
		t.Errorf("ResourceSlices of %s on %s after uninstall: %v", contract.DRADriver, d.Node().Name(), err)
	}
}

// checkUninstalledObjects: the chart's cluster objects are gone and the node
// offers no GPU.
func checkUninstalledObjects(t *testing.T, ctx context.Context) {
	t.Helper()
	d := need(t)
	c := d.Kube().Client
	gone := func(what string, err error) {
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s after helm uninstall: %v, want not found", what, err)
		}
	}
	_, err := c.ResourceV1().DeviceClasses().Get(ctx, contract.DRADriver, metav1.GetOptions{})
	gone("DeviceClass "+contract.DRADriver, err)
	_, err = c.NodeV1().RuntimeClasses().Get(ctx, contract.RuntimeHandler, metav1.GetOptions{})
	gone("RuntimeClass "+contract.RuntimeHandler, err)
	vaps, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	if err == nil && len(vaps.Items) > 0 {
		t.Errorf("ValidatingAdmissionPolicy %s remains after helm uninstall", vaps.Items[0].Name)
	}
	maps, err := c.AdmissionregistrationV1().MutatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	if err == nil && len(maps.Items) > 0 {
		t.Errorf("MutatingAdmissionPolicy %s remains after helm uninstall", maps.Items[0].Name)
	}
	if _, a, err := d.NodeGPUs(ctx); err != nil || a != 0 {
		t.Errorf("allocatable %s after helm uninstall = %d (%v), want 0", contract.ResourceName, a, err)
	}
}

// restoreKustomize puts the suite's install back after TestHelmInstall, as
// it found it: no release, no DRA label or slices, the Kustomize install.
func restoreKustomize(t *testing.T, h *rig.Helm) {
	d := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := h.Uninstall(ctx, 2*time.Minute); err != nil && !strings.Contains(out, "not found") {
		t.Errorf("restore: %v", err)
	}
	if _, err := d.Kube().Kubectl(ctx, "", "label", "node", d.Node().Name(), contract.DRAModeLabel+"-"); err != nil {
		t.Errorf("restore: %v", err)
	}
	sel := fields.Set{"spec.nodeName": d.Node().Name(), "spec.driver": contract.DRADriver}.String()
	if err := d.Kube().Client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel}); err != nil {
		t.Errorf("restore: delete ResourceSlices: %v", err)
	}
	if _, err := d.Deploy(ctx, dep.GPUs); err != nil {
		t.Errorf("restore the suite's Kustomize install: %v", err)
	}
}
