package nodelabels

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/kubehttp"
)

// The REST Nodes sends what the API server's server-side apply takes: a
// GET of the Node, then a forced apply-patch under the shared manager
// with the UID as precondition; the server's Status errors come back as
// kubehttp.StatusErrors, and an answer that is not a Status is quoted,
// bounded.
func TestRESTNodes(t *testing.T) {
	var applied struct {
		method, contentType, query string
		body                       map[string]any
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("User-Agent"); got != "nodelabels-test" {
			t.Errorf("user agent %q", got)
		}
		switch {
		case r.URL.Path == "/api/v1/nodes/"+nodeName && r.Method == http.MethodGet:
			io.WriteString(w, `{"kind":"Node","apiVersion":"v1","metadata":{"name":"`+nodeName+`","uid":"uid-7"}}`)
		case r.URL.Path == "/api/v1/nodes/"+nodeName && r.Method == http.MethodPatch:
			applied.method, applied.contentType, applied.query = r.Method, r.Header.Get("Content-Type"), r.URL.RawQuery
			if err := json.NewDecoder(r.Body).Decode(&applied.body); err != nil {
				t.Error(err)
			}
			io.WriteString(w, `{"kind":"Node","apiVersion":"v1"}`)
		case r.URL.Path == "/api/v1/nodes/missing":
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"nodes \"missing\" not found","reason":"NotFound","code":404}`)
		default:
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, strings.Repeat("<html>proxy error</html>", 1000))
		}
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: '"+srv.URL+"'}}]\nusers: [{name: u, user: {}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nodes, err := Client(kubeconfig, kubehttp.InCluster{}, "nodelabels-test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	uid, err := nodes.UID(ctx, nodeName)
	if err != nil || uid != "uid-7" {
		t.Fatalf("UID = %q, %v; want uid-7", uid, err)
	}
	if err := nodes.ApplyLabels(ctx, nodeName, uid, map[string]string{contract.GFDLabelCount: "8"}); err != nil {
		t.Fatal(err)
	}
	meta, _ := applied.body["metadata"].(map[string]any)
	labels, _ := meta["labels"].(map[string]any)
	if applied.contentType != "application/apply-patch+yaml" || applied.query != "fieldManager="+strings.ReplaceAll(contract.NodeLabelManager, "/", "%2F")+"&force=true" ||
		applied.body["kind"] != "Node" || meta["uid"] != "uid-7" || meta["name"] != nodeName || labels[contract.GFDLabelCount] != "8" {
		t.Errorf("apply %s %q ?%s body %v; want a forced apply by %s with the UID and the labels", applied.method, applied.contentType, applied.query, applied.body, contract.NodeLabelManager)
	}
	if err := nodes.ApplyLabels(ctx, nodeName, uid, nil); err != nil {
		t.Fatal(err)
	}
	if meta, _ := applied.body["metadata"].(map[string]any); meta["labels"] != nil {
		t.Errorf("withdrawal sent labels %v; want none (the server removes this manager's)", meta["labels"])
	}
	if _, err := nodes.UID(ctx, "missing"); !kubehttp.IsNotFound(err) || !strings.Contains(err.Error(), `"missing" not found`) {
		t.Errorf("UID of a missing Node: %v; want the server's NotFound", err)
	}
	_, err = nodes.UID(ctx, "behind-a-broken-proxy")
	var status *kubehttp.StatusError
	if !errors.As(err, &status) || status.Code != http.StatusBadGateway || len(err.Error()) > 1024 || !strings.Contains(err.Error(), "502 Bad Gateway") {
		t.Errorf("an answer that is not a Status: %v; want a bounded error with the HTTP status", err)
	}
}
