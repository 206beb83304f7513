// Package localnode runs a real single-node Kubernetes on this host for end-to-end tests:
// containerd (with NRI and CDI), etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager and kubelet, each a pinned binary from e2e/harness/tools, all state
// under one run dir and all traffic on loopback.
package kubelocal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nvinject/nvinject/e2e/internal/proc"
)

// Node is one local node, described by its run dir; Up, Down and Status may run in
// different processes.
type Node struct {
	layout             layout
	bin                string
	name               string
	ports              Ports
	pauseBinary        string
	dropIn             string
	extraCDIDirs       []string
	kubeletTemplate    string
	containerdTemplate string
	cniBin             string
	controlPlaneOnly   bool
	workers            []string
	nodeLocalDirs      []string
	extraArgs          map[string][]string
	apiHost            string
	timeout            time.Duration
	log                *slog.Logger
}

// New returns a node; nothing starts until Up.
func New(opts ...Option) *Node {
	n := &Node{
		layout: layout{dir: DefaultRunDir}, name: DefaultNodeName, ports: DefaultPorts,
		cniBin: "/usr/lib/cni", timeout: 90 * time.Second, log: slog.Default(),
	}
	for _, o := range opts {
		o(n)
	}
	n.apiHost = "127.0.0.1"
	if len(n.workers) > 0 {
		n.apiHost = nodesGateway
	}
	return n
}

// RunDir is where the node keeps its state and logs.
func (n *Node) RunDir() string { return n.layout.dir }

// Name is the Kubernetes node name.
func (n *Node) Name() string { return n.name }

// Kubeconfig is an admin (system:masters) kubeconfig for the node's API server.
func (n *Node) Kubeconfig() string { return n.layout.kubeconfig("admin") }

// ContainerdSocket is the CRI endpoint of the node's containerd.
func (n *Node) ContainerdSocket() string { return n.layout.containerdSocket() }

// NRISocket is where NRI plugins connect to the node's containerd.
func (n *Node) NRISocket() string { return n.layout.nriSocket() }

// CDIDir is the first CDI spec directory of the node's containerd.
func (n *Node) CDIDir() string { return n.layout.cdiDir() }

// APIServerAddress is the API server's loopback address and port, for pods
// that must reach it without a kubernetes Service (the node has no kube-proxy).
func (n *Node) APIServerAddress() (host string, port int) { return n.apiHost, n.ports.APIServer }

// LogFile is the log of a component (containerd, etcd, kube-apiserver, kubelet, ...).
func (n *Node) LogFile(component string) string { return n.layout.logFile(component) }

// Up starts every component in order and returns once the node is Ready.
func (n *Node) Up(ctx context.Context) error {
	start := time.Now()
	if err := n.checkPrereqs(); err != nil {
		return err
	}
	for _, c := range n.components() {
		if pid, _ := proc.Find(n.layout.pidFile(c.name)); pid != 0 {
			return fmt.Errorf("%s is already running (pid %d): run `kubelocal down -run-dir %s` first", c.name, pid, n.layout.dir)
		}
	}
	if !n.controlPlaneOnly {
		if err := n.claimHost(); err != nil {
			return err
		}
	}
	// A crashed earlier run can leave mounts, cgroups or a bridge; clear them first.
	if err := n.Down(ctx); err != nil {
		return fmt.Errorf("clean up the previous node: %w", err)
	}
	if err := os.RemoveAll(n.layout.logs()); err != nil {
		return fmt.Errorf("remove old logs: %w", err)
	}
	for _, d := range []string{n.layout.logs(), n.layout.path("pids"), n.layout.cdiDir(), n.layout.staticPods(),
		n.layout.path("nri", "plugins"), n.layout.path("nri", "conf.d"), n.layout.runcRoot()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	if err := os.MkdirAll(n.layout.path("kubeconfig"), 0o700); err != nil {
		return fmt.Errorf("create kubeconfig dir: %w", err)
	}
	// down and status in a later process find the same binaries through this file.
	if err := os.WriteFile(n.layout.path("tools-bin"), []byte(n.bin), 0o644); err != nil {
		return fmt.Errorf("record tools bin dir: %w", err)
	}
	if err := os.WriteFile(n.layout.path("api-host"), []byte(n.apiHost), 0o644); err != nil {
		return fmt.Errorf("record API server address: %w", err)
	}
	if len(n.workers) > 0 {
		if err := n.makeNodesBridge(ctx); err != nil {
			return err
		}
	}
	if n.controlPlaneOnly {
		if err := os.WriteFile(n.layout.path(controlPlaneOnlyMark), nil, 0o644); err != nil {
			return fmt.Errorf("record control-plane-only: %w", err)
		}
	}
	creds, err := n.writeCredentials()
	if err != nil {
		return err
	}
	if err := n.writeConfigs(creds); err != nil {
		return err
	}
	for _, c := range n.components() {
		if err := n.startAndWait(ctx, c); err != nil {
			return err
		}
		if c.name == "containerd" {
			if err := n.importSandboxImage(ctx); err != nil {
				return err
			}
		}
	}
	if err := n.waitNodeReady(ctx); err != nil {
		return err
	}
	for _, w := range n.Workers() {
		if err := w.up(ctx, creds.ca); err != nil {
			return err
		}
	}
	n.log.Info("node ready", "node", n.name, "took", time.Since(start).Round(time.Millisecond),
		"kubeconfig", n.Kubeconfig(), "containerd", n.ContainerdSocket())
	return nil
}

// useRecordedBin falls back to the tools bin dir that up recorded in the run dir,
// and learns whether up started the control plane only.
func (n *Node) useRecordedBin() {
	if _, err := os.Stat(n.layout.path(controlPlaneOnlyMark)); err == nil {
		n.controlPlaneOnly = true
	}
	if data, err := os.ReadFile(n.layout.path("api-host")); err == nil {
		n.apiHost = strings.TrimSpace(string(data))
	}
	if n.bin != "" {
		return
	}
	if data, err := os.ReadFile(n.layout.path("tools-bin")); err == nil {
		n.bin = strings.TrimSpace(string(data))
	}
}

// controlPlaneOnlyMark in the run dir tells down and status in a later process that
// up started no containerd and no kubelet.
const controlPlaneOnlyMark = "control-plane-only"

// maxSocketPath leaves room under the kernel's 108-byte sun_path limit.
const maxSocketPath = 100

func (n *Node) checkPrereqs() error {
	for _, sock := range []string{n.layout.containerdSocket() + ".ttrpc", n.layout.nriSocket(),
		n.layout.path("kubelet", "pod-resources", "kubelet.sock")} {
		if len(sock) > maxSocketPath {
			return fmt.Errorf("socket path %s is %d bytes, over %d: choose a shorter run dir", sock, len(sock), maxSocketPath)
		}
	}
	if len(n.workers) > MaxWorkers {
		return fmt.Errorf("%d workers asked for, at most %d", len(n.workers), MaxWorkers)
	}
	if len(n.workers) > 0 && n.controlPlaneOnly {
		return errors.New("workers need the first node: WithWorkers and WithControlPlaneOnly exclude each other")
	}
	for name := range n.extraArgs {
		if !slices.ContainsFunc(n.allComponents(), func(c component) bool { return c.name == name }) {
			return fmt.Errorf("flags given for %q, which the node does not run: name one of etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet", name)
		}
	}
	for i, w := range n.workers {
		if w == "" || w == n.name || slices.Contains(n.workers[:i], w) {
			return fmt.Errorf("worker name %q is empty or taken: give every node its own name", w)
		}
	}
	for _, t := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "crictl", "etcd",
		"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"} {
		if _, err := os.Stat(n.tool(t)); err != nil {
			return fmt.Errorf("tool %s missing from %q: run `make tools` and pass its bin dir (NVINJECT_TOOLS_BIN): %w", t, n.bin, err)
		}
	}
	if n.controlPlaneOnly {
		return nil
	}
	if _, err := os.Stat(filepath.Join(n.cniBin, "bridge")); err != nil {
		return fmt.Errorf("CNI bridge plugin missing in %s: apt-get install containernetworking-plugins: %w", n.cniBin, err)
	}
	return nil
}

