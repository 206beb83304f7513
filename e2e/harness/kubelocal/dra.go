package kubelocal

// KubeletRootDir is kubelet's --root-dir; DRA drivers register in its
// plugins_registry and serve from its plugins directory.
func (n *Node) KubeletRootDir() string { return n.layout.kubeletRoot() }
