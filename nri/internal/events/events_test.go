package events

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/nvinject/nvinject/nri/internal/audit"
	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/shared/contract"
)

// counts is a Counter safe for the writer goroutine.
type counts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counts) AuditEvent(o string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[o]++
}

func (c *counts) get(o string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[o]
}

func (c *counts) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}

func rec(pod string, admitted bool, why string) audit.Record {
	r := audit.Record{Namespace: "default", Pod: pod, PodUID: "uid-" + pod, Container: "main", Admitted: admitted,
		Assigned: audit.Assignment{Asked: true, Resource: contract.ResourceName, Devices: []audit.Devices{{Resource: contract.ResourceName, IDs: []string{"GPU-a"}}}}}
	if !admitted {
		r.Reason, r.Error = "pod-annotation", why
	}
	return r
}

// run starts s and returns a func that stops it and waits for it.
func run(t *testing.T, s *Sink) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitCounted waits until n records have an outcome.
func waitCounted(t *testing.T, c *counts, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.total() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records counted: %v", c.total(), n, c.n)
		}
		time.Sleep(time.Millisecond)
	}
}

func podEvents(t *testing.T, cs *fake.Clientset) []corev1.Event {
	t.Helper()
	l, err := cs.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// TestSinkCorrelates: the Events are kubelet's kind: one per verdict on the
// pod, repeats counted on one Event, similar refusals combined, a burst per
// pod rate-limited and counted.
func TestSinkCorrelates(t *testing.T) {
	tests := []struct {
		name    string
		records []audit.Record
		// Events written, the highest count on one, and the outcomes.
		events, maxCount, sent, limited int
		combined                        bool
	}{
		{name: "one admission", records: []audit.Record{rec("a", true, "")}, events: 1, maxCount: 1, sent: 1},
		{name: "a refusal kubelet retries 30 times: one Event counting 25, then rate-limited",
			records: repeat(rec("b", false, "pod-level annotations name GPUs"), 30), events: 1, maxCount: 25, sent: 25, limited: 5},
		{name: "12 different refusals: the 10th on are combined",
			records: distinct("c", 12), events: 10, maxCount: 3, sent: 12, combined: true},
		{name: "admission and refusal of one pod are separate Events",
			records: []audit.Record{rec("d", true, ""), rec("d", false, "x")}, events: 2, maxCount: 1, sent: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			c := &counts{}
			s := New(cs.CoreV1(), WithCounter(c), WithNodeName("node-1"), WithQueueSize(len(tc.records)))
			for _, r := range tc.records {
				s.Record(r)
			}
			run(t, s)
			waitCounted(t, c, len(tc.records))
			evs := podEvents(t, cs)
			if len(evs) != tc.events || c.get(contract.AuditSent) != tc.sent || c.get(contract.AuditRateLimited) != tc.limited {
				t.Fatalf("%d Events, %v outcomes; want %d Events, sent %d, rate-limited %d", len(evs), c.n, tc.events, tc.sent, tc.limited)
			}
			most, combined := int32(0), false
			for _, e := range evs {
				checkEvent(t, e, tc.records[0])
				most = max(most, e.Count)
				combined = combined || strings.HasPrefix(e.Message, "(combined from similar events): ")
			}
			if most != int32(tc.maxCount) || combined != tc.combined {
				t.Errorf("highest count %d, combined %v; want %d, %v", most, combined, tc.maxCount, tc.combined)
			}
		})
	}
}

func checkEvent(t *testing.T, e corev1.Event, r audit.Record) {
	t.Helper()
	o := e.InvolvedObject
	if o.Kind != "Pod" || o.Name != r.Pod || o.Namespace != r.Namespace || string(o.UID) != r.PodUID || e.Namespace != r.Namespace {
		t.Errorf("Event on %+v in %s, want pod %s/%s uid %s", o, e.Namespace, r.Namespace, r.Pod, r.PodUID)
	}
	if e.Source.Component != contract.EventSource || e.Source.Host != "node-1" {
		t.Errorf("Event source %+v", e.Source)
	}
	wantType := map[string]string{contract.EventReasonGPUAdmitted: "Normal", contract.EventReasonGPURefused: "Warning"}[e.Reason]
	if wantType == "" || e.Type != wantType {
		t.Errorf("Event %s %s", e.Type, e.Reason)
	}
	if n, err := contract.ParseAuditNote(e.Message); err != nil || n.Container != r.Container || len(e.Message) > 1024 {
		t.Errorf("Event message %q (%d bytes) does not parse: %+v %v", e.Message, len(e.Message), n, err)
	}
}

func repeat(r audit.Record, n int) []audit.Record {
	out := make([]audit.Record, n)
	for i := range out {
		out[i] = r
	}
	return out
}

func distinct(pod string, n int) []audit.Record {
	out := make([]audit.Record, n)
	for i := range out {
		out[i] = rec(pod, false, fmt.Sprintf("refusal %d", i))
	}
	return out
}

// TestRecordNeverBlocks: with the API server hanging, Record returns at
// once; what the queue cannot hold is dropped and counted.
func TestRecordNeverBlocks(t *testing.T) {
	cs := fake.NewClientset()
	release := make(chan struct{})
	var once sync.Once
	entered := make(chan struct{}, 1)
	cs.PrependReactor("create", "events", func(clienttesting.Action) (bool, runtime.Object, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return true, nil, fmt.Errorf("hung")
	})
	c := &counts{}
	s := New(cs.CoreV1(), WithCounter(c), WithQueueSize(4))
	run(t, s)
	// Cleanups run last first: the API server answers before Run is waited for.
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	s.Record(rec("first", true, ""))
	<-entered // the writer is stuck on the API server
	const n = 1000
	t0 := time.Now()
	for i := range n {
		s.Record(rec(fmt.Sprint("p", i), true, ""))
	}
	if d := time.Since(t0); d > 100*time.Millisecond {
		t.Errorf("%d Records took %s with the API server hanging", n, d)
	}
	if got := c.get(contract.AuditQueueFull); got != n-4 {
		t.Errorf("queue-full drops %d, want %d (the queue holds 4)", got, n-4)
	}
	once.Do(func() { close(release) })
}

// TestOutageLoggedOnce: while the API server refuses, one warning, not one
// per Event; one line when Events are recorded again; verdicts are not the
// sink's business, so nothing else changes.
func TestOutageLoggedOnce(t *testing.T) {
	cs := fake.NewClientset()
	var mu sync.Mutex
	failing := true
	cs.PrependReactor("create", "events", func(clienttesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return true, nil, fmt.Errorf("connection refused")
		}
		return false, nil, nil
	})
	var logs nritest.LogBuffer
	c := &counts{}
	s := New(cs.CoreV1(), WithCounter(c), WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	run(t, s)
	for i := range 20 {
		s.Record(rec(fmt.Sprint("p", i), true, ""))
	}
	waitCounted(t, c, 20)
	mu.Lock()
	failing = false
	mu.Unlock()
	s.Record(rec("after", true, ""))
	waitCounted(t, c, 21)
	out := logs.String()
	if n := strings.Count(out, "cannot record audit Events"); n != 1 || c.get(contract.AuditFailed) != 20 {
		t.Errorf("%d outage lines for 20 failed Events (counted %d):\n%s", n, c.get(contract.AuditFailed), out)
	}
	if n := strings.Count(out, "recording audit Events again"); n != 1 || c.get(contract.AuditSent) != 1 {
		t.Errorf("%d recovery lines, %d sent:\n%s", n, c.get(contract.AuditSent), out)
	}
}
