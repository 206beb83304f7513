package audit

import (
	"context"
	"log/slog"
	"sync"
)

// Log writes each verdict as its one log line ("injected GPUs" or
// "refused container") off the request path: encoding the record's lists
// is most of what a verdict costs a container's CreateContainer. Nothing
// is dropped: a full queue, or a Record after Run returned, writes at once.
type Log struct {
	log  *slog.Logger
	ch   chan Record
	mu   sync.RWMutex
	done bool
}

// NewLog queues up to size records for l.
func NewLog(l *slog.Logger, size int) *Log {
	return &Log{log: l, ch: make(chan Record, size)}
}

// Record queues rec's line.
func (l *Log) Record(rec Record) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if !l.done {
		select {
		case l.ch <- rec:
			return
		default:
		}
	}
	l.Write(rec)
}

// Write logs rec's line now.
func (l *Log) Write(rec Record) { WriteLine(l.log, rec) }

// WriteLine logs rec as the verdict's one line on log.
func WriteLine(log *slog.Logger, rec Record) {
	if rec.Admitted {
		log.Info("injected GPUs", rec.LogAttrs()...)
	} else {
		log.Warn("refused container", rec.LogAttrs()...)
	}
}

// Run writes queued lines until ctx ends, then the ones still queued; from
// then on Record writes at once.
func (l *Log) Run(ctx context.Context) {
	for {
		select {
		case rec := <-l.ch:
			l.Write(rec)
		case <-ctx.Done():
			l.mu.Lock()
			l.done = true
			l.mu.Unlock()
			for {
				select {
				case rec := <-l.ch:
					l.Write(rec)
				default:
					return
				}
			}
		}
	}
}
