package health

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nvinject/nvinject/shared/gpu"
)

// Run watches the GPUs until ctx ends, restarting a failed watch with
// backoff, and is the one goroutine that asks NVML: at each arm, after
// quiet periods and for Recover. It returns only after its watch did, and
// it stops its timers, so NVML may be closed once Run returned.
func (t *Tracker) Run(ctx context.Context, src Source) {
	defer t.stop()
	t.save(t.marks())
	backoff := t.retryMin
	for ctx.Err() == nil {
		err := t.watchOnce(ctx, src, func() { backoff = t.retryMin })
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("the health watch ended without an error")
		}
		reason := fmt.Sprintf("health monitoring failed (%v); retrying", err)
		t.update(func() { t.monitorDown = reason })
		t.log.Error("health monitoring failed: every GPU is Unhealthy until it works again", "error", err, "retry_in", backoff)
		wait := time.NewTimer(backoff)
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				wait.Stop()
				return
			case <-wait.C:
				waiting = false
			case <-t.wake:
				t.recheckDue(ctx, src)
			case r := <-t.reqs:
				r.resp <- t.recover(ctx, src, r.uuid)
			}
		}
		backoff = min(2*backoff, t.retryMax)
	}
}

func (t *Tracker) stop() {
	t.mu.Lock()
	for _, d := range t.devs {
		if d.recheck != nil {
			d.recheck.Stop()
		}
	}
	t.mu.Unlock()
	close(t.done)
}

func (t *Tracker) watchOnce(ctx context.Context, src Source, armed func()) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan gpu.HealthEvent, 64)
	errc := make(chan error, 1)
	go func() { errc <- src.WatchHealth(wctx, slices.Clone(t.order), events) }()
	for {
		select {
		case e := <-events:
			if e.Kind == gpu.EventWatching {
				t.arm(ctx, src)
				armed()
				continue
			}
			t.handle(ctx, src, e)
		case err := <-errc:
			return err
		case <-t.wake:
			t.recheckDue(ctx, src)
		case r := <-t.reqs:
			r.resp <- t.recover(ctx, src, r.uuid)
		case <-ctx.Done():
			cancel()
			<-errc
			return nil
		}
	}
}

// arm checks every GPU with NVML, then publishes: the watch is running.
func (t *Tracker) arm(ctx context.Context, src Source) {
	results := make(map[string]checked, len(t.order))
	for _, u := range t.order {
		h, err := src.CheckHealth(ctx, u)
		results[u] = checked{h, err}
	}
	t.update(func() {
		t.monitorDown = ""
		for u, c := range results {
			d := t.devs[u]
			d.check = c.verdict(d, false)
			c.keepECC(d)
			if d.check != "" {
				t.scheduleLocked(d)
			}
		}
	})
	t.monitoredOnce.Do(func() { close(t.monitored) })
}

type checked struct {
	h   gpu.DeviceHealth
	err error
}

// verdict is why NVML's answer does not vouch for the GPU; "" if it does.
// With compareECC, a volatile uncorrected ECC count above the last one
// seen fails the check.
func (c checked) verdict(d *device, compareECC bool) string {
	if c.err != nil {
		return "NVML check failed: " + c.err.Error()
	}
	var bad []string
	if c.h.RetiredPagesPending {
		bad = append(bad, "retired pages are pending (reset the GPU)")
	}
	if c.h.RowRemapFailure {
		bad = append(bad, "row remapping failed (the GPU needs service)")
	}
	if c.h.RowRemapPending {
		bad = append(bad, "a row remapping is pending (reset the GPU)")
	}
	if compareECC && c.h.ECCSupported && d.eccKnown && c.h.VolatileUncorrectedECC > d.ecc {
		bad = append(bad, fmt.Sprintf("volatile uncorrected ECC errors rose from %d to %d", d.ecc, c.h.VolatileUncorrectedECC))
	}
	if len(bad) == 0 {
		return ""
	}
	return "NVML: " + strings.Join(bad, ", ")
}

func (c checked) keepECC(d *device) {
	if c.err == nil && c.h.ECCSupported {
		d.ecc, d.eccKnown = c.h.VolatileUncorrectedECC, true
	}
}

// handle applies one health event.
func (t *Tracker) handle(ctx context.Context, src Source, e gpu.HealthEvent) {
	ignored := e.Kind == gpu.EventXid && t.ignored[e.Xid]
	defer t.observe(e, ignored)
	if ignored {
		t.log.Info("ignoring application Xid", "uuid", e.UUID, "xid", e.Xid)
		return
	}
	d, ok := t.devs[e.UUID]
	if !ok {
		return
	}
	at := e.Time
	if at.IsZero() {
		at = time.Now()
	}
	t.update(func() {
		switch {
		case e.Kind == gpu.EventLost:
			d.lost = "NVML reported the GPU lost (GPU_IS_LOST)"
		case e.Kind == gpu.EventXid && lostXids[e.Xid] != "":
			d.lost = lostXids[e.Xid]
			d.xid, d.xidAt = e.Xid, at
		case e.Kind == gpu.EventXid:
			d.xid, d.xidAt = e.Xid, at
		default:
			return
		}
		t.scheduleLocked(d)
	})
	if e.Kind == gpu.EventXid && d.lost == "" {
		// The ECC count when the Xid came is the baseline its quiet period
		// must not rise above.
		h, err := src.CheckHealth(ctx, e.UUID)
		t.mu.Lock()
		checked{h, err}.keepECC(d)
		t.mu.Unlock()
	}
}

// recheckDue asks NVML about every GPU whose quiet period ended.
func (t *Tracker) recheckDue(ctx context.Context, src Source) {
	for _, u := range t.order {
		d := t.devs[u]
		t.mu.Lock()
		due, gen := d.checkDue, d.gen
		d.checkDue = false
		t.mu.Unlock()
		if !due {
			continue
		}
		c := t.checkOne(ctx, src, u)
		t.update(func() {
			if d.gen != gen || d.lost != "" {
				return
			}
			d.check = c.verdict(d, true)
			c.keepECC(d)
			if d.check == "" {
				d.xidAt = time.Time{}
				return
			}
			t.log.Warn("quiet period ended but NVML does not vouch for the GPU; checking again after another quiet period", "uuid", u, "reason", d.check, "next_check_in", t.quiet)
			t.scheduleLocked(d)
		})
	}
}

func (t *Tracker) checkOne(ctx context.Context, src Source, uuid string) checked {
	h, err := src.CheckHealth(ctx, uuid)
	return checked{h, err}
}

// recover is operator action on one GPU ("" for all): each that NVML
// vouches for loses its marks; the others keep them, with NVML's answer.
func (t *Tracker) recover(ctx context.Context, src Source, uuid string) error {
	uuids := t.order
	if uuid != "" {
		uuids = []string{uuid}
	}
	var errs []error
	for _, u := range uuids {
		d, c := t.devs[u], t.checkOne(ctx, src, u)
		t.update(func() {
			d.check = c.verdict(d, true)
			c.keepECC(d)
			if d.check != "" {
				errs = append(errs, fmt.Errorf("GPU %s stays Unhealthy: %s", u, d.check))
				t.scheduleLocked(d)
				return
			}
			d.lost, d.xidAt = "", time.Time{}
			d.gen++
			if d.recheck != nil {
				d.recheck.Stop()
			}
		})
	}
	return errors.Join(errs...)
}
