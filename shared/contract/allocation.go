package contract

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

// Strategy is one way the device plugin hands CDI names to the runtime
// (NVIDIA's device plugin's DEVICE_LIST_STRATEGY values).
type Strategy string

// Device list strategies.
const (
	// StrategyAnnotations sets cdi.k8s.io/<prefix>_<id> container annotations,
	// which containerd's own CDI resolves.
	StrategyAnnotations Strategy = "cdi-annotations"
	// StrategyCRI fills the CRI CDIDevices field (containerd resolves it too).
	StrategyCRI Strategy = "cdi-cri"
	// StrategyNRI sets DevicesAnnotation, which only nvinject-nri resolves.
	StrategyNRI Strategy = "nri"
)

// DefaultStrategies are NVIDIA's device plugin's DEVICE_LIST_STRATEGY.
func DefaultStrategies() []Strategy { return []Strategy{StrategyAnnotations, StrategyCRI} }

// AllStrategies lists every strategy, for tests and help text.
func AllStrategies() []Strategy { return []Strategy{StrategyAnnotations, StrategyCRI, StrategyNRI} }

// ParseStrategies reads a comma-separated DEVICE_LIST_STRATEGY value.
func ParseStrategies(v string) ([]Strategy, error) {
	var out []Strategy
	for _, f := range strings.Split(v, ",") {
		s := Strategy(strings.TrimSpace(f))
		switch s {
		case StrategyAnnotations, StrategyCRI, StrategyNRI:
		case "envvar", "volume-mounts":
			return nil, fmt.Errorf("DEVICE_LIST_STRATEGY=%q: %q is not supported; nvinject hands out CDI names only: use cdi-annotations, cdi-cri and/or nri", v, s)
		default:
			return nil, fmt.Errorf("DEVICE_LIST_STRATEGY=%q: %q is not a strategy; use cdi-annotations, cdi-cri and/or nri, comma-separated", v, s)
		}
		if slices.Contains(out, s) {
			return nil, fmt.Errorf("DEVICE_LIST_STRATEGY=%q names %q twice", v, s)
		}
		out = append(out, s)
	}
	return out, nil
}

// Allocation is what one container is handed: container annotations and CRI
// CDIDevices names. Kubelet copies both into the CRI request unchanged.
type Allocation struct {
	Annotations map[string]string
	CDIDevices  []string
}

// Encoder writes allocations in a set of strategies.
type Encoder struct {
	strategies []Strategy
	prefix     string
}

// NewEncoder returns an Encoder for strategies; prefix is the plugin name in
// cdi.k8s.io/<prefix>_<id> keys.
func NewEncoder(prefix string, strategies ...Strategy) (*Encoder, error) {
	if len(strategies) == 0 {
		return nil, errors.New("no device list strategy configured; set DEVICE_LIST_STRATEGY to cdi-annotations, cdi-cri and/or nri")
	}
	e := &Encoder{strategies: slices.Clone(strategies), prefix: prefix}
	if e.has(StrategyAnnotations) {
		if _, err := cdi.AnnotationKey(prefix, "0"); err != nil {
			return nil, fmt.Errorf("--cdi-annotation-prefix=%q cannot form CDI annotation keys (%w); use letters, digits, '.', '-' and '_'", prefix, err)
		}
	}
	return e, nil
}

func (e *Encoder) has(s Strategy) bool { return slices.Contains(e.strategies, s) }

// Check verifies that an annotation key can be made for every device ID, so
// Encode cannot fail on it later.
func (e *Encoder) Check(ids []string) error {
	if !e.has(StrategyAnnotations) {
		return nil
	}
	for _, id := range ids {
		if _, err := cdi.AnnotationKey(e.prefix, keyName(id)); err != nil {
			return fmt.Errorf("--cdi-annotation-prefix=%q cannot form a CDI annotation key for device %q (%w); use a shorter prefix of letters, digits, '.', '-' and '_'", e.prefix, id, err)
		}
	}
	return nil
}

// Encode returns one container's allocation for its device IDs (in request
// order) and their qualified CDI names, each once: replicas of one shared
// GPU are one name.
func (e *Encoder) Encode(ids, names []string) (Allocation, error) {
	if len(ids) == 0 || len(names) == 0 || len(names) > len(ids) {
		return Allocation{}, fmt.Errorf("allocate: %d device IDs for %d CDI names", len(ids), len(names))
	}
	var a Allocation
	if e.has(StrategyAnnotations) {
		ann, err := cdi.UpdateAnnotations(nil, e.prefix, keyName(ids[0]), names)
		if err != nil {
			return Allocation{}, fmt.Errorf("allocate %v: %w", ids, err)
		}
		a.Annotations = ann
	}
	if e.has(StrategyNRI) {
		v, err := cdi.AnnotationValue(names)
		if err != nil {
			return Allocation{}, fmt.Errorf("allocate %v: %w", ids, err)
		}
		if a.Annotations == nil {
			a.Annotations = map[string]string{}
		}
		a.Annotations[DevicesAnnotation] = v
	}
	if e.has(StrategyCRI) {
		a.CDIDevices = slices.Clone(names)
	}
	return a, nil
}

