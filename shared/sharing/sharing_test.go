package sharing

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		wantErr  string
		resource string
		want     Replicated
		shared   bool
	}{
		{name: "empty shares nothing", in: "", resource: "nvidia.com/gpu"},
		{name: "replicas", in: "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
			resource: "nvidia.com/gpu", want: Replicated{Name: "nvidia.com/gpu", Replicas: 4, Strategy: TimeSliced}, shared: true},
		{name: "rename by default", in: "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    failRequestsGreaterThanOne: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
			resource: "nvidia.com/gpu", want: Replicated{Name: "nvidia.com/gpu.shared", Replicas: 2, Strategy: TimeSliced, FailRequestsGreaterThanOne: true}, shared: true},
		{name: "own rename wins", in: "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/mig-1g.10gb\n      rename: example.com/small\n      replicas: 3\n",
			resource: "nvidia.com/mig-1g.10gb", want: Replicated{Name: "example.com/small", Replicas: 3, Strategy: TimeSliced}, shared: true},
		{name: "another resource is not shared", in: "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n", resource: "nvidia.com/mig-1g.10gb"},
		{name: "wrong version", in: "version: v2\n", wantErr: "write version: v1"},
		{name: "mps", in: "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
			resource: "nvidia.com/gpu", want: Replicated{Name: "nvidia.com/gpu", Replicas: 4, Strategy: MPSShared, FailRequestsGreaterThanOne: true}, shared: true},
		{name: "mps renamed by default", in: "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/mig-3g.40gb\n      replicas: 2\n",
			resource: "nvidia.com/mig-3g.40gb", want: Replicated{Name: "nvidia.com/mig-3g.40gb.shared", Replicas: 2, Strategy: MPSShared, FailRequestsGreaterThanOne: true}, shared: true},
		{name: "mps over its client bound", in: "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 50\n", wantErr: "not between 2 and 48"},
		{name: "one resource two ways", in: "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n", wantErr: "already listed at sharing.timeSlicing.resources[0]"},
		{name: "unknown field", in: "version: v1\nsharing:\n  mps:\n    limits: {}\n", wantErr: "unknown field"},
		{name: "one replica", in: "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n", wantErr: "1 shares nothing"},
		{name: "too many", in: "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1000\n", wantErr: "not between 2 and 64"},
		{name: "twice", in: "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n    - {name: nvidia.com/gpu, replicas: 3}\n", wantErr: "already listed"},
		{name: "bad rename", in: "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2, rename: shared}\n", wantErr: "not a resource name"},
		{name: "no name", in: "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {replicas: 2}\n", wantErr: "name is empty"},
		{name: "too big", in: "version: v1\n#" + strings.Repeat("x", MaxConfigBytes), wantErr: "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, ok := c.For(tc.resource)
			if ok != tc.shared || got != tc.want {
				t.Errorf("For(%s) = %+v %v, want %+v %v", tc.resource, got, ok, tc.want, tc.shared)
			}
		})
	}
}

func TestUnusedAndIDs(t *testing.T) {
	c, err := Parse([]byte("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n    - {name: nvidia.com/mig-2g.20gb, replicas: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if u := c.Unused([]string{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"}); len(u) != 1 || u[0] != "nvidia.com/mig-2g.20gb" {
		t.Errorf("unused %v", u)
	}
	m, err := Parse([]byte("version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if u := m.Unused([]string{"nvidia.com/gpu"}); len(u) != 1 || u[0] != "nvidia.com/mig-1g.10gb" || !m.Any() {
		t.Errorf("unused %v", u)
	}
	id := ReplicaID("GPU-1", 3)
	if dev, ok := DeviceOf(id); id != "GPU-1::3" || !ok || dev != "GPU-1" {
		t.Errorf("ReplicaID/DeviceOf: %s %s %v", id, dev, ok)
	}
	if _, ok := DeviceOf("GPU-1"); ok {
		t.Error("a plain ID read as a replica")
	}
}

// FuzzParse: any input parses cleanly or fails with a bounded error.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "version: v1", "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: a/b, replicas: 2}\n", "{", "version: [", "sharing: 3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		c, err := Parse([]byte(in))
		if err != nil {
			if len(err.Error()) > 2048 {
				t.Errorf("error of %d bytes", len(err.Error()))
			}
			return
		}
		for _, r := range append(c.Sharing.TimeSlicing.Resources, c.Sharing.MPS.Resources...) {
			if got, ok := c.For(r.Name); !ok || got.Replicas < 2 || got.Replicas > MaxReplicas || (got.Strategy == MPSShared && (got.Replicas > MaxMPSReplicas || !got.FailRequestsGreaterThanOne)) {
				t.Errorf("accepted %+v as %+v %v", r, got, ok)
			}
		}
	})
}
