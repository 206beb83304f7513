package nodelabels

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/kubehttp"
)

// restNodes speaks to the API server's nodes resource over shared/kubehttp
// (net/http, no client-go): a typed core/v1 client pulls client-go's scheme
// of every API group into the binary, and even client-go's REST transport
// costs the device plugin about 5 MB of idle RSS, for two requests.
type restNodes struct{ c *kubehttp.Client }

// NewREST returns the Nodes of the API server c speaks to.
func NewREST(c *kubehttp.Client) Nodes { return restNodes{c: c} }

func (r restNodes) UID(ctx context.Context, name string) (string, error) {
	var node struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	if err := r.c.Do(ctx, http.MethodGet, nodePath(name), nil, "", nil, &node); err != nil {
		return "", err
	}
	if node.Metadata.UID == "" {
		return "", fmt.Errorf("the API server's Node %s has no UID", name)
	}
	return node.Metadata.UID, nil
}

func (r restNodes) ApplyLabels(ctx context.Context, name, uid string, labels map[string]string) error {
	meta := map[string]any{"name": name, "uid": uid}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	body, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": meta})
	if err != nil {
		return err
	}
	q := url.Values{"fieldManager": {contract.NodeLabelManager}, "force": {"true"}}
	return r.c.Do(ctx, http.MethodPatch, nodePath(name), q, "application/apply-patch+yaml", body, nil)
}

func nodePath(name string) string { return "/api/v1/nodes/" + url.PathEscape(name) }
