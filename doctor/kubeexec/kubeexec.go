// Package kubeexec runs a command in a pod's container through the API
// server, as `kubectl exec` does.
package kubeexec

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
)

// Exec runs cmd in container of ns/pod over SPDY and returns its stdout.
func Exec(ctx context.Context, cfg *rest.Config, client kubernetes.Interface, ns, pod, container string, cmd ...string) (string, error) {
	req := client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return "", fmt.Errorf("exec in %s/%s: %w", ns, pod, err)
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return stdout.String(), fmt.Errorf("exec %q in %s/%s: %w: %s", strings.Join(cmd, " "), ns, pod, err, stderr.String())
	}
	return stdout.String(), nil
}
