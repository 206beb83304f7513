package nodelabels

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/nvinject/nvinject/shared/contract"
)

// maxBody bounds what is read of one API server response.
const maxBody = 1 << 20

// restNodes speaks to the API server's nodes resource over client-go's
// authenticated transport with no typed client: a typed core/v1 client
// pulls client-go's scheme of every API group into the binary, which
// cost the device plugin 18 MB of idle RSS for two requests.
type restNodes struct {
	client *http.Client
	base   string
}

// NewREST returns the Nodes of the API server cfg names.
func NewREST(cfg *rest.Config) (Nodes, error) {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client for %s: %w", cfg.Host, err)
	}
	base, err := url.Parse(cfg.Host)
	if err != nil || base.Host == "" {
		return nil, fmt.Errorf("API server address %q is not a URL such as https://10.0.0.1:6443", cfg.Host)
	}
	return &restNodes{client: client, base: strings.TrimSuffix(base.String(), "/") + strings.TrimSuffix(cfg.APIPath, "/") + "/api/v1/nodes/"}, nil
}

func (r *restNodes) UID(ctx context.Context, name string) (string, error) {
	var node struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	if err := r.do(ctx, http.MethodGet, name, nil, "", nil, &node); err != nil {
		return "", err
	}
	if node.Metadata.UID == "" {
		return "", fmt.Errorf("the API server's Node %s has no UID", name)
	}
	return node.Metadata.UID, nil
}

func (r *restNodes) ApplyLabels(ctx context.Context, name, uid string, labels map[string]string) error {
	meta := map[string]any{"name": name, "uid": uid}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	body, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": meta})
	if err != nil {
		return err
	}
	q := url.Values{"fieldManager": {contract.NodeLabelManager}, "force": {"true"}}
	return r.do(ctx, http.MethodPatch, name, q, "application/apply-patch+yaml", body, nil)
}

// do sends one request for the Node name; an error answer comes back as
// the API server's own Status (apierrors.IsNotFound and friends work).
func (r *restNodes) do(ctx context.Context, method, name string, q url.Values, contentType string, body []byte, out any) error {
	u := r.base + url.PathEscape(name)
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("%s %s: read the answer: %w", method, u, err)
	}
	if resp.StatusCode/100 != 2 {
		var st metav1.Status
		if json.Unmarshal(data, &st) != nil || st.Kind != "Status" {
			st = metav1.Status{Status: metav1.StatusFailure, Code: int32(resp.StatusCode), Reason: metav1.StatusReasonUnknown,
				Message: fmt.Sprintf("%s %s: %s: %s", method, u, resp.Status, contract.Quote(string(data)))}
		}
		return &apierrors.StatusError{ErrStatus: st}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode the answer: %w", method, u, err)
	}
	return nil
}
