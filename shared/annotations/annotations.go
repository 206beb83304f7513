// Package annotations holds nvinject's own container annotation: the CDI
// devices the device plugin allocated, read only by nvinject's NRI plugin.
// It is deliberately not a cdi.k8s.io/ key, so containerd's built-in CDI
// support does not act on it.
package annotations

import (
	"fmt"
	"strings"
)

// CDIDevices is the container annotation key whose value lists fully
// qualified CDI device names ("nvidia.com/gpu=GPU-..."), comma-separated.
const CDIDevices = "nvinject.io/cdi-devices"

// Format renders names as the CDIDevices value. It refuses an empty list
// and any name that is not a fully qualified CDI device name.
func Format(names []string) (string, error) {
	if len(names) == 0 {
		return "", fmt.Errorf("annotation %s needs at least one CDI device name", CDIDevices)
	}
	for _, n := range names {
		if err := ValidateQualifiedName(n); err != nil {
			return "", fmt.Errorf("annotation %s: %w", CDIDevices, err)
		}
	}
	return strings.Join(names, ","), nil
}

// Parse reads a CDIDevices value back into CDI device names. Blanks around
// names are tolerated; empty entries, duplicates and names that are not
// fully qualified are errors, since the value may come from any pod.
func Parse(value string) ([]string, error) {
	if strings.TrimSpace(value) == "" {
		return nil, fmt.Errorf("annotation %s is empty; it must list CDI device names like nvidia.com/gpu=GPU-<uuid>", CDIDevices)
	}
	parts := strings.Split(value, ",")
	out := make([]string, 0, len(parts))
	seen := make(map[string]bool, len(parts))
	for _, p := range parts {
		n := strings.TrimSpace(p)
		if err := ValidateQualifiedName(n); err != nil {
			return nil, fmt.Errorf("annotation %s=%q: %w", CDIDevices, value, err)
		}
		if seen[n] {
			return nil, fmt.Errorf("annotation %s=%q names %s twice", CDIDevices, value, n)
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