func (n *Node) startAndWait(ctx context.Context, c component) error {
	path, args, err := n.command(c)
	if err != nil {
		return err
	}
	t0 := time.Now()
	pid, err := proc.Start(proc.Spec{
		Name: c.name, Path: path, Args: args, Binary: n.tool(c.tool),
		// containerd finds containerd-shim-runc-v2 on its PATH.
		Env:     []string{"PATH=" + n.bin + ":" + os.Getenv("PATH")},
		LogFile: n.layout.logFile(c.name), PidFile: n.layout.pidFile(c.name),
	})
	if err != nil {
		return err
	}
	err = n.poll(ctx, func(ctx context.Context) error {
		if !proc.Running(pid, "") {
			return errExited
		}
		return c.probe(ctx)
	})
	if err != nil {
		return fmt.Errorf("%s not ready: %w; see its log %s%s", c.name, err, n.layout.logFile(c.name), logTail(n.layout.logFile(c.name)))
	}
	n.log.Info("component ready", "component", c.name, "pid", pid, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

var errExited = errors.New("process exited")

// poll retries check until it succeeds, the process exits, or the node's timeout passes.
func (n *Node) poll(ctx context.Context, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, n.timeout)
	defer cancel()
	for {
		err := check(ctx)
		if err == nil || errors.Is(err, errExited) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out after %s: %w", n.timeout, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (n *Node) waitNodeReady(ctx context.Context) error {
	c, err := n.apiClient()
	if err != nil {
		return err
	}
	t0 := time.Now()
	if !n.controlPlaneOnly {
		if err := n.poll(ctx, func(ctx context.Context) error { return c.nodeReady(ctx, n.name) }); err != nil {
			return fmt.Errorf("node %s not Ready: %w; see %s and %s", n.name, err, n.layout.logFile("kubelet"), n.layout.logFile("containerd"))
		}
	}
	// Pods are rejected until the controller-manager creates the default ServiceAccount.
	if err := n.poll(ctx, func(ctx context.Context) error {
		return c.do(ctx, http.MethodGet, "/api/v1/namespaces/default/serviceaccounts/default", nil)
	}); err != nil {
		return fmt.Errorf("default ServiceAccount missing: %w; see %s", err, n.layout.logFile("kube-controller-manager"))
	}
	n.log.Info("node Ready", "node", n.name, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// logTail returns the last error lines of a log (klog "E..." or logrus level=error/fatal)
// for error messages, or its last lines when it has none.
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil || len(data) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var errs []string
	for _, l := range lines {
		if strings.HasPrefix(l, "E") || strings.HasPrefix(l, "F") || strings.Contains(l, "level=error") || strings.Contains(l, "level=fatal") {
			errs = append(errs, l)
		}
	}
	if len(errs) > 0 {
		lines = errs
	}
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return "; last lines:\n  " + strings.Join(lines, "\n  ")
}
