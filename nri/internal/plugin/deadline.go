package plugin

import (
	"context"
	"fmt"
	"time"
)

// within runs work under the handler's request deadline. When the deadline
// passes first, the container is refused at once: a refusal fails the
// creation, while overrunning the runtime's plugin_request_timeout would
// make containerd skip the plugin. The runtime sends its timeout with each
// request (ttrpc), so the deadline is also kept to three quarters of what
// is left of it: a plugin_request_timeout set below --request-deadline
// still gets a refusal, not a skip. work gets a context that ends at the
// deadline; if it ignores it, it finishes in the background and Wait waits
// for it.
func within[T any](ctx context.Context, h *Handler, what string, work func(context.Context) (T, error)) (T, error) {
	limit, by := h.deadline, "--request-deadline="+h.deadline.String()
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl) * 3 / 4; left < limit {
			limit, by = left, fmt.Sprintf("3/4 of the runtime's request timeout (%s; containerd's plugin_request_timeout)", left.Round(time.Millisecond))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	// Cancelled only once the outcome is taken: work finishing must not
	// look like the deadline passing.
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	h.inflight.Add(1)
	go func() {
		defer h.inflight.Done()
		v, err := work(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, refuse(ReasonDeadline, fmt.Errorf("%s did not finish within %s (%w); the container is refused rather than started unchecked: see the plugin's log for what it waits on", what, by, context.Cause(ctx)))
	}
}

// Wait waits for requests that are still running after their deadline.
func (h *Handler) Wait() { h.inflight.Wait() }
