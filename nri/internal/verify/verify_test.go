package verify

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func gpuNode(m int64) Node {
	return Node{Path: "/dev/nvidia" + string(rune('0'+m)), Type: "c", Major: 195, Minor: m}
}

func TestCheck(t *testing.T) {
	ctl := Node{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255}
	two := []GPU{{UUID: "GPU-a", Minor: 0}, {UUID: "GPU-b", Minor: 1}}
	okEnv := []string{"NVINJECT_GPU_UUID_0=GPU-a", "NVINJECT_GPU_UUID_1=GPU-b", "PATH=/bin"}
	for _, tc := range []struct {
		name   string
		in     Input
		reason Reason
		found  string
	}{
		{name: "exact", in: Input{Allocated: two, Nodes: []Node{gpuNode(0), gpuNode(1), ctl}, Env: okEnv,
			Inventory: &Inventory{GPUs: map[string]int64{"GPU-a": 0, "GPU-b": 1}}, Kubelet: []string{"GPU-b", "GPU-a"}}},
		{name: "no GPUs, control node only", in: Input{Nodes: []Node{ctl}}},
		{name: "foreign node", in: Input{Allocated: two, Nodes: []Node{gpuNode(0), gpuNode(1), gpuNode(3)}, Env: okEnv},
			reason: ReasonForeignGPU, found: "/dev/nvidia3"},
		{name: "missing node", in: Input{Allocated: two, Nodes: []Node{gpuNode(0)}, Env: okEnv},
			reason: ReasonMissingGPU, found: "/dev/nvidia0"},
		{name: "block device with 195 is not a GPU", in: Input{Nodes: []Node{{Path: "/dev/x", Type: "b", Major: 195, Minor: 0}}}},
		{name: "env names another UUID", in: Input{Allocated: two, Nodes: []Node{gpuNode(0), gpuNode(1)},
			Env: []string{"NVINJECT_GPU_UUID_0=GPU-a", "NVINJECT_GPU_UUID_1=GPU-z"}}, reason: ReasonEnv, found: "GPU-z"},
		{name: "extra env", in: Input{Allocated: two, Nodes: []Node{gpuNode(0), gpuNode(1)},
			Env: append(okEnv, "NVINJECT_GPU_UUID_x=GPU-c")}, reason: ReasonEnv, found: "GPU-c"},
		// Read as minor 1, _01 would be hidden by the _1 after it.
		{name: "a minor spelled otherwise", in: Input{Allocated: two, Nodes: []Node{gpuNode(0), gpuNode(1)},
			Env: append([]string{"NVINJECT_GPU_UUID_01=GPU-c"}, okEnv...)}, reason: ReasonEnv, found: "GPU-c"},
		{name: "stale spec vs inventory", in: Input{Allocated: two, Nodes: []Node{gpuNode(0), gpuNode(1)}, Env: okEnv,
			Inventory: &Inventory{GPUs: map[string]int64{"GPU-a": 1, "GPU-b": 0}}}, reason: ReasonStaleSpec},
		{name: "kubelet disagrees", in: Input{Allocated: two, Nodes: []Node{gpuNode(0), gpuNode(1)}, Env: okEnv, Kubelet: []string{"GPU-a"}},
			reason: ReasonKubelet, found: "GPU-b"},
		{name: "kubelet assigned none", in: Input{Allocated: two, Nodes: []Node{gpuNode(0), gpuNode(1)}, Env: okEnv, Kubelet: []string{}},
			reason: ReasonKubelet},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.in)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("unexpected refusal: %v", err)
				}
				return
			}
			var m *MismatchError
			if !errors.As(err, &m) || m.Reason != tc.reason {
				t.Fatalf("err = %v, want reason %s", err, tc.reason)
			}
			if !strings.Contains(err.Error(), "expected [") || !strings.Contains(err.Error(), tc.found) {
				t.Errorf("error %q should name expected and found (%s)", err, tc.found)
			}
		})
	}
}

func TestFromEdits(t *testing.T) {
	nodes := []Node{gpuNode(2), {Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255}}
	got, err := FromEdits("nvidia.com/gpu=GPU-a", nodes, []string{"NVINJECT_GPU_UUID_2=GPU-a"}, nil)
	if err != nil || len(got) != 1 || got[0] != (GPU{UUID: "GPU-a", Minor: 2}) {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := FromEdits("nvidia.com/gpu=GPU-b", nodes, []string{"NVINJECT_GPU_UUID_2=GPU-a"}, nil); err == nil {
		t.Error("a device named after GPU-b describing GPU-a was accepted")
	}
	if _, err := FromEdits("vendor.com/gpu=x", nodes, nil, nil); err == nil {
		t.Error("a GPU node without a UUID variable was accepted")
	}
}

// FuzzUUIDEnv: the container's env is the user's; whatever it holds, a
// minor read from it is the one written in the variable's name (the value
// that of the last variable of that name), every NVINJECT_GPU_UUID_
// variable is accounted for, and nothing else is.
func FuzzUUIDEnv(f *testing.F) {
	for _, s := range []string{"NVINJECT_GPU_UUID_0=GPU-a\nPATH=/bin", "NVINJECT_GPU_UUID_01=x\nNVINJECT_GPU_UUID_1=y",
		"NVINJECT_GPU_UUID_+1=x", "NVINJECT_GPU_UUID_-0=", "NVINJECT_GPU_UUID_=", "NVINJECT_GPU_UUID_99999999999999999999=z", "=\n=="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		env := strings.Split(s, "\n")
		got := UUIDEnv(env)
		last := map[string]string{}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			last[k] = v
		}
		for m, v := range got {
			if m < -1 {
				t.Fatalf("UUIDEnv(%q) has minor %d", env, m)
			}
			if k := EnvUUIDPrefix + strconv.FormatInt(m, 10); m >= 0 && last[k] != v {
				t.Fatalf("UUIDEnv(%q)[%d] = %q, but the env's last %s is %q", env, m, v, k, last[k])
			}
		}
		for k := range last {
			suffix, ok := strings.CutPrefix(k, EnvUUIDPrefix)
			if !ok {
				continue
			}
			if _, bad := got[-1]; bad {
				continue
			}
			m, err := strconv.ParseInt(suffix, 10, 64)
			if _, ok := got[m]; err != nil || !ok {
				t.Fatalf("UUIDEnv(%q) = %v does not account for %s", env, got, k)
			}
		}
	})
}
