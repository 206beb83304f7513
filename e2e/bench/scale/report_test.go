package scale

import (
	"testing"
	"time"
)

func TestLatencyQuantiles(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i
	}
	for _, tc := range []struct {
		name          string
		in            []time.Duration
		p50, p99, max time.Duration
	}{
		{"none", nil, 0, 0, 0},
		{"one", ms(7), 7 * time.Millisecond, 7 * time.Millisecond, 7 * time.Millisecond},
		{"hundred unsorted", ms(hundred...), 51 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
	} {
		got := latency(tc.in)
		if time.Duration(got.P50) != tc.p50 || time.Duration(got.P99) != tc.p99 || time.Duration(got.Max) != tc.max {
			t.Errorf("%s: latency = %+v, want p50 %s p99 %s max %s", tc.name, got, tc.p50, tc.p99, tc.max)
		}
	}
}

func TestRequestsDeltaAndTop(t *testing.T) {
	before := Requests{"POST pods": 10, "GET nodes": 5, "PUT leases": 3}
	after := Requests{"POST pods": 25, "GET nodes": 5, "PUT leases": 9, "POST pods/binding": 15}
	d := after.Sub(before)
	if len(d) != 3 || d["POST pods"] != 15 || d["PUT leases"] != 6 || d["POST pods/binding"] != 15 {
		t.Fatalf("delta = %v, want POST pods 15, POST pods/binding 15, PUT leases 6", d)
	}
	if d.Total() != 36 {
		t.Errorf("total = %d, want 36", d.Total())
	}
	top := d.Top(2)
	if len(top) != 2 || top[0].Request != "POST pods" || top[1].Request != "POST pods/binding" {
		t.Errorf("top 2 = %v, want the two 15s by name", top)
	}
}
