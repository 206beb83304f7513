// Package events records nvinject-nri's audit records as Kubernetes Events
// on their pods, off the request path. Record never blocks: a bounded queue
// feeds one writer, and what does not fit is dropped and counted. The
// writer runs each Event through client-go's EventCorrelator, the one
// kubelet's recorder uses (tools/record): repeats of one Event become a
// count on it, more than 10 similar ones within 10 minutes are combined,
// and a pod gets at most 25 Events of a type in a burst, then one per 5
// minutes. It writes core/v1 Events (what `kubectl describe pod` and
// kubelet's own Events are) with one attempt each: the audit trail is best
// effort and never holds up or changes a verdict.
package events

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/tools/record/util"
	"k8s.io/utils/clock"

	"github.com/nvinject/nvinject/nri/internal/audit"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/logging"
)

// Counter counts each record's outcome (a contract.Audit* value).
type Counter interface{ AuditEvent(outcome string) }

// Sink queues records and writes them as Events.
type Sink struct {
	api     typedcorev1.EventsGetter
	queue   chan audit.Record
	corr    *record.EventCorrelator
	log     *slog.Logger
	count   Counter
	host    string
	timeout time.Duration
	clock   clock.PassiveClock
	// down is the writer's own: an outage is logged once, not per Event.
	down bool
}

// Option configures a Sink.
type Option func(*Sink)

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(s *Sink) { s.log = l } }

// WithCounter sets where outcomes are counted.
func WithCounter(c Counter) Option { return func(s *Sink) { s.count = c } }

// WithNodeName names the node in each Event's source.
func WithNodeName(n string) Option { return func(s *Sink) { s.host = n } }

// WithQueueSize sets how many records wait for the writer (default 256).
func WithQueueSize(n int) Option { return func(s *Sink) { s.queue = make(chan audit.Record, n) } }

// WithTimeout bounds each write to the API server (default 5s).
func WithTimeout(d time.Duration) Option { return func(s *Sink) { s.timeout = d } }

// WithClock sets the clock of the timestamps and the correlator (tests).
func WithClock(c clock.PassiveClock) Option { return func(s *Sink) { s.clock = c } }

// New returns a Sink writing through api; Run writes.
func New(api typedcorev1.EventsGetter, opts ...Option) *Sink {
	s := &Sink{api: api, queue: make(chan audit.Record, 256), log: slog.Default(), timeout: 5 * time.Second, clock: clock.RealClock{}}
	for _, o := range opts {
		o(s)
	}
	s.corr = record.NewEventCorrelatorWithOptions(record.CorrelatorOptions{Clock: s.clock})
	return s
}

// Record queues r, or drops and counts it when the queue is full. It never
// blocks.
func (s *Sink) Record(r audit.Record) {
	select {
	case s.queue <- r:
	default:
		s.counted(contract.AuditQueueFull)
	}
}

// Run writes queued records until ctx ends; what is still queued then is
// not written.
func (s *Sink) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-s.queue:
			s.write(ctx, r)
		}
	}
}

func (s *Sink) write(ctx context.Context, r audit.Record) {
	res, err := s.corr.EventCorrelate(s.event(r))
	if err != nil {
		// The patch of a repeat's count did not build: nothing to send.
		s.counted(contract.AuditFailed)
		return
	}
	if res.Skip {
		s.counted(contract.AuditRateLimited)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ev, api := res.Event, s.api.Events(res.Event.Namespace)
	var out *corev1.Event
	if ev.Count > 1 {
		out, err = api.Patch(ctx, ev.Name, types.StrategicMergePatchType, res.Patch, metav1.PatchOptions{})
	}
	if ev.Count <= 1 || apierrors.IsNotFound(err) {
		// A new Event, or the counted one expired (the API server's --event-ttl).
		ev.ResourceVersion = ""
		out, err = api.Create(ctx, ev, metav1.CreateOptions{})
	}
	if err != nil {
		s.counted(contract.AuditFailed)
		if !s.down {
			s.down = true
			s.log.Warn("cannot record audit Events on pods; verdicts are unchanged and still logged, Events resume when the API server answers",
				"pod", r.Namespace+"/"+r.Pod, logging.Err(err))
		}
		return
	}
	s.corr.UpdateState(out)
	s.counted(contract.AuditSent)
	if s.down {
		s.down = false
		s.log.Info("recording audit Events again")
	}
}

// event is r as kubelet's recorder would make it (tools/record's makeEvent).
func (s *Sink) event(r audit.Record) *corev1.Event {
	now := metav1.NewTime(s.clock.Now())
	action := "Admit"
	if !r.Admitted {
		action = "Refuse"
	}
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: util.GenerateEventName(r.Pod, now.UnixNano()), Namespace: r.Namespace},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: r.Namespace, Name: r.Pod, UID: types.UID(r.PodUID),
		},
		Reason: r.EventReason(), Message: r.Note().String(), Type: r.EventType(), Action: action,
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		Source:              corev1.EventSource{Component: contract.EventSource, Host: s.host},
		ReportingController: contract.EventSource, ReportingInstance: s.instance(),
	}
}

func (s *Sink) instance() string {
	if s.host == "" {
		return contract.EventSource
	}
	return fmt.Sprintf("%s-%s", contract.EventSource, s.host)
}

func (s *Sink) counted(outcome string) {
	if s.count != nil {
		s.count.AuditEvent(outcome)
	}
}
