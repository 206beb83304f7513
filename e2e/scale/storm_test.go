package scale

import (
	"fmt"
	"testing"
	"time"
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
	st := &Storm{Duration: Duration(10 * time.Second), Interval: Duration(time.Second),
		FlappingNodes: PerPath{PathDevicePlugin: 2, PathDRA: 2}}
	quiet := Phase{Duration: Duration(10 * time.Second), Requests: Requests{"PATCH nodes/status": 4}}
	storm := Phase{Duration: Duration(20 * time.Second), Requests: Requests{"PATCH nodes/status": 30, "PUT resourceslices": 50}}
	got := stormWrites(st, quiet, storm)
	want := []StormWrite{
		// The quiet phase's 4 in 10s are 8 in the storm phase's 20s.
		{Path: PathDevicePlugin, Request: "PATCH nodes/status", Storm: 30, Quiet: 8, Excess: 22, PerSecond: 2.2, Bound: 22, Within: true},
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
