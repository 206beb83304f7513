package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"k8s.io/client-go/kubernetes"
)

// readyzPath is the daemons' readiness endpoint (shared/httpserve).
const readyzPath = "/readyz"

// ProxyProber reads /readyz through the API server's pod proxy, so the
// operator's machine needs no route to the pod network.
type ProxyProber struct{ Client kubernetes.Interface }

// Readyz returns the body the daemon answered, also when it answered 503
// (a not-ready daemon says why in it). An error is the API server's own:
// the pod could not be reached, or proxying is forbidden.
func (p ProxyProber) Readyz(ctx context.Context, namespace, pod string, port int) (string, error) {
	body, err := p.Client.CoreV1().Pods(namespace).ProxyGet("http", pod, strconv.Itoa(port), readyzPath, nil).DoRaw(ctx)
	if err == nil {
		return string(body), nil
	}
	// The API server's failures come as a Status object, the daemon's
	// answer as text.
	var st struct{ Kind, Message string }
	if len(body) == 0 || json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
		if st.Message != "" {
			return "", errors.New(st.Message)
		}
		return "", err
	}
	return string(body), nil
}
