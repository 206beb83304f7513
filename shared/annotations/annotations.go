// Package annotations holds the container annotation nvinject's device
// plugin sets for the "nri" strategy and the NRI plugin reads: the qualified
// CDI device names allocated to one container.
package annotations

import (
	"fmt"
	"strings"
)

// DevicesKey is the container annotation carrying comma-separated qualified
// CDI device names (vendor/class=name). containerd does not resolve it; only
// nvinject's NRI plugin does.
const DevicesKey = "nvinject.io/cdi-devices"

// Format renders names as the annotation's value.
func Format(names []string) string {
	return strings.Join(names, ",")
}

// Parse splits an annotation value into qualified CDI device names. Blanks
// around names are ignored; an empty value or a name that is not
// vendor/class=name is an error, so a corrupted annotation refuses the
// container instead of silently giving it fewer devices.
func Parse(value string) ([]string, error) {
	if strings.TrimSpace(value) == "" {
		return nil, fmt.Errorf("annotation %s is empty; it must list qualified CDI device names such as nvidia.com/gpu=GPU-<uuid>", DevicesKey)
	}
	parts := strings.Split(value, ",")
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		name := strings.TrimSpace(p)
		if !qualified(name) {
			return nil, fmt.Errorf("annotation %s=%q: device %q is not a qualified CDI name; use vendor/class=name", DevicesKey, value, name)
		}
		out = append(out, name)
	}
	return out, nil
}

// qualified checks the vendor/class=name shape without CDI's full grammar,
// which the resolver applies later with a precise error.
func qualified(name string) bool {
	kind, dev, ok := strings.Cut(name, "=")
	if !ok || dev == "" || strings.ContainsAny(dev, "=, \t") {
		return false
	}
	vendor, class, ok := strings.Cut(kind, "/")
	return ok && vendor != "" && class != "" && !strings.ContainsAny(class, "/ \t")
}
