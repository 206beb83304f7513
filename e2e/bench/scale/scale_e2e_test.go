package scale_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/e2e/bench/scale"
	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
	"github.com/nvinject/nvinject/e2e/harness/kwok"
	"github.com/nvinject/nvinject/e2e/internal/cachebuild"
)

// TestFiftyNodes runs the simulator's whole path on 50 nodes: slices of every DRA
// node published, 90 % of the GPUs filled through both paths (DRA pods each with an
// allocated claim, device-plugin pods with none), churn, CEL claim-template pods, and
// a short health storm that leaves no GPU in a wrong state and stays within the
// limiter's bound.
func TestFiftyNodes(t *testing.T) {
	tools := os.Getenv("NVINJECT_TOOLS_BIN")
	if tools == "" {
		t.Skip("NVINJECT_TOOLS_BIN is unset: run `make tools` (or `make test`, which sets it) to build the control plane's binaries")
	}
	if os.Geteuid() != 0 {
		t.Skip("the control plane needs root (the API server's private mount namespace)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	kwokBin, err := kwok.Bin(ctx)
	if errors.Is(err, cachebuild.ErrUnavailable) {
		t.Skipf("kwok is not cached and cannot be built: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Ports and run dir apart from both the local node's and scale-sim's.
	ports := kubelocal.Ports{EtcdClient: 25790, EtcdPeer: 25800, APIServer: 18443,
		ControllerManager: 12357, Scheduler: 12359, Kubelet: 12350, KubeletHealthz: 12348}
	rep, err := scale.Run(ctx, scale.Config{Nodes: 50, RunDir: "/tmp/nvinject-scale-test", Ports: ports,
		ToolsBin: tools, KwokBin: kwokBin, ChurnFor: 5 * time.Second, Storm: 10 * time.Second, WaitFor: 2 * time.Minute,
		// A status sync well inside the storm: at the default 10 s a 10 s storm
		// may span no sync of a flapping node, and then it writes nothing.
		KubeletSync: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.Write(&out)
	t.Log("\n" + out.String())

	if rep.DRANodes != 25 || rep.GPUs != 400 || rep.SlicePublish <= 0 {
		t.Errorf("DRA nodes %d, GPUs %d, slice publication %s; want 25, 400 and a time", rep.DRANodes, rep.GPUs, rep.SlicePublish)
	}
	var names []string
	for _, ph := range rep.Phases {
		names = append(names, ph.Name)
		if ph.RequestsTotal == 0 {
			t.Errorf("phase %s counted no API request", ph.Name)
		}
	}
	if got := strings.Join(names, ","); got != "nodes,slices,fill,churn,cel,quiet,storm" {
		t.Fatalf("phases %s, want nodes,slices,fill,churn,cel,quiet,storm", got)
	}
	if cel := rep.Phases[4].Paths; len(cel) != 1 || cel[0].Name != scale.PathCEL || cel[0].Pods != 10 || cel[0].Claims != 10 || cel[0].Running.P50 <= 0 {
		t.Errorf("cel: %+v; want 10 %s pods, each with an allocated claim", cel, scale.PathCEL)
	}
	st := rep.Storm
	if st == nil {
		t.Fatal("no storm figures")
	}
	if st.Wrong != 0 || st.FlappingNodes[scale.PathDRA] != 2 || st.FlappingNodes[scale.PathDevicePlugin] != 2 {
		t.Errorf("storm: %d GPUs in a wrong state, flapping nodes %v; want 0 and 2 per path", st.Wrong, st.FlappingNodes)
	}
	for _, w := range st.Writes {
		if !w.Within || w.Excess == 0 {
			t.Errorf("storm %s: %.0f %s beyond the quiet phase's, bound %d; want some, within it", w.Path, w.Excess, w.Request, w.Bound)
		}
	}
	if len(st.Latency) != 2 {
		t.Errorf("storm latency %+v, want both paths' probes", st.Latency)
	}
	fill := rep.Phases[2]
	for _, p := range fill.Paths {
		wantClaims := 0
		if p.Name == scale.PathDRA {
			wantClaims = p.Pods
		}
		if p.Pods != 180 || p.Claims != wantClaims || p.Running.P50 <= 0 {
			t.Errorf("fill %s: %d pods, %d claims, Running p50 %s; want 180 pods, %d claims", p.Name, p.Pods, p.Claims, p.Running.P50, wantClaims)
		}
	}
	if fill.Scheduled < 360 || fill.Requests["POST resourceclaims"] < 180 {
		t.Errorf("fill: the scheduler bound %d pods and created %v claims; want 360 and 180", fill.Scheduled, fill.Requests["POST resourceclaims"])
	}
	if rep.EtcdDBBytes == 0 || len(rep.Memory) != 6 {
		t.Errorf("etcd db %d bytes, %d processes measured; want a size and 6", rep.EtcdDBBytes, len(rep.Memory))
	}
}
