package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvinject/nvinject/doctor/fleet"
	"github.com/nvinject/nvinject/shared/contract"
)

func TestRun(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "smi-good")
	bad := filepath.Join(dir, "smi-bad")
	if err := os.WriteFile(good, []byte("#!/bin/sh\necho '0, GPU-1, A100, Disabled'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho 'NVIDIA-SMI has failed'; exit 9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	base := []string{"--no-kube", "--kubelet-dir", dir + "/none", "--cdi-spec-dir", dir + "/none",
		"--containerd-config", dir + "/none.toml", "--device-plugin-metrics", "http://127.0.0.1:1/metrics", "--nri-metrics", "http://127.0.0.1:1/metrics"}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     string
	}{
		{"nothing broken, all else unknown", append([]string{"--nvidia-smi", good}, base...), 0, "driver        OK"},
		{"driver broken", append([]string{"--nvidia-smi", bad}, base...), 1, "fix: check the host driver"},
		{"json", append([]string{"--json", "--nvidia-smi", bad}, base...), 1, `"layer": "driver"`},
		{"bad flag", []string{"--nope"}, 2, "flag provided but not defined"},
		{"stray argument", []string{"extra"}, 2, "unexpected arguments"},
		{"help", []string{"--help"}, 0, "Usage: nvinject-doctor [flags]"},
		{"version", []string{"--version"}, 0, "nvinject-doctor dev"},
		{"explain", []string{"--explain"}, 0, "capacity 1, allocatable 0 → the plugin reports the device unhealthy"},
		{"explain DRA", []string{"--explain"}, 0, "DRA node: worker sees the GPU but no ResourceSlice offers it"},
		{"bad mode", []string{"--mode", "cdi"}, 2, `--mode "cdi": want device-plugin or dra`},
		{"DRA mode, node only", append([]string{"--mode", "dra", "--nvidia-smi", good, "--dra-metrics", "http://127.0.0.1:1/metrics"}, base...), 0, "mode dra (--mode dra)"},
		{"explain help", []string{"explain", "--help"}, 0, "Usage: nvinject-doctor explain [flags] POD"},
		{"explain without a pod", []string{"explain"}, 2, "explain takes one pod name"},
		{"explain, two pods", []string{"explain", "a", "--pod-namespace", "x", "b"}, 2, `got ["a" "b"]`},
		{"explain, no API server", []string{"explain", "vllm", "--kubeconfig", dir + "/none", "--pod-namespace", "ml"}, 1, "explain ml/vllm: load kubeconfig"},
		{"deprecated alias", append([]string{"--nvidia-smi", good, "--resource=nvidia.com/gpu"}, base...), 0, "--resource is deprecated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), tt.args, &out, &errOut, connectAPI)
			all := out.String() + errOut.String()
			if code != tt.wantCode || !strings.Contains(all, tt.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tt.wantCode, tt.want, all)
			}
			if strings.HasPrefix(tt.name, "json") {
				var r struct {
					Verdicts []struct{ Layer, Status string }
				}
				if err := json.Unmarshal(out.Bytes(), &r); err != nil || len(r.Verdicts) != 8 || r.Verdicts[0].Status != "broken" {
					t.Errorf("json = %+v, %v", r, err)
				}
			}
		})
	}
}

// fakeProber answers every readyz with one body.
type fakeProber string

func (f fakeProber) Readyz(context.Context, string, string, int) (string, error) {
	return string(f), nil
}

func gpuNode(name, pool string, capacity, allocatable int64) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{contract.GFDLabelPresent: "true", "pool": pool}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{contract.ResourceName: *resource.NewQuantity(capacity, resource.DecimalSI)},
			Allocatable: corev1.ResourceList{contract.ResourceName: *resource.NewQuantity(allocatable, resource.DecimalSI)},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
}

func readyPod(app, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: app + "-" + node, Namespace: contract.Namespace, Labels: map[string]string{contract.AppLabel: app}},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

// TestAllNodes runs --all-nodes through run with a fake cluster: an ok
// node in pool a, one with an unhealthy GPU in pool b.
func TestAllNodes(t *testing.T) {
	connect := func(string) (kubernetes.Interface, fleet.Prober, error) {
		return fake.NewClientset(gpuNode("z-ok", "a", 2, 2), gpuNode("b-sick", "b", 2, 1),
			readyPod(contract.DevicePluginApp, "z-ok"), readyPod(contract.NRIApp, "z-ok"),
			readyPod(contract.DevicePluginApp, "b-sick"), readyPod(contract.NRIApp, "b-sick")), fakeProber("not ready"), nil
	}
	noAPI := func(string) (kubernetes.Interface, fleet.Prober, error) {
		return nil, nil, errors.New("load kubeconfig (pass --kubeconfig or set KUBECONFIG): no such file")
	}
	tests := []struct {
		name     string
		args     []string
		connect  connectFunc
		wantCode int
		want     []string
	}{
		{"table, sorted, one broken", []string{"--all-nodes"}, connect, 1,
			[]string{"NODE", "b-sick  device-plugin  -      2/1", "health: 1 of 2 GPUs unhealthy", "z-ok", "2 GPU nodes: 1 ok, 1 broken"}},
		{"json with a selector", []string{"--all-nodes", "--json", "--selector", "pool=a"}, connect, 0, []string{`"node": "z-ok"`, `"gpusHealthy": 2`}},
		{"selector without --all-nodes", []string{"--selector", "pool=a"}, connect, 2, []string{"give --all-nodes too"}},
		{"with --node-name", []string{"--all-nodes", "--node-name", "x"}, connect, 2, []string{"drop --node-name and --no-kube"}},
		{"no API server", []string{"--all-nodes"}, noAPI, 1, []string{"load kubeconfig"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), tt.args, &out, &errOut, tt.connect)
			all := out.String() + errOut.String()
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d:\n%s", code, tt.wantCode, all)
			}
			// In order: the rows are sorted by node name.
			rest := all
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("output lacks %q after the earlier wants:\n%s", w, all)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}
