package scale

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nvinject/nvinject/gpunode/health"
)

func TestStormBound(t *testing.T) {
	for _, tc := range []struct {
		nodes       int
		d, interval time.Duration
		want        int
	}{
		// One delivery a second over a minute, the first at once, plus the final.
		{nodes: 80, d: time.Minute, interval: time.Second, want: 80 * 61},
		{nodes: 4, d: 10 * time.Second, interval: time.Second, want: 44},
		// A storm shorter than the interval: the first change and the final.
		{nodes: 3, d: 500 * time.Millisecond, interval: time.Second, want: 6},
		{nodes: 2, d: 10 * time.Second, interval: 3 * time.Second, want: 2 * 5},
		{nodes: 0, d: time.Minute, interval: time.Second, want: 0},
	} {
		if got := stormBound(tc.nodes, tc.d, tc.interval); got != tc.want {
			t.Errorf("stormBound(%d, %s, %s) = %d, want %d", tc.nodes, tc.d, tc.interval, got, tc.want)
		}
	}
}

func TestSyncBound(t *testing.T) {
	for _, tc := range []struct {
		nodes               int
		d, interval, period time.Duration
		want                int
	}{
		// A minute of sends, the final within 1s, the next sync within 10s: 71s holds 8 syncs.
		{nodes: 40, d: time.Minute, interval: time.Second, period: 10 * time.Second, want: 40 * 8},
		{nodes: 1, d: 5 * time.Second, interval: time.Second, period: 10 * time.Second, want: 2},
		{nodes: 0, d: time.Minute, interval: time.Second, period: 10 * time.Second, want: 0},
	} {
		if got := syncBound(tc.nodes, tc.d, tc.interval, tc.period); got != tc.want {
			t.Errorf("syncBound(%d, %s, %s, %s) = %d, want %d", tc.nodes, tc.d, tc.interval, tc.period, got, tc.want)
		}
	}
}

func TestSpreadPutsNodesOutOfStep(t *testing.T) {
	seen := map[time.Duration]bool{}
	for i := range 8 {
		o := spread(i, 8, time.Second)
		if o < 0 || o >= time.Second || seen[o] {
			t.Fatalf("spread(%d, 8, 1s) = %s: want distinct offsets in [0, 1s)", i, o)
		}
		seen[o] = true
	}
	if got := spread(3, 8, time.Second); got != 375*time.Millisecond {
		t.Errorf("spread(3, 8, 1s) = %s, want 375ms", got)
	}
	if got := spread(0, 0, time.Second); got != 0 {
		t.Errorf("spread(0, 0, 1s) = %s, want 0", got)
	}
}

// TestKubeletStatusWritesOnItsSync: sends every 300ms for 30s reach the
// API once a sync (10s), only when the count changed, the last one always.
func TestKubeletStatusWritesOnItsSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu     sync.Mutex
			writes []int
			at     []time.Duration
		)
		start := time.Now()
		k := newKubeletStatus(8, 10*time.Second, 2*time.Second, func(_ context.Context, healthy int) error {
			mu.Lock()
			defer mu.Unlock()
			writes = append(writes, healthy)
			at = append(at, time.Since(start))
			return nil
		})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- k.run(ctx, t.Context()) }()
		states := make([]health.State, 8)
		for i := range states {
			states[i].Healthy = true
		}
		for i := range 100 {
			states[0].Healthy = i%2 == 1
			states[1].Healthy = i%3 != 0
			k.set(states)
			time.Sleep(300 * time.Millisecond)
		}
		states[0].Healthy, states[1].Healthy = false, false
		k.set(states)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if !k.synced() {
			t.Errorf("the last list (6 healthy) was not written a sync after it")
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(writes) == 0 || writes[len(writes)-1] != 6 {
			t.Fatalf("writes %v, want the last to be 6", writes)
		}
		// Syncs at 2s, 12s, 22s, 32s: at most one write each.
		if len(writes) > 4 {
			t.Errorf("%d writes at %v for 101 sends over 30s, want at most 4 (one a 10s sync)", len(writes), at)
		}
		for i := 1; i < len(at); i++ {
			if at[i]-at[i-1] < 10*time.Second {
				t.Errorf("writes %s and %s less than a sync apart", at[i-1], at[i])
			}
		}
	})
}

func TestRatio(t *testing.T) {
	for _, tc := range []struct {
		storm, quiet Duration
		want         float64
	}{
		{Duration(2 * time.Second), Duration(time.Second), 2},
		{Duration(250 * time.Millisecond), Duration(500 * time.Millisecond), 0.5},
		{Duration(time.Second), 0, 0},
	} {
		if got := ratio(tc.storm, tc.quiet); got != tc.want {
			t.Errorf("ratio(%s, %s) = %g, want %g", tc.storm, tc.quiet, got, tc.want)
		}
	}
}

func TestStormWrites(t *testing.T) {
	st := &Storm{Duration: Duration(10 * time.Second), Interval: Duration(time.Second), KubeletSync: Duration(5 * time.Second),
		FlappingNodes: PerPath{PathDevicePlugin: 2, PathDRA: 2}}
	quiet := Phase{Duration: Duration(10 * time.Second), Requests: Requests{"PATCH nodes/status": 4}}
	storm := Phase{Duration: Duration(20 * time.Second), Requests: Requests{"PATCH nodes/status": 16, "PUT resourceslices": 50}}
	got := stormWrites(st, quiet, storm)
	want := []StormWrite{
		// The quiet phase's 4 in 10s are 8 in the storm phase's 20s; the
		// device-plugin bound is kubelet's sync: 2 nodes x (16s/5s + 1).
		{Path: PathDevicePlugin, Request: "PATCH nodes/status", Storm: 16, Quiet: 8, Excess: 8, PerSecond: 0.8, Bound: 8, Within: true},
		{Path: PathDRA, Request: "PUT resourceslices", Storm: 50, Quiet: 0, Excess: 50, PerSecond: 5, Bound: 22, Within: false},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("stormWrites =\n%+v\nwant\n%+v", got, want)
	}
}

func TestStormNodesSpreadsOverNodesAndPaths(t *testing.T) {
	nodes, err := buildNodes(t.Context(), 6, "sim:h100-80gb*8", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		gpus int
		// want is node index: its flapping GPUs.
		want map[int][]int
	}{
		{gpus: 2, want: map[int][]int{0: {0}, 1: {0}}},
		{gpus: 6, want: map[int][]int{0: {0}, 1: {0}, 2: {0}, 3: {0}, 4: {0}, 5: {0}}},
		// Every node has one before any has a second.
		{gpus: 8, want: map[int][]int{0: {0, 1}, 1: {0, 1}, 2: {0}, 3: {0}, 4: {0}, 5: {0}}},
	} {
		if got := stormNodes(nodes, tc.gpus); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("stormNodes(6 nodes, %d GPUs) = %v, want %v", tc.gpus, got, tc.want)
		}
	}
}
