package kubelocal

import (
	"log/slog"
	"time"
)

// Ports are the loopback ports the node listens on; none are the components' defaults,
// so the node does not collide with a system etcd or Kubernetes.
type Ports struct {
	EtcdClient, EtcdPeer         int
	APIServer                    int
	ControllerManager, Scheduler int
	Kubelet, KubeletHealthz      int
}

// DefaultPorts are the ports used unless WithPorts says otherwise.
var DefaultPorts = Ports{
	EtcdClient: 23790, EtcdPeer: 23800, APIServer: 16443,
	ControllerManager: 10357, Scheduler: 10359, Kubelet: 10350, KubeletHealthz: 10348,
}

const (
	// DefaultRunDir is short on purpose: unix socket paths must stay under ~100 bytes.
	DefaultRunDir   = "/tmp/nvinject-node"
	DefaultNodeName = "nvinject-sim-worker"
	// SandboxImage is the pause image containerd v2.2.9 pins; the node imports a local one.
	SandboxImage = "registry.k8s.io/pause:3.10.1"
)

// Option configures a Node.
type Option func(*Node)

// WithRunDir sets the directory holding all of the node's state, sockets and logs.
func WithRunDir(dir string) Option { return func(n *Node) { n.layout = layout{dir: dir} } }

// WithToolsBin sets the directory with kubelet, kube-apiserver, etcd, containerd, runc, ...
func WithToolsBin(dir string) Option { return func(n *Node) { n.bin = dir } }

// WithNodeName sets the Kubernetes node name.
func WithNodeName(name string) Option { return func(n *Node) { n.name = name } }

// WithPorts overrides the loopback ports.
func WithPorts(p Ports) Option { return func(n *Node) { n.ports = p } }

// WithPauseBinary sets a static pause program to pack as the sandbox image; without it
// Up builds e2e/cmd/pause with the Go toolchain.
func WithPauseBinary(path string) Option { return func(n *Node) { n.pauseBinary = path } }

// WithContainerdDropIn sets a containerd config fragment (version = 3) to merge into the
// node's containerd config, such as deploy/containerd/nvinject.toml.
func WithContainerdDropIn(path string) Option { return func(n *Node) { n.dropIn = path } }

// WithExtraCDIDirs adds CDI spec directories after the node's own <run dir>/cdi.
func WithExtraCDIDirs(dirs ...string) Option {
	return func(n *Node) { n.extraCDIDirs = append(n.extraCDIDirs, dirs...) }
}

// WithKubeletConfigTemplate replaces the embedded KubeletConfiguration template.
func WithKubeletConfigTemplate(path string) Option { return func(n *Node) { n.kubeletTemplate = path } }

// WithContainerdConfigTemplate replaces the embedded containerd config template.
func WithContainerdConfigTemplate(path string) Option {
	return func(n *Node) { n.containerdTemplate = path }
}

// WithCNIBinDir sets where the CNI plugins live (Debian containernetworking-plugins).
func WithCNIBinDir(dir string) Option { return func(n *Node) { n.cniBin = dir } }

// WithTimeout bounds each component's readiness wait.
func WithTimeout(d time.Duration) Option { return func(n *Node) { n.timeout = d } }

// WithControlPlaneOnly starts etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler only: no containerd, no kubelet, no host-wide state, so it can run
// beside a local node (on other ports and another run dir). For fleets of fake nodes
// (KWOK).
func WithControlPlaneOnly() Option { return func(n *Node) { n.controlPlaneOnly = true } }

// WithWorkers adds GPU nodes after the first, named names (at most MaxWorkers), each a
// Worker with its own containerd and kubelet in namespaces of its own. With workers the
// API server listens on the nodes' bridge (10.235.0.1) instead of loopback, so every
// node's network namespace reaches it.
func WithWorkers(names ...string) Option {
	return func(n *Node) { n.workers = append(n.workers, names...) }
}

// WithNodeLocalDirs names host directories every worker has its own copy of, mounted
// over the path in its mount namespace (such as the simulated driver root), beside the
// run dir's node directories and kubelet's device-plugin dir, which are always its own.
func WithNodeLocalDirs(dirs ...string) Option {
	return func(n *Node) { n.nodeLocalDirs = append(n.nodeLocalDirs, dirs...) }
}

// WithComponentArgs appends flags to one control-plane component's command line
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet); later
// flags win, so they override the node's own. For sizing the control plane to a
// fleet of fake nodes: request limits, client QPS.
func WithComponentArgs(component string, args ...string) Option {
	return func(n *Node) {
		if n.extraArgs == nil {
			n.extraArgs = map[string][]string{}
		}
		n.extraArgs[component] = append(n.extraArgs[component], args...)
	}
}

// WithLogger sets the logger for progress messages.
func WithLogger(l *slog.Logger) Option { return func(n *Node) { n.log = l } }
