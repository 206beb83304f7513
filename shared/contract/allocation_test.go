package contract

import (
	"slices"
	"strings"
	"testing"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	names := []string{"nvidia.com/gpu=GPU-aaaa", "nvidia.com/gpu=GPU-bbbb"}
	for _, strategies := range [][]Strategy{
		{StrategyAnnotations}, {StrategyCRI}, {StrategyNRI},
		DefaultStrategies(), AllStrategies(),
	} {
		// MIG index IDs and replica IDs hold the ":" an annotation key cannot.
		for _, ids := range [][]string{{"GPU-aaaa", "GPU-bbbb"}, {"0", "1"}, {"1:0", "1:1"}, {"GPU-aaaa::0", "GPU-bbbb::3"}} {
			enc, err := NewEncoder(AnnotationPrefix, strategies...)
			if err != nil {
				t.Fatal(err)
			}
			a, err := enc.Encode(ids, names)
			if err != nil {
				t.Fatalf("%v %v: %v", strategies, ids, err)
			}
			dec, err := NewDecoder(AnnotationPrefix)
			if err != nil {
				t.Fatal(err)
			}
			got, err := dec.Decode(a)
			if err != nil {
				t.Fatalf("%v %v: decode %+v: %v", strategies, ids, a, err)
			}
			if !slices.Equal(got, names) {
				t.Errorf("%v %v: decoded %v, want %v", strategies, ids, got, names)
			}
		}
	}
}

func TestDecoderPrefix(t *testing.T) {
	a := Allocation{Annotations: map[string]string{
		"cdi.k8s.io/other_0":        "example.com/x=y",
		"cdi.k8s.io/nvinject.gpu_0": "nvidia.com/gpu=GPU-a",
	}}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{AnnotationPrefix, []string{"nvidia.com/gpu=GPU-a"}},
		{"", []string{"nvidia.com/gpu=GPU-a", "example.com/x=y"}},
	} {
		d, err := NewDecoder(tc.prefix)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.Decode(a)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("prefix %q: got %v, want %v", tc.prefix, got, tc.want)
		}
	}
	if _, err := NewDecoder("a/b"); err == nil {
		t.Error("a prefix with '/' was accepted")
	}
}

func TestDecodeRefusesMalformed(t *testing.T) {
	d, _ := NewDecoder(AnnotationPrefix)
	for name, a := range map[string]Allocation{
		"bad CRI name":         {CDIDevices: []string{"gpu0"}},
		"bad cdi annotation":   {Annotations: map[string]string{"cdi.k8s.io/nvinject.gpu_0": "nvidia.com/gpu=a,"}},
		"empty nri":            {Annotations: map[string]string{DevicesAnnotation: " "}},
		"duplicate nri":        {Annotations: map[string]string{DevicesAnnotation: "nvidia.com/gpu=a,nvidia.com/gpu=a"}},
		"unqualified nri":      {Annotations: map[string]string{DevicesAnnotation: "GPU-a"}},
		"huge unqualified nri": {Annotations: map[string]string{DevicesAnnotation: strings.Repeat("x", 1<<20)}},
	} {
		_, err := d.Decode(a)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if len(err.Error()) > MaxError+40 {
			t.Errorf("%s: error is %d bytes; it must be bounded", name, len(err.Error()))
		}
	}
}

func TestEncoderChecks(t *testing.T) {
	if _, err := NewEncoder(AnnotationPrefix); err == nil {
		t.Error("no strategy was accepted")
	}
	if _, err := NewEncoder("bad prefix!", StrategyAnnotations); err == nil {
		t.Error("an invalid prefix was accepted")
	}
	enc, _ := NewEncoder(strings.Repeat("p", 50), StrategyAnnotations)
	if err := enc.Check([]string{"GPU-" + strings.Repeat("a", 36)}); err == nil {
		t.Error("a key over 63 characters passed Check")
	}
	if _, err := enc.Encode([]string{"0"}, nil); err == nil {
		t.Error("ids without names were encoded")
	}
}

func TestParseStrategies(t *testing.T) {
	for v, ok := range map[string]bool{
		"cdi-annotations,cdi-cri": true, "nri": true, " nri , cdi-cri ": true,
		"envvar": false, "nri,nri": false, "": false, "bogus": false,
	} {
		_, err := ParseStrategies(v)
		if (err == nil) != ok {
			t.Errorf("ParseStrategies(%q) error %v, want ok=%v", v, err, ok)
		}
	}
}

func TestListAndQuoteAreBounded(t *testing.T) {
	many := make([]string, 1000)
	for i := range many {
		many[i] = strings.Repeat("n", 1000)
	}
	if got := List(many); len(got) > MaxListed*(MaxQuoted+30)+40 || !strings.Contains(got, "and 996 more") {
		t.Errorf("List gave %d bytes: %.300s", len(got), got)
	}
	if got := Quote(strings.Repeat("q", 1<<20)); len(got) > MaxQuoted+40 {
		t.Errorf("Quote gave %d bytes", len(got))
	}
	if got := List([]string{"a", "b"}); got != "[a b]" {
		t.Errorf("List = %q", got)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add("nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b", "nvidia.com/gpu=GPU-a")
	f.Add(",", "")
	f.Fuzz(func(t *testing.T, nri, ann string) {
		d, _ := NewDecoder(AnnotationPrefix)
		got, err := d.Decode(Allocation{Annotations: map[string]string{DevicesAnnotation: nri, "cdi.k8s.io/nvinject.gpu_0": ann}})
		if err != nil {
			if len(err.Error()) > MaxError+40 {
				t.Fatalf("unbounded error: %d bytes", len(err.Error()))
			}
			return
		}
		for _, n := range got {
			if !strings.Contains(n, "=") || !strings.Contains(n, "/") {
				t.Fatalf("decoded unqualified name %q", n)
			}
		}
	})
}

func TestMIGResourceName(t *testing.T) {
	for _, tc := range []struct{ gpu, profile, want string }{
		{"nvidia.com/gpu", "1g.10gb", "nvidia.com/mig-1g.10gb"},
		{"example.com/accel", "3g.40gb", "example.com/mig-3g.40gb"},
		{"nvidia.com/gpu", "1g.10gb+me", "nvidia.com/mig-1g.10gb.me"},
	} {
		if got := MIGResourceName(tc.gpu, tc.profile); got != tc.want {
			t.Errorf("MIGResourceName(%s, %s) = %s, want %s", tc.gpu, tc.profile, got, tc.want)
		}
	}
}
