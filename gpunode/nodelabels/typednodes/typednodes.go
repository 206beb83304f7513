// Package typednodes serves nodelabels.Nodes with client-go's typed
// core/v1 client, for programs that link it anyway (nvinject-dra) and for
// tests with client-go's fake clientset. The device plugin uses
// nodelabels.NewREST instead and links no typed client.
package typednodes

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

// Nodes adapts a typed NodeInterface.
type Nodes struct{ c typedcorev1.NodeInterface }

// New returns the Nodes of c.
func New(c typedcorev1.NodeInterface) Nodes { return Nodes{c: c} }

// UID is the Node's UID.
func (n Nodes) UID(ctx context.Context, name string) (string, error) {
	node, err := n.c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return string(node.UID), nil
}

// ApplyLabels applies labels to the Node with UID uid, forced, under the
// shared field manager.
func (n Nodes) ApplyLabels(ctx context.Context, name, uid string, labels map[string]string) error {
	ac := corev1ac.Node(name).WithUID(types.UID(uid))
	if len(labels) > 0 {
		ac.WithLabels(labels)
	}
	_, err := n.c.Apply(ctx, ac, metav1.ApplyOptions{FieldManager: contract.NodeLabelManager, Force: true})
	return err
}
