package rig

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

// Metrics ports of the DaemonSets (deploy/base).
const (
	DevicePluginMetricsPort = contract.DevicePluginMetricsPort
	NRIMetricsPort          = contract.NRIMetricsPort
)

// WaitReady waits until both DaemonSets have rolled out and are Ready, the
// device plugin reports dep's GPU healthy, the Node publishes what dep
// expects (one GPU by default) and kubelet's device manager offers its
// device ID when it publishes one GPU.
func (d *Deployer) WaitReady(ctx context.Context, dep Deployment, timeout time.Duration) error {
	uuid := dep.UUID
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, ds := range []string{DevicePlugin, NRIPlugin} {
		if err := Poll(ctx, 500*time.Millisecond, func(ctx context.Context) error { return d.daemonSetReady(ctx, ds) }); err != nil {
			return fmt.Errorf("DaemonSet %s/%s not Ready: %w; see `kubectl -n %s describe ds %s` and the pod's logs", Namespace, ds, err, Namespace, ds)
		}
	}
	err := Poll(ctx, 500*time.Millisecond, func(ctx context.Context) error {
		m, err := d.Metrics(ctx, DevicePlugin)
		if err != nil {
			return err
		}
		if !strings.Contains(m, `uuid="`+uuid+`"} 1`) {
			return fmt.Errorf("device plugin metrics do not report %s healthy", uuid)
		}
		n, err := d.kube.Client.CoreV1().Nodes().Get(ctx, d.node.Name(), metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get node %s: %w", d.node.Name(), err)
		}
		for res, want := range dep.expected() {
			c, a := n.Status.Capacity[corev1.ResourceName(res)], n.Status.Allocatable[corev1.ResourceName(res)]
			if c.Value() != want || a.Value() != want {
				return fmt.Errorf("node %s: %s capacity %d allocatable %d, want %d and %d", d.node.Name(), res, c.Value(), a.Value(), want, want)
			}
		}
		return nil
	})
	if err == nil && dep.expected()[Resource] == 1 {
		err = d.WaitKubeletAllocatable(ctx, dep.DeviceID, timeout)
	}
	if err != nil {
		return fmt.Errorf("nvinject did not publish GPU %s: %w; see the device plugin's log (kubectl -n %s logs ds/%s)", uuid, err, Namespace, DevicePlugin)
	}
	return nil
}

func (d *Deployer) daemonSetReady(ctx context.Context, name string) error {
	ds, err := d.kube.Client.AppsV1().DaemonSets(Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	s := ds.Status
	if s.ObservedGeneration < ds.Generation || s.DesiredNumberScheduled < 1 ||
		s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberReady != s.DesiredNumberScheduled ||
		s.NumberAvailable != s.DesiredNumberScheduled || s.NumberUnavailable != 0 {
		return fmt.Errorf("desired %d updated %d ready %d available %d", s.DesiredNumberScheduled, s.UpdatedNumberScheduled, s.NumberReady, s.NumberAvailable)
	}
	return nil
}

// NodeGPUs returns the node's capacity and allocatable of Resource.
func (d *Deployer) NodeGPUs(ctx context.Context) (capacity, allocatable int64, err error) {
	n, err := d.kube.Client.CoreV1().Nodes().Get(ctx, d.node.Name(), metav1.GetOptions{})
	if err != nil {
		return 0, 0, fmt.Errorf("get node %s: %w", d.node.Name(), err)
	}
	c, a := n.Status.Capacity[Resource], n.Status.Allocatable[Resource]
	return c.Value(), a.Value(), nil
}

// DaemonSetPod returns the running, not terminating pod of DaemonSet name.
func (d *Deployer) DaemonSetPod(ctx context.Context, name string) (*corev1.Pod, error) {
	pods, err := d.kube.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + name})
	if err != nil {
		return nil, fmt.Errorf("list pods of %s: %w", name, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no running pod of DaemonSet %s/%s", Namespace, name)
}

// MetricsURL is the /metrics URL of a DaemonSet's pod (over the CNI bridge).
func (d *Deployer) MetricsURL(ctx context.Context, name string) (string, error) {
	return d.podURL(ctx, name, "/metrics")
}

func (d *Deployer) podURL(ctx context.Context, name, path string) (string, error) {
	p, err := d.DaemonSetPod(ctx, name)
	if err != nil {
		return "", err
	}
	port := DevicePluginMetricsPort
	if name == NRIPlugin {
		port = NRIMetricsPort
	}
	return fmt.Sprintf("http://%s:%d%s", p.Status.PodIP, port, path), nil
}

// Metrics reads a DaemonSet pod's Prometheus text.
func (d *Deployer) Metrics(ctx context.Context, name string) (string, error) {
	url, err := d.MetricsURL(ctx, name)
	if err != nil {
		return "", err
	}
	return httpDo(ctx, http.MethodGet, url)
}

// SimDebug POSTs to the device plugin's simulation-only endpoint
// /debug/sim/<action> (xid or recover) with query.
func (d *Deployer) SimDebug(ctx context.Context, action, query string) error {
	url, err := d.podURL(ctx, DevicePlugin, "/debug/sim/"+action+"?"+query)
	if err != nil {
		return err
	}
	_, err = httpDo(ctx, http.MethodPost, url)
	return err
}

func httpDo(ctx context.Context, method, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("%s %s: read body: %w", method, url, err)
	}
	if resp.StatusCode/100 != 2 {
		return string(body), fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, strings.TrimSpace(string(body)))
	}
	return string(body), nil
}
