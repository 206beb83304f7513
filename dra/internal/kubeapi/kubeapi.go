// Package kubeapi is nvinject-dra's use of the API server: the client from
// --kubeconfig or the pod's service account, ResourceClaim reads for
// prepare, and the Node and ResourceSlice calls of the node-move policy
// (gpunode/nodemove).
package kubeapi

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/kubeclient"
)

// NewClient builds the API client from kubeconfig, or from the pod's
// service account when kubeconfig is empty (shared/kubeclient); userAgent
// names the program.
func NewClient(kubeconfig, userAgent string) (kubernetes.Interface, error) {
	cfg, err := kubeclient.Config(kubeconfig, userAgent)
	if err != nil {
		return nil, err
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client for %s: %w", cfg.Host, err)
	}
	return c, nil
}

// Claims reads ResourceClaims: nil, nil for one that does not exist.
func Claims(c kubernetes.Interface) func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	return func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
		rc, err := c.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return rc, err
	}
}

// Nodes is nodemove.NodeAPI over the API client.
type Nodes struct{ Client kubernetes.Interface }

// NodeLabels returns the node's labels.
func (n Nodes) NodeLabels(ctx context.Context, node string) (map[string]string, error) {
	got, err := n.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return got.Labels, nil
}

// DeleteSlices deletes the node's ResourceSlices of nvinject's driver.
func (n Nodes) DeleteSlices(ctx context.Context, node string) error {
	sel := fields.AndSelectors(fields.OneTermEqualSelector("spec.nodeName", node), fields.OneTermEqualSelector("spec.driver", contract.DRADriver)).String()
	list, err := n.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return err
	}
	for _, rs := range list.Items {
		// A fake or older API server may ignore the field selector.
		if rs.Spec.Driver != contract.DRADriver || rs.Spec.NodeName == nil || *rs.Spec.NodeName != node {
			continue
		}
		if err := n.Client.ResourceV1().ResourceSlices().Delete(ctx, rs.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}
