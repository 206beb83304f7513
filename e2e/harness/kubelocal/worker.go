package kubelocal

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nvinject/nvinject/e2e/internal/hostclean"
	"github.com/nvinject/nvinject/e2e/internal/pki"
	"github.com/nvinject/nvinject/e2e/internal/proc"
)

// A Worker is one more GPU node of the cluster the first node heads: its own containerd
// and kubelet in a network namespace of its own (its own node IP and pod CIDR) and a
// mount namespace of its own, in which the worker's directories are mounted over the
// paths the first node uses (its run-dir paths, kubelet's fixed device-plugin dir and
// any WithNodeLocalDirs). So one DaemonSet, with one set of host paths, runs on every
// node, and each node sees only its own sockets, CDI specs, state and driver root, as
// on separate machines. Crashing or restarting one worker's programs leaves the others
// alone.
type Worker struct {
	n     *Node
	name  string
	index int // 1 for the second node of the cluster
	back  layout
}

// The nodes' network: a host bridge with the API server's address, one veth per
// worker, and a route per worker to its pod CIDR.
const (
	nodesBridge  = "nvinject-nodes"
	nodesGateway = "10.235.0.1"
	nodesPrefix  = "10.235.0."
	nodesMask    = "/24"
	// MaxWorkers bounds WithWorkers: the nodes' addresses and pod CIDRs are numbered.
	MaxWorkers = 8
)

// workerMeta is what Down and Status in a later process need to find a worker.
type workerMeta struct {
	Name  string `json:"name"`
	Index int    `json:"index"`
}

func (n *Node) newWorker(name string, index int) *Worker {
	return &Worker{n: n, name: name, index: index, back: layout{dir: n.layout.path("nodes", name)}}
}

// Workers are the cluster's nodes after the first, in order.
func (n *Node) Workers() []*Worker {
	if len(n.workers) > 0 {
		out := make([]*Worker, len(n.workers))
		for i, name := range n.workers {
			out[i] = n.newWorker(name, i+1)
		}
		return out
	}
	return n.recordedWorkers()
}

// recordedWorkers reads the workers an earlier Up recorded in the run dir.
func (n *Node) recordedWorkers() []*Worker {
	metas, _ := filepath.Glob(n.layout.path("nodes", "*", "worker.json"))
	var out []*Worker
	for _, m := range metas {
		data, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		var meta workerMeta
		if json.Unmarshal(data, &meta) == nil && meta.Name != "" {
			out = append(out, n.newWorker(meta.Name, meta.Index))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].index < out[j].index })
	return out
}

// Name is the worker's Kubernetes node name.
func (w *Worker) Name() string { return w.name }

// IP is the worker's node IP, on the nodes' bridge.
func (w *Worker) IP() string { return nodesPrefix + strconv.Itoa(10+w.index) }

// PodSubnet is the worker's pod CIDR.
func (w *Worker) PodSubnet() string { return fmt.Sprintf("10.233.%d.0/24", 77+w.index) }

// NetNS is the name of the worker's network namespace (ip netns).
func (w *Worker) NetNS() string { return "nvinject-w" + strconv.Itoa(w.index) }

// ContainerdSocket is the worker's containerd socket as the host reaches it.
func (w *Worker) ContainerdSocket() string { return w.HostPath(w.n.layout.containerdSocket()) }

// CDIDir is the worker's CDI spec dir as the host reaches it.
func (w *Worker) CDIDir() string { return w.HostPath(w.n.layout.cdiDir()) }

// LogFile is the log of one of the worker's programs (containerd, kubelet).
func (w *Worker) LogFile(component string) string { return w.back.logFile(component) }

// HostPath is where a path the worker's programs and pods see (one of the first node's
// paths, kubelet's device-plugin dir or a WithNodeLocalDirs dir) is on the host.
func (w *Worker) HostPath(p string) string {
	for _, d := range w.overlays() {
		if p == d.view || strings.HasPrefix(p, d.view+"/") {
			return d.back + strings.TrimPrefix(p, d.view)
		}
	}
	return p
}

// Command returns cmd run inside the worker's mount and network namespaces, as the
// worker's own programs run: for equipment that changes what the node sees (its driver
// root) or looks at it as its pods do.
func (w *Worker) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--mount=" + w.mountNS(), "--net=/run/netns/" + w.NetNS(), "--", name}, args...)...)
}

