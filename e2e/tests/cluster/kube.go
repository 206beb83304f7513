package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"github.com/nvinject/nvinject/doctor/kubeexec"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Env is the suite's connection to the cluster.
type Env struct {
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
}

// Connect loads kubeconfig.
func Connect(kubeconfig string) (*Env, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	return &Env{Kubeconfig: kubeconfig, Config: cfg, Client: cs}, nil
}

// Exec runs cmd in a pod's container over SPDY and returns stdout.
func (e *Env) Exec(ctx context.Context, ns, pod, container string, cmd ...string) (string, error) {
	return kubeexec.Exec(ctx, e.Config, e.Client, ns, pod, container, cmd...)
}

// Kubectl runs kubectl with the suite's kubeconfig.
func (e *Env) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", e.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Poll calls check every interval until it returns nil or ctx ends; the
// error then is check's last one.
func Poll(ctx context.Context, interval time.Duration, check func(context.Context) error) error {
	var last error
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), last)
		case <-time.After(interval):
		}
	}
}

// GPUNode returns name, or the only node publishing resource.
func (e *Env) GPUNode(ctx context.Context, name, resource string) (*corev1.Node, error) {
	if name != "" {
		return e.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	nodes, err := e.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var found []*corev1.Node
	for i := range nodes.Items {
		if _, ok := nodes.Items[i].Status.Capacity[corev1.ResourceName(resource)]; ok {
			found = append(found, &nodes.Items[i])
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%d nodes publish %s; set NVINJECT_WORKER", len(found), resource)
	}
	return found[0], nil
}

var gpuUUID = regexp.MustCompile(`GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)

// UUIDs returns the GPU UUIDs in s, in order.
func UUIDs(s string) []string { return gpuUUID.FindAllString(s, -1) }

// InjectedUUIDs finds nvinject-nri's "injected GPUs" log lines for pod and
// returns the UUIDs they record.
func InjectedUUIDs(log, pod string) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "injected GPUs") && strings.Contains(line, pod) {
			out = append(out, UUIDs(line)...)
		}
	}
	return out
}

// Getenv returns the variable or def.
func Getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
