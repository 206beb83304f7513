// Package annotations holds the container annotation nvinject's device
// plugin sets for the "nri" strategy and the NRI plugin reads: the qualified
// CDI device names allocated to one container. It is deliberately not a
// cdi.k8s.io/ key, so containerd's built-in CDI support does not act on it.
package annotations

import (
	"fmt"
	"strings"
)

// DevicesKey is the container annotation carrying comma-separated qualified
// CDI device names (vendor/class=name). containerd does not resolve it; only
// nvinject's NRI plugin does.
const DevicesKey = "nvinject.io/cdi-devices"

// Format renders names as the annotation's value. Callers pass names they
// built with the CDI library or checked with ValidateQualifiedName.
func Format(names []string) string {
	return strings.Join(names, ",")
}

// Parse splits an annotation value into qualified CDI device names. Blanks
// around names are ignored; an empty value, an empty entry, a duplicate or a
// name that is not vendor/class=name is an error, so a corrupted annotation
// (any pod can set one) refuses the container instead of silently giving it
// other devices.
func Parse(value string) ([]string, error) {
	if strings.TrimSpace(value) == "" {
		return nil, fmt.Errorf("annotation %s is empty; it must list CDI device names like nvidia.com/gpu=GPU-<uuid>", DevicesKey)
	}
	parts := strings.Split(value, ",")
	out := make([]string, 0, len(parts))
	seen := make(map[string]bool, len(parts))
	for _, p := range parts {
		n := strings.TrimSpace(p)
		if err := ValidateQualifiedName(n); err != nil {
			return nil, fmt.Errorf("annotation %s=%q: %w", DevicesKey, value, err)
		}
		if seen[n] {
			return nil, fmt.Errorf("annotation %s=%q names %s twice", DevicesKey, value, n)
		}
		seen[n] = true
		out = append(out, n)
	}
	return out, nil
}

// ValidateQualifiedName checks vendor/class=name with the character rules
// of the CDI specification (the same rules as tags.cncf.io/container-device-interface's parser).
func ValidateQualifiedName(s string) error {
	kind, name, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("%q is not a qualified CDI device name: want vendor/class=name", s)
	}
	vendor, class, ok := strings.Cut(kind, "/")
	if !ok {
		return fmt.Errorf("%q is not a qualified CDI device name: want vendor/class=name", s)
	}
	if !validWord(vendor, isLetter, "_-.") {
		return fmt.Errorf("CDI device %q: vendor %q must start with a letter, end with a letter or digit and use only letters, digits, '_', '-' and '.'", s, vendor)
	}
	if !validWord(class, isLetter, "_-.") {
		return fmt.Errorf("CDI device %q: class %q must start with a letter, end with a letter or digit and use only letters, digits, '_', '-' and '.'", s, class)
	}
	if !validWord(name, isAlnum, "_-.:") {
		return fmt.Errorf("CDI device %q: name %q must start and end with a letter or digit and use only letters, digits, '_', '-', '.' and ':'", s, name)
	}
	return nil
}

func validWord(w string, first func(byte) bool, inner string) bool {
	if w == "" || !first(w[0]) || !isAlnum(w[len(w)-1]) {
		return false
	}
	for i := 1; i < len(w)-1; i++ {
		if !isAlnum(w[i]) && !strings.ContainsRune(inner, rune(w[i])) {
			return false
		}
	}
	return true
}

func isLetter(c byte) bool { return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') }
func isAlnum(c byte) bool  { return isLetter(c) || ('0' <= c && c <= '9') }
