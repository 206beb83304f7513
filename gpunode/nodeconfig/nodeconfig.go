// Package nodeconfig holds the configuration both kubelet plugins share:
// the settings of the GPU node they serve, each declared, documented and
// checked once.
package nodeconfig

import (
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nvinject/nvinject/shared/contract"
)

// DefaultIgnoredXids are the Xids NVIDIA's device plugin treats as
// application errors (the GPU itself stays usable).
const DefaultIgnoredXids = "13,31,43,45,68,109"

// ParseXids reads a comma list of Xid numbers; "none" or "" is the empty list.
func ParseXids(v string) ([]uint64, error) {
	v = strings.TrimSpace(v)
	if v == "" || v == "none" {
		return nil, nil
	}
	var out []uint64
	for _, f := range strings.Split(v, ",") {
		x, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--ignored-xids=%q: %q is not an Xid number; give a comma list such as %s, or none", v, f, DefaultIgnoredXids)
		}
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out, nil
}

// HookBinaryUsage is --hook-binary's help, the same for both daemons: they
// write the node's one CDI spec.
const HookBinaryUsage = "host path of the CDI hook program (nvinject-cdi-hook, or NVIDIA's nvidia-cdi-hook) the spec's createContainer hooks run: library links, CUDA forward compatibility, ld.so.cache update; empty: no hooks"

// ValidateHookBinary checks --hook-binary is empty or absolute.
func ValidateHookBinary(p string) error {
	if p != "" && !filepath.IsAbs(p) {
		return fmt.Errorf("--hook-binary=%q is not an absolute path; give the hook program's path on the host, such as /var/lib/nvinject/bin/nvinject-cdi-hook", p)
	}
	return nil
}

// DefaultPodResourcesSocket is kubelet's PodResources socket.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// PodResourcesSocketFlag declares --pod-resources-socket, the same for both
// daemons: each reads there which GPUs the other path's pods hold.
func PodResourcesSocketFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "pod-resources-socket", DefaultPodResourcesSocket, "kubelet's PodResources socket, polled every second: a GPU that a pod got through the other path (device plugin or DRA) is not handed out until that pod ends, and while the socket cannot be read no GPU is (fail closed); empty disables, leaving GPUs the other path holds unprotected")
}

// ValidatePodResourcesSocket checks --pod-resources-socket is empty or absolute.
func ValidatePodResourcesSocket(p string) error {
	if p != "" && !filepath.IsAbs(p) {
		return fmt.Errorf("--pod-resources-socket=%s is not an absolute path; give kubelet's socket (%s), or empty to disable", contract.Quote(p), DefaultPodResourcesSocket)
	}
	return nil
}

// ValidateResourceName checks r is an extended resource name (--resource-name).
func ValidateResourceName(r string) error {
	domain, name, ok := strings.Cut(r, "/")
	if !ok || domain == "" || name == "" || strings.Contains(name, "/") || strings.HasPrefix(domain, "kubernetes.io") || !strings.Contains(domain, ".") {
		return fmt.Errorf("--resource-name=%q is not a valid extended resource; use <domain>/<name> such as nvidia.com/gpu", r)
	}
	return nil
}
