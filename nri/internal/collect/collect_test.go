package collect

import (
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/shared/contract"
)

func TestContainer(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		cri     []string
		ann     map[string]string
		want    []string
		wantErr string
	}{
		{name: "none", ann: map[string]string{"io.kubernetes.container.hash": "1"}},
		{name: "all sources, deduplicated in order",
			cri: []string{"nvidia.com/gpu=GPU-a"},
			ann: map[string]string{
				"cdi.k8s.io/nvinject.gpu_2": "nvidia.com/gpu=GPU-b,nvidia.com/gpu=GPU-a",
				"cdi.k8s.io/nvinject.gpu_1": "example.com/nic=n0",
				"nvinject.io/cdi-devices":   "nvidia.com/gpu=GPU-c",
			},
			want: []string{"nvidia.com/gpu=GPU-a", "example.com/nic=n0", "nvidia.com/gpu=GPU-b", "nvidia.com/gpu=GPU-c"}},
		{name: "empty entry in CDI annotation", ann: map[string]string{"cdi.k8s.io/nvinject.gpu_x": "nvidia.com/gpu=GPU-a,,"}, wantErr: "cdi.k8s.io/nvinject.gpu_x"},
		{name: "unqualified name in CDI annotation", ann: map[string]string{"cdi.k8s.io/nvinject.gpu_x": "GPU-a"}, wantErr: `"GPU-a"`},
		{name: "unqualified CRI name", cri: []string{"gpu0"}, wantErr: `"gpu0"`},
		{name: "bad nvinject annotation", ann: map[string]string{"nvinject.io/cdi-devices": ""}, wantErr: "nvinject.io/cdi-devices"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctr := &api.Container{Name: "main", Annotations: tc.ann}
			for _, n := range tc.cri {
				ctr.CDIDevices = append(ctr.CDIDevices, &api.CDIDevice{Name: n})
			}
			got, err := c.Container(ctr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestAnnotationPrefix(t *testing.T) {
	ann := map[string]string{"cdi.k8s.io/nvinject.gpu_1": "nvidia.com/gpu=GPU-a", "cdi.k8s.io/other_1": "nvidia.com/gpu=GPU-b"}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"nvinject.gpu", []string{"nvidia.com/gpu=GPU-a"}},
		{"other", []string{"nvidia.com/gpu=GPU-b"}},
		{"", []string{"nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"}},
	} {
		c, err := New(WithAnnotationPrefix(tc.prefix))
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.Container(&api.Container{Annotations: ann})
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("prefix %q: got %v, %v; want %v", tc.prefix, got, err, tc.want)
		}
		if all := c.AnyCDI(&api.Container{Annotations: ann}); len(all) != 2 {
			t.Errorf("prefix %q: AnyCDI = %v, want both", tc.prefix, all)
		}
	}
	if _, err := New(WithAnnotationPrefix("a/b")); err == nil {
		t.Fatal("a prefix with '/' was accepted")
	}
}

// TestBoundedErrors: a 1 MiB annotation value (any pod can set one) gives
// an error of bounded length that still names the annotation.
func TestBoundedErrors(t *testing.T) {
	c, _ := New()
	huge := strings.Repeat("x", 1<<20)
	for key, val := range map[string]string{
		"cdi.k8s.io/nvinject.gpu_0": huge,
		"nvinject.io/cdi-devices":   huge,
	} {
		_, err := c.Container(&api.Container{Name: "main", Annotations: map[string]string{key: val}})
		if err == nil {
			t.Errorf("%s: 1 MiB value accepted", key)
			continue
		}
		if n := len(err.Error()); n > contract.MaxError+64 {
			t.Errorf("%s: error is %d bytes", key, n)
		}
		if !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "more bytes") {
			t.Errorf("%s: error %.300q does not name the key and count the cut", key, err)
		}
	}
}

func TestPod(t *testing.T) {
	c, _ := New()
	got := c.Pod(&api.PodSandbox{Annotations: map[string]string{
		"cdi.k8s.io/x": "nvidia.com/gpu=GPU-a, junk", "nvinject.io/cdi-devices": "nvidia.com/gpu=GPU-b", "app": "nvidia.com/gpu=GPU-c",
	}})
	if !slices.Equal(got, []string{"nvidia.com/gpu=GPU-a", "junk", "nvidia.com/gpu=GPU-b"}) {
		t.Fatalf("got %v", got)
	}
}

// FuzzContainer: whatever the annotations hold, collection either fails or
// returns distinct qualified names that each appear in the input.
func FuzzContainer(f *testing.F) {
	f.Add("cdi.k8s.io/nvinject.gpu_0", "nvidia.com/gpu=GPU-1,nvidia.com/gpu=GPU-2", "nvidia.com/gpu=GPU-3", "nvidia.com/gpu=GPU-1")
	f.Add("cdi.k8s.io/", ",", "", "")
	f.Add("x", "a/b=c", "a/b=c, a/b=c", "=")
	c, _ := New()
	f.Fuzz(func(t *testing.T, key, val, own, cri string) {
		ctr := &api.Container{Annotations: map[string]string{key: val, "nvinject.io/cdi-devices": own}, CDIDevices: []*api.CDIDevice{{Name: cri}}}
		got, err := c.Container(ctr)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, n := range got {
			if seen[n] {
				t.Fatalf("duplicate %q in %v", n, got)
			}
			seen[n] = true
			if !strings.Contains(val+","+own+","+cri, n) {
				t.Fatalf("%q came from nowhere", n)
			}
			if kind, _, ok := strings.Cut(n, "="); !ok || !strings.Contains(kind, "/") {
				t.Fatalf("%q is not qualified", n)
			}
		}
	})
}
