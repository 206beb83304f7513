package audit_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/nvinject/nvinject/nri/internal/audit"
)

type lines struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lines) pods() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if i := strings.Index(line, `"pod":"`); i >= 0 {
			out = append(out, strings.SplitN(line[i+7:], `"`, 2)[0])
		}
	}
	return out
}

// Every verdict line is written: queued ones by Run, those still
// queued when ctx ends before Run returns, a full queue's and a late one's
// at once.
func TestLogLosesNothing(t *testing.T) {
	for _, size := range []int{0, 1, 64} {
		t.Run(fmt.Sprint("queue ", size), func(t *testing.T) {
			var out lines
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
			got := out.pods()
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
	var out lines
	l := audit.NewLog(slog.New(slog.NewJSONHandler(&out, nil)), 8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	for i := range 100 {
		l.Record(audit.Record{Namespace: "ns", Pod: fmt.Sprint("p", i), Admitted: true})
	}
	cancel()
	<-done
	if got := out.pods(); len(got) != 100 {
		t.Fatalf("wrote %d verdict lines, want 100", len(got))
	}
	if !strings.Contains(out.b.String(), `"msg":"injected GPUs"`) {
		t.Error("no injected GPUs line")
	}
}