// ImportImage imports an OCI image archive into the worker's containerd.
func (w *Worker) ImportImage(ctx context.Context, archive string) error {
	out, err := exec.CommandContext(ctx, w.n.tool("ctr"), "--address", w.ContainerdSocket(),
		"-n", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("import %s into %s's containerd (log: %s): %w: %s", archive, w.name, w.LogFile("containerd"), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Stop stops one of the worker's programs (kubelet or containerd); its containers run on.
func (w *Worker) Stop(ctx context.Context, component string) error {
	if _, err := w.component(component); err != nil {
		return err
	}
	if err := proc.Stop(ctx, w.back.pidFile(component), 15*time.Second); err != nil {
		return fmt.Errorf("stop %s on %s: %w", component, w.name, err)
	}
	return nil
}

// Start starts a stopped program of the worker again and waits until it is ready.
func (w *Worker) Start(ctx context.Context, component string) error {
	c, err := w.component(component)
	if err != nil {
		return err
	}
	return w.startAndWait(ctx, c)
}

// Restart is Stop then Start.
func (w *Worker) Restart(ctx context.Context, component string) error {
	if err := w.Stop(ctx, component); err != nil {
		return err
	}
	return w.Start(ctx, component)
}

func (w *Worker) component(name string) (component, error) {
	for _, c := range w.components() {
		if c.name == name {
			return c, nil
		}
	}
	return component{}, fmt.Errorf("node %s has no component %q (containerd, kubelet)", w.name, name)
}

type overlay struct{ view, back string }

// overlays are the worker's own directories and the paths they are mounted over in its
// mount namespace.
func (w *Worker) overlays() []overlay {
	var out []overlay
	for _, d := range []string{"containerd", "cni", "cdi", "nri", "kubelet", "kubelet-pki", "runc", "pod-logs",
		"volume-plugins", "manifests"} {
		out = append(out, overlay{view: w.n.layout.path(d), back: w.back.path(d)})
	}
	local := append([]string{hostDevicePlugins}, w.n.nodeLocalDirs...)
	for _, d := range local {
		out = append(out, overlay{view: d, back: w.back.path("local", strings.ReplaceAll(strings.Trim(d, "/"), "/", "_"))})
	}
	return out
}

func (w *Worker) mountNS() string { return w.back.path("ns", "mnt") }
func (w *Worker) cgroup() string  { return "nvinject-" + w.name }

func (w *Worker) components() []component {
	view := w.n.layout
	return []component{
		{
			name: "containerd", tool: "containerd",
			args: []string{"--config", view.containerdConfig()},
			probe: func(ctx context.Context) error {
				ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				out, err := exec.CommandContext(ctx, w.n.tool("ctr"), "--address", w.ContainerdSocket(), "version").CombinedOutput()
				if err != nil {
					return fmt.Errorf("ctr version: %w: %s", err, strings.TrimSpace(string(out)))
				}
				return nil
			},
		},
		{
			name: "kubelet", tool: "kubelet",
			args: []string{
				"--config=" + w.back.kubeletConfig(), "--kubeconfig=" + w.back.kubeconfig("kubelet"),
				"--root-dir=" + view.kubeletRoot(), "--cert-dir=" + view.path("kubelet-pki"),
				"--hostname-override=" + w.name, "--node-ip=" + w.IP(), "--v=2",
			},
			probe: func(ctx context.Context) error {
				return probeHTTP(ctx, fmt.Sprintf("http://%s:%d/healthz", w.IP(), w.n.ports.KubeletHealthz))
			},
		},
	}
}

func (w *Worker) startAndWait(ctx context.Context, c component) error {
	t0 := time.Now()
	bin := w.n.tool(c.tool)
	pid, err := proc.Start(proc.Spec{
		Name: w.name + "/" + c.name, Path: "nsenter",
		Args:    append([]string{"--mount=" + w.mountNS(), "--net=/run/netns/" + w.NetNS(), "--", bin}, c.args...),
		Binary:  bin,
		Env:     []string{"PATH=" + w.n.bin + ":" + os.Getenv("PATH")},
		LogFile: w.back.logFile(c.name), PidFile: w.back.pidFile(c.name),
	})
	if err != nil {
		return err
	}
	err = w.n.poll(ctx, func(ctx context.Context) error {
		if !proc.Running(pid, "") {
			return errExited
		}
		return c.probe(ctx)
	})
	if err != nil {
		return fmt.Errorf("%s on %s not ready: %w; see its log %s%s", c.name, w.name, err, w.back.logFile(c.name), logTail(w.back.logFile(c.name)))
	}
	w.n.log.Info("component ready", "node", w.name, "component", c.name, "pid", pid, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// up makes the worker's namespaces, configs and credentials and starts its programs.
func (w *Worker) up(ctx context.Context, ca *pki.CA) error {
	t0 := time.Now()
	for _, d := range []string{w.back.logs(), w.back.path("pids"), w.back.path("ns"), w.back.path("kubeconfig"), w.back.pki()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	meta, _ := json.Marshal(workerMeta{Name: w.name, Index: w.index})
	if err := os.WriteFile(w.back.path("worker.json"), meta, 0o644); err != nil {
		return fmt.Errorf("record worker %s: %w", w.name, err)
	}
	if err := w.makeNetNS(ctx); err != nil {
		return err
	}
	if err := w.makeMountNS(ctx); err != nil {
		return err
	}
	for _, root := range hostclean.CgroupRoots() {
		if err := os.MkdirAll(filepath.Join(root, w.cgroup()), 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", filepath.Join(root, w.cgroup()), err)
		}
	}
	if err := w.writeCredentials(ca); err != nil {
		return err
	}
	if err := w.writeConfigs(ca); err != nil {
		return err
	}
	for _, d := range []string{w.n.layout.staticPods(), w.n.layout.path("nri", "plugins"), w.n.layout.path("nri", "conf.d"),
		w.n.layout.cdiDir(), w.n.layout.runcRoot()} {
		if err := os.MkdirAll(w.HostPath(d), 0o755); err != nil {
			return fmt.Errorf("create %s: %w", w.HostPath(d), err)
		}
	}
	comps := w.components()
	if err := w.startAndWait(ctx, comps[0]); err != nil {
		return err
	}
	if err := w.ImportImage(ctx, filepath.Join(w.n.layout.images(), "pause.tar")); err != nil {
		return err
	}
	if err := w.startAndWait(ctx, comps[1]); err != nil {
		return err
	}
	c, err := w.n.apiClient()
	if err != nil {
		return err
	}
	if err := w.n.poll(ctx, func(ctx context.Context) error { return c.nodeReady(ctx, w.name) }); err != nil {
		return fmt.Errorf("node %s not Ready: %w; see %s", w.name, err, w.back.logFile("kubelet"))
	}
	w.n.log.Info("node ready", "node", w.name, "ip", w.IP(), "pod CIDR", w.PodSubnet(), "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// makeNetNS creates the worker's network namespace, wired to the nodes' bridge, with a
// host route to its pod CIDR.
func (w *Worker) makeNetNS(ctx context.Context) error {
	ns, veth := w.NetNS(), "nvw"+strconv.Itoa(w.index)
	steps := [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"ip", "link", "set", veth, "master", nodesBridge, "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", ns, "addr", "add", w.IP() + nodesMask, "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "route", "add", "default", "via", nodesGateway},
		{"ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "route", "replace", w.PodSubnet(), "via", w.IP()},
	}
	return run(ctx, "network of node "+w.name, steps)
}

// makeMountNS creates the worker's mount namespace (a slave of the host's, so mounts
// made on the host reach it) and mounts the worker's directories over the first node's
// paths in it, each shared so that pods' HostToContainer mounts see later mounts.
func (w *Worker) makeMountNS(ctx context.Context) error {
	nsDir := w.back.path("ns")
	// unshare --mount=FILE keeps the namespace by bind-mounting it on FILE, which must
	// sit on a private mount.
	if err := os.WriteFile(w.mountNS(), nil, 0o644); err != nil {
		return fmt.Errorf("create %s: %w", w.mountNS(), err)
	}
	if err := run(ctx, "mount namespace of node "+w.name, [][]string{
		{"mount", "--bind", nsDir, nsDir},
		{"mount", "--make-private", nsDir},
		{"unshare", "--mount=" + w.mountNS(), "--propagation", "slave", "true"},
	}); err != nil {
		return err
	}
	var script []string
	for _, o := range w.overlays() {
		for _, d := range []string{o.view, o.back} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("create %s: %w", d, err)
			}
		}
		script = append(script, fmt.Sprintf("mount --bind %q %q && mount --make-shared %q", o.back, o.view, o.view))
	}
	return run(ctx, "mounts of node "+w.name, [][]string{{"nsenter", "--mount=" + w.mountNS(), "--", "sh", "-ec", strings.Join(script, "\n")}})
}

// writeCredentials issues the worker kubelet's client and serving certificates.
func (w *Worker) writeCredentials(ca *pki.CA) error {
	dir := w.back.pki()
	client, err := ca.Issue(pki.Request{Name: "kubelet-client", CommonName: "system:node:" + w.name,
		Organization: []string{"system:nodes"}, Client: true, Dir: dir})
	if err != nil {
		return err
	}
	if _, err := ca.Issue(pki.Request{Name: "kubelet-serving", CommonName: w.name, Server: true,
		IPs: []net.IP{net.ParseIP(w.IP())}, DNSNames: []string{w.name}, Dir: dir}); err != nil {
		return err
	}
	return w.n.writeKubeconfigAt(w.back.kubeconfig("kubelet"), "kubelet", ca.CertFile, client)
}

func (w *Worker) writeConfigs(ca *pki.CA) error {
	data := w.n.templateData(&credentials{ca: ca, kubeletServe: pki.Pair{
		CertFile: w.back.path("pki", "kubelet-serving.crt"), KeyFile: w.back.path("pki", "kubelet-serving.key")}})
	data.PodSubnet = w.PodSubnet()
	data.KubeletAddress, data.KubeletHealthzAddress = w.IP(), w.IP()
	data.CgroupRoot = "/" + w.cgroup()
	return w.n.renderConfigs(data, w.back.kubeletConfig(), w.HostPath)
}

// down stops the worker's programs and removes its namespaces, route and cgroups.
// Pods were deleted through the API server before.
func (w *Worker) down(ctx context.Context) []error {
	var errs []error
	if err := proc.Stop(ctx, w.back.pidFile("kubelet"), 15*time.Second); err != nil {
		errs = append(errs, fmt.Errorf("stop kubelet on %s: %w", w.name, err))
	}
	if pid, _ := proc.Find(w.back.pidFile("containerd")); pid != 0 {
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		out, err := exec.CommandContext(rctx, w.n.tool("crictl"), "--runtime-endpoint", "unix://"+w.ContainerdSocket(),
			"rmp", "--all", "--force").CombinedOutput()
		cancel()
		if err != nil {
			w.n.log.Warn("crictl rmp failed", "node", w.name, "err", err, "output", strings.TrimSpace(string(out)))
		}
	}
	if err := proc.Stop(ctx, w.back.pidFile("containerd"), 15*time.Second); err != nil {
		errs = append(errs, fmt.Errorf("stop containerd on %s: %w", w.name, err))
	}
	for _, pid := range hostclean.Processes("containerd-shim", w.n.layout.containerdSocket()) {
		proc.Kill(ctx, pid)
	}
	if err := hostclean.KillAndRemoveCgroups(w.cgroup()); err != nil {
		errs = append(errs, err)
	}
	_ = exec.CommandContext(ctx, "ip", "route", "del", w.PodSubnet()).Run()
	if _, err := os.Stat("/run/netns/" + w.NetNS()); err == nil {
		if out, err := exec.CommandContext(ctx, "ip", "netns", "del", w.NetNS()).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("delete netns %s: %w: %s", w.NetNS(), err, out))
		}
	}
	return errs
}

// run runs each step, stopping at the first that fails.
func run(ctx context.Context, what string, steps [][]string) error {
	for _, s := range steps {
		if out, err := exec.CommandContext(ctx, s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("set up the %s: %s: %w: %s", what, strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// makeNodesBridge creates the bridge the workers' veths join, holding the API server's
// address.
func (n *Node) makeNodesBridge(ctx context.Context) error {
	if _, err := os.Stat("/sys/class/net/" + nodesBridge); err == nil {
		return nil
	}
	return run(ctx, "nodes' bridge", [][]string{
		{"ip", "link", "add", nodesBridge, "type", "bridge"},
		{"ip", "addr", "add", nodesGateway + nodesMask, "dev", nodesBridge},
		{"ip", "link", "set", nodesBridge, "up"},
	})
}
