package audit_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/nri/internal/audit"
	"github.com/nvinject/nvinject/nri/internal/nritest"
)

// pods are the pods named by the verdict lines in out, in order.
func pods(out *nritest.LogBuffer) []string {
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if i := strings.Index(line, `"pod":"`); i >= 0 {
			names = append(names, strings.SplitN(line[i+7:], `"`, 2)[0])
		}
	}
	return names
}

// Every verdict line is written: queued ones by Run, those still
// queued when ctx ends before Run returns, a full queue's and a late one's
// at once.
func TestLogLosesNothing(t *testing.T) {
	for _, size := range []int{0, 1, 64} {
		t.Run(fmt.Sprint("queue ", size), func(t *testing.T) {
			var out nritest.LogBuffer
			l := audit.NewLog(slog.New(slog.NewJSONHandler(&out, nil)), size)
			var want []string
			for i := range 10 {
				name := fmt.Sprint("p", i)
				want = append(want, "ns/"+name)
				l.Record(audit.Record{Namespace: "ns", Pod: name, Admitted: i%2 == 0, Reason: "r", Error: "e"})
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			l.Run(ctx)
			l.Record(audit.Record{Namespace: "ns", Pod: "late", Admitted: true})
			want = append(want, "ns/late")
			got := pods(&out)
			if len(got) != len(want) {
				t.Fatalf("wrote %v, want %v", got, want)
			}
			for _, w := range want {
				found := false
				for _, g := range got {
					found = found || g == w
				}
				if !found {
					t.Errorf("verdict of %s lost: wrote %v", w, got)
				}
			}
		})
	}
}

// A running Log writes what it is handed while the caller goes on.
func TestLogWritesWhileRunning(t *testing.T) {
	var out nritest.LogBuffer
	l := audit.NewLog(slog.New(slog.NewJSONHandler(&out, nil)), 8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	for i := range 100 {
		l.Record(audit.Record{Namespace: "ns", Pod: fmt.Sprint("p", i), Admitted: true})
	}
	cancel()
	<-done
	if got := pods(&out); len(got) != 100 {
		t.Fatalf("wrote %d verdict lines, want 100", len(got))
	}
	if !strings.Contains(out.String(), `"msg":"injected GPUs"`) {
		t.Error("no injected GPUs line")
	}
}