// keyName is a device ID as an annotation key's name part, which allows no
// ':': MIG index IDs ("1:0") and replica IDs ("GPU-…::2") use it. The key
// only has to be unique among one container's annotations; the decoder
// reads values.
func keyName(id string) string { return strings.ReplaceAll(id, ":", ".") }

// Decoder reads the CDI names of one container's allocation.
type Decoder struct {
	// key is cdi.k8s.io/<prefix>_, or cdi.k8s.io/ to take every plugin's.
	key string
}

// NewDecoder returns a Decoder taking the cdi.k8s.io/ annotations of the
// plugin named prefix; "" takes every cdi.k8s.io/ annotation.
func NewDecoder(prefix string) (*Decoder, error) {
	if strings.Contains(prefix, "/") {
		return nil, fmt.Errorf("--cdi-annotation-prefix=%q must not contain '/': it is the device plugin's name in %s<prefix>_<device-id> keys", prefix, cdi.AnnotationPrefix)
	}
	d := &Decoder{key: cdi.AnnotationPrefix}
	if prefix != "" {
		d.key += prefix + "_"
	}
	return d, nil
}

// Decode returns the qualified CDI names of an allocation, in order of first
// appearance: CRI CDIDevices, the plugin's cdi.k8s.io/ annotations (sorted
// by key, so the order is stable), then DevicesAnnotation. Any malformed
// value is an error: any pod can set annotations, and a corrupted one must
// refuse the container rather than give it other devices.
func (d *Decoder) Decode(a Allocation) ([]string, error) {
	names, err := d.decode(a)
	return names, Bound(err)
}

func (d *Decoder) decode(a Allocation) ([]string, error) {
	names := slices.Clone(a.CDIDevices)
	for _, n := range names {
		if _, _, _, err := parser.ParseQualifiedName(n); err != nil {
			return nil, fmt.Errorf("CRI CDI device %s: %w", Quote(n), err)
		}
	}
	for _, k := range SortedKeys(a.Annotations) {
		v := a.Annotations[k]
		switch {
		case k == DevicesAnnotation:
			got, err := ParseDevices(v)
			if err != nil {
				return nil, err
			}
			names = append(names, got...)
		case strings.HasPrefix(k, d.key):
			_, got, err := cdi.ParseAnnotations(map[string]string{k: v})
			if err != nil {
				return nil, fmt.Errorf("annotation %s=%s: %w", k, Quote(v), err)
			}
			names = append(names, got...)
		}
	}
	return Dedup(names), nil
}

// ParseDevices reads a DevicesAnnotation value: comma-separated qualified CDI
// names, no empty entry and no duplicate.
func ParseDevices(value string) ([]string, error) {
	names, err := parseDevices(value)
	return names, Bound(err)
}

func parseDevices(value string) ([]string, error) {
	if strings.TrimSpace(value) == "" {
		return nil, fmt.Errorf("annotation %s is empty; it must list CDI device names like %s=GPU-<uuid>", DevicesAnnotation, CDIKind(CDIVendor, CDIClass))
	}
	parts := strings.Split(value, ",")
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		n := strings.TrimSpace(p)
		if _, _, _, err := parser.ParseQualifiedName(n); err != nil {
			return nil, fmt.Errorf("annotation %s=%s: CDI device %s: %w", DevicesAnnotation, Quote(value), Quote(n), err)
		}
		if slices.Contains(out, n) {
			return nil, fmt.Errorf("annotation %s=%s names %s twice", DevicesAnnotation, Quote(value), n)
		}
		out = append(out, n)
	}
	return out, nil
}

// IsKind reports whether name is a qualified CDI name of vendor/class.
func IsKind(name, vendor, class string) bool {
	v, c, _, err := parser.ParseQualifiedName(name)
	return err == nil && v == vendor && c == class
}

// SortedKeys returns m's keys in order.
func SortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Dedup drops repeated names, keeping the first.
func Dedup(names []string) []string {
	out := names[:0:0]
	for _, n := range names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
