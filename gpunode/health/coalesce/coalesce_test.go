package coalesce

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// delivery is one state delivered, at its time since the test started.
type delivery struct {
	at    time.Duration
	state int
}

// step waits, then hands over an update.
type step struct {
	after time.Duration
	state int
}

// flaps are n updates every gap, alternating 1 (Unhealthy) and 0.
func flaps(n int, gap time.Duration) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = step{after: gap, state: 1 - i%2}
	}
	out[0].after = 0
	return out
}

// play runs a limiter (starting from state 0) through steps in a bubble
// whose clock is fake, waits a long quiet time, and returns what was
// delivered and how many updates were coalesced.
func play(t *testing.T, interval time.Duration, steps []step) (got []delivery, coalesced int) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		l := New(interval, 0, func(a, b int) bool { return a == b }, func(s int) {
			got = append(got, delivery{time.Since(start), s})
		}, WithOnCoalesced(func() { coalesced++ }))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { l.Run(ctx); close(done) }()
		for _, s := range steps {
			time.Sleep(s.after)
			l.Update(s.state)
			synctest.Wait()
		}
		time.Sleep(10 * interval)
		synctest.Wait()
		cancel()
		<-done
	})
	return got, coalesced
}

func TestLimiter(t *testing.T) {
	const iv = time.Second
	for _, tt := range []struct {
		name      string
		interval  time.Duration
		steps     []step
		want      []delivery
		coalesced int
	}{
		{name: "a single change is delivered without waiting", interval: iv,
			steps: []step{{0, 1}}, want: []delivery{{0, 1}}},
		{name: "the state the consumer holds is not sent", interval: iv,
			steps: []step{{0, 0}, {3 * iv, 0}}},
		{name: "an equal state is not sent again", interval: iv,
			steps: []step{{0, 1}, {3 * iv, 1}}, want: []delivery{{0, 1}}},
		{name: "a change after a quiet time goes out at once", interval: iv,
			steps: []step{{0, 1}, {3 * iv, 0}}, want: []delivery{{0, 1}, {3 * iv, 0}}},
		{name: "a change in the quiet time waits for its end", interval: iv,
			steps: []step{{0, 1}, {100 * time.Millisecond, 2}}, want: []delivery{{0, 1}, {iv, 2}}},
		{name: "the newest update in the quiet time wins", interval: iv,
			steps: []step{{0, 1}, {100 * time.Millisecond, 2}, {100 * time.Millisecond, 3}}, want: []delivery{{0, 1}, {iv, 3}}, coalesced: 1},
		{name: "a burst of 100 flaps in one interval is 2 deliveries ending Healthy", interval: iv,
			steps: flaps(100, 5*time.Millisecond), want: []delivery{{0, 1}, {iv, 0}}, coalesced: 98},
		{name: "a burst that ends where it started sends the first change only", interval: iv,
			steps: flaps(101, 5*time.Millisecond), want: []delivery{{0, 1}}, coalesced: 99},
		{name: "interval 0 delivers every update", interval: 0,
			steps: []step{{0, 1}, {time.Millisecond, 0}, {time.Millisecond, 1}}, want: []delivery{{0, 1}, {time.Millisecond, 0}, {2 * time.Millisecond, 1}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, coalesced := play(t, tt.interval, tt.steps)
			if !slices.Equal(got, tt.want) {
				t.Errorf("delivered %v; want %v", got, tt.want)
			}
			if coalesced != tt.coalesced {
				t.Errorf("coalesced %d updates; want %d", coalesced, tt.coalesced)
			}
		})
	}
}

// TestSteadyFlappingIsBounded: a GPU flapping at 10 Hz for 10 intervals is
// told at most once per interval, plus the final state, which is the last
// one handed over.
func TestSteadyFlappingIsBounded(t *testing.T) {
	const iv = time.Second
	steps := flaps(100, 100*time.Millisecond)
	steps = append(steps, step{after: 50 * time.Millisecond, state: 7})
	got, _ := play(t, iv, steps)
	if len(got) == 0 || got[len(got)-1].state != 7 {
		t.Fatalf("delivered %v; want the final state 7 last", got)
	}
	// 10 s of flapping: at most one delivery per interval, plus the final.
	if limit := 10 + 2; len(got) > limit {
		t.Errorf("%d deliveries; want at most %d: %v", len(got), limit, got)
	}
	for i := 1; i < len(got); i++ {
		if gap := got[i].at - got[i-1].at; gap < iv {
			t.Errorf("deliveries %d and %d only %s apart; want at least %s: %v", i-1, i, gap, iv, got)
		}
	}
}

// TestCancel: Run returns once ctx ends, delivering nothing more (the
// consumer ends with it), and Update never blocks, even after Run returned.
func TestCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var got []int
		l := New(time.Second, 0, func(a, b int) bool { return a == b }, func(s int) { got = append(got, s) })
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { l.Run(ctx); close(done) }()
		l.Update(1)
		synctest.Wait()
		l.Update(2) // waits for the quiet time
		synctest.Wait()
		cancel()
		<-done
		l.Update(3)
		time.Sleep(time.Minute)
		if !slices.Equal(got, []int{1}) {
			t.Errorf("delivered %v; want [1]: nothing after cancel", got)
		}
	})
}
