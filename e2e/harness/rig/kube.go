package rig

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nvinject/nvinject/doctor/kubeexec"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Kube talks to the node's API server: client-go for reads and exec, the pinned
// kubectl for applying kustomizations as an operator would.
type Kube struct {
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
	kubectl    string
}

// NewKube loads kubeconfig; kubectl is taken from toolsBin.
func NewKube(kubeconfig, toolsBin string) (*Kube, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	return &Kube{Kubeconfig: kubeconfig, Config: cfg, Client: cs, kubectl: filepath.Join(toolsBin, "kubectl")}, nil
}

// KubectlArgs is the kubectl command line for args, as a user would type it.
func (k *Kube) KubectlArgs(args ...string) []string {
	return append([]string{k.kubectl, "--kubeconfig", k.Kubeconfig}, args...)
}

// Kubectl runs kubectl with stdin (may be empty) and returns its combined output.
func (k *Kube) Kubectl(ctx context.Context, stdin string, args ...string) (string, error) {
	argv := k.KubectlArgs(args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Exec runs cmd in a pod's container and returns its stdout.
func (k *Kube) Exec(ctx context.Context, ns, pod, container string, cmd ...string) (string, error) {
	return kubeexec.Exec(ctx, k.Config, k.Client, ns, pod, container, cmd...)
}

// Poll calls check every interval until it returns nil or ctx ends; the
// error then wraps check's last one.
func Poll(ctx context.Context, interval time.Duration, check func(context.Context) error) error {
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}
