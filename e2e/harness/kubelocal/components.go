package kubelocal

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// component is one program of the node, how to start it and how to tell it is ready.
type component struct {
	name string
	// tool is the program's name in the tools bin dir.
	tool string
	args []string
	// hosts, when set, runs the program in a private mount namespace whose /etc/hosts
	// is this file (see apiServer).
	hosts string
	probe func(ctx context.Context) error
}

func (n *Node) tool(name string) string { return n.bin + "/" + name }

func (n *Node) apiServerURL() string {
	return "https://" + n.apiHost + ":" + strconv.Itoa(n.ports.APIServer)
}

// components lists the node's programs in start order; teardown runs it backwards.
func (n *Node) components() []component {
	all := n.allComponents()
	if !n.controlPlaneOnly {
		return all
	}
	var cp []component
	for _, c := range all {
		if c.name != "containerd" && c.name != "kubelet" {
			cp = append(cp, c)
		}
	}
	return cp
}

func (n *Node) allComponents() []component {
	all := n.baseComponents()
	for i := range all {
		all[i].args = append(all[i].args, n.extraArgs[all[i].name]...)
	}
	return all
}

func (n *Node) baseComponents() []component {
	l, p := n.layout, n.ports
	pki := func(f string) string { return l.path("pki", f) }
	loop := func(port int) string { return "http://127.0.0.1:" + strconv.Itoa(port) }
	return []component{
		{
			name: "containerd", tool: "containerd",
			args:  []string{"--config", l.containerdConfig()},
			probe: n.probeContainerd,
		},
		{
			name: "etcd", tool: "etcd",
			args: []string{
				"--name=nvinject", "--data-dir=" + l.etcdData(),
				"--listen-client-urls=" + loop(p.EtcdClient), "--advertise-client-urls=" + loop(p.EtcdClient),
				"--listen-peer-urls=" + loop(p.EtcdPeer), "--initial-advertise-peer-urls=" + loop(p.EtcdPeer),
				"--initial-cluster=nvinject=" + loop(p.EtcdPeer),
			},
			probe: func(ctx context.Context) error { return probeHTTP(ctx, loop(p.EtcdClient)+"/health") },
		},
		n.apiServer(pki),
		{
			name: "kube-controller-manager", tool: "kube-controller-manager",
			args: []string{
				"--kubeconfig=" + l.kubeconfig("controller-manager"),
				"--authentication-kubeconfig=" + l.kubeconfig("controller-manager"),
				"--authorization-kubeconfig=" + l.kubeconfig("controller-manager"),
				"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(p.ControllerManager),
				"--cert-dir=" + l.path("controller-manager"), "--leader-elect=false",
				"--use-service-account-credentials=true",
				"--service-account-private-key-file=" + pki("service-account.key"),
				"--root-ca-file=" + pki("ca.crt"),
				"--cluster-signing-cert-file=" + pki("ca.crt"), "--cluster-signing-key-file=" + pki("ca.key"),
			},
			probe: func(ctx context.Context) error {
				return probeHTTP(ctx, fmt.Sprintf("https://127.0.0.1:%d/healthz", p.ControllerManager))
			},
		},
		{
			name: "kube-scheduler", tool: "kube-scheduler",
			args: []string{
				"--kubeconfig=" + l.kubeconfig("scheduler"),
				"--authentication-kubeconfig=" + l.kubeconfig("scheduler"),
				"--authorization-kubeconfig=" + l.kubeconfig("scheduler"),
				"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(p.Scheduler),
				"--cert-dir=" + l.path("scheduler"), "--leader-elect=false",
			},
			probe: func(ctx context.Context) error {
				return probeHTTP(ctx, fmt.Sprintf("https://127.0.0.1:%d/healthz", p.Scheduler))
			},
		},
		{
			name: "kubelet", tool: "kubelet",
			args: []string{
				"--config=" + l.kubeletConfig(), "--kubeconfig=" + l.kubeconfig("kubelet"),
				"--root-dir=" + l.kubeletRoot(), "--cert-dir=" + l.path("kubelet-pki"),
				"--hostname-override=" + n.name, "--v=2",
			},
			probe: func(ctx context.Context) error {
				return probeHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", p.KubeletHealthz))
			},
		},
	}
}

// apiServer reaches kubelet by node name (kubelet rejects a loopback node IP, and the
// Hostname address is all that is left). The name resolves to 127.0.0.1 through a
// hosts file bind-mounted in the API server's own mount namespace, so the host's
// /etc/hosts is never edited.
func (n *Node) apiServer(pki func(string) string) component {
	l, p := n.layout, n.ports
	return component{
		name: "kube-apiserver", tool: "kube-apiserver", hosts: l.path("apiserver-hosts"),
		args: []string{
			"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(p.EtcdClient),
			"--bind-address=" + n.apiHost, "--advertise-address=" + n.apiHost, "--secure-port=" + strconv.Itoa(p.APIServer),
			"--endpoint-reconciler-type=none",
			"--tls-cert-file=" + pki("apiserver.crt"), "--tls-private-key-file=" + pki("apiserver.key"),
			"--client-ca-file=" + pki("ca.crt"),
			"--service-account-key-file=" + pki("service-account.pub"),
			"--service-account-signing-key-file=" + pki("service-account.key"),
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-cluster-ip-range=10.96.0.0/16",
			"--authorization-mode=Node,RBAC", "--allow-privileged=true",
			"--kubelet-client-certificate=" + pki("apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + pki("apiserver-kubelet-client.key"),
			"--kubelet-certificate-authority=" + pki("ca.crt"),
			"--kubelet-preferred-address-types=Hostname",
		},
		probe: func(ctx context.Context) error {
			c, err := n.apiClient()
			if err != nil {
				return err
			}
			return c.do(ctx, "GET", "/readyz", nil)
		},
	}
}

// command returns the program and arguments to run c with.
func (n *Node) command(c component) (string, []string, error) {
	bin := n.tool(c.tool)
	if c.hosts == "" {
		return bin, c.args, nil
	}
	hosts := fmt.Sprintf("127.0.0.1 localhost\n127.0.0.1 %s\n::1 localhost\n", n.name)
	for _, w := range n.Workers() {
		hosts += w.IP() + " " + w.Name() + "\n"
	}
	if err := os.WriteFile(c.hosts, []byte(hosts), 0o644); err != nil {
		return "", nil, fmt.Errorf("write %s hosts file: %w", c.name, err)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return "", nil, fmt.Errorf("%s needs unshare (util-linux): %w", c.name, err)
	}
	// unshare and sh both exec, so the recorded pid ends up running the component itself.
	script := `mount --bind "$0" /etc/hosts && exec "$@"`
	args := append([]string{"--mount", "--propagation", "private", "sh", "-c", script, c.hosts, bin}, c.args...)
	return unshare, args, nil
}

func (n *Node) probeContainerd(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, n.tool("ctr"), "--address", n.layout.containerdSocket(), "version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr version: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
