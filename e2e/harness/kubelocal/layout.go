package kubelocal

import "path/filepath"

// layout names every file and directory of one node under its run dir.
type layout struct{ dir string }

func (l layout) path(elem ...string) string {
	return filepath.Join(append([]string{l.dir}, elem...)...)
}

func (l layout) logs() string               { return l.path("logs") }
func (l layout) logFile(c string) string    { return l.path("logs", c+".log") }
func (l layout) pidFile(c string) string    { return l.path("pids", c+".pid") }
func (l layout) pki() string                { return l.path("pki") }
func (l layout) kubeconfig(c string) string { return l.path("kubeconfig", c+".kubeconfig") }

func (l layout) containerdConfig() string  { return l.path("containerd", "config.toml") }
func (l layout) containerdDropIns() string { return l.path("containerd", "conf.d") }

// ContainerdSocket is the node's CRI/containerd socket.
func (l layout) containerdSocket() string { return l.path("containerd", "containerd.sock") }
func (l layout) nriSocket() string        { return l.path("nri", "nri.sock") }
func (l layout) cdiDir() string           { return l.path("cdi") }
func (l layout) runcRoot() string         { return l.path("runc") }
func (l layout) cniConfDir() string       { return l.path("cni", "net.d") }
func (l layout) cniIPAMDir() string       { return l.path("cni", "ipam") }
func (l layout) etcdData() string         { return l.path("etcd") }
func (l layout) kubeletRoot() string      { return l.path("kubelet") }
func (l layout) kubeletConfig() string    { return l.path("kubelet-config.yaml") }
func (l layout) staticPods() string       { return l.path("manifests") }
func (l layout) images() string           { return l.path("images") }

// hostDevices lists the device nodes the node created in the host's /dev.
func (l layout) hostDevices() string { return l.path("host-devices") }
