package admission

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func count(h *Hold, outcome string) float64 {
	return testutil.ToFloat64(h.total.WithLabelValues(outcome))
}

// Held requests are let go in arrival order when a replica is ready, each counted.
func TestReleaseInArrivalOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := New(Options{MaxWaiting: 8, MaxWait: time.Minute}, "m")
		var wg sync.WaitGroup
		var arrived []*waiter
		for i := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := h.Wait(context.Background(), time.Now()); err != nil {
					t.Errorf("waiter %d: %v", i, err)
				}
			}()
			synctest.Wait() // waiter i is queued before i+1 arrives
			arrived = append(arrived, h.q[len(h.q)-1])
		}
		// The queue is in arrival order, and Release closes it front to back.
		for i, w := range h.q {
			if w != arrived[i] {
				t.Fatalf("queue position %d holds another arrival", i)
			}
		}
		if h.Waiting() != 5 || testutil.ToFloat64(h.waiting) != 5 {
			t.Fatalf("waiting %d, gauge %v; want 5", h.Waiting(), testutil.ToFloat64(h.waiting))
		}
		var ready atomic.Bool
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go h.Run(ctx, ready.Load, 100*time.Millisecond)
		time.Sleep(time.Second) // virtual: nothing ready, nothing released
		synctest.Wait()
		if h.Waiting() != 5 {
			t.Fatalf("released with no replica ready: %d wait", h.Waiting())
		}
		ready.Store(true)
		time.Sleep(150 * time.Millisecond)
		wg.Wait()
		if h.Waiting() != 0 || count(h, OutcomeHeld) != 5 || count(h, OutcomeReleased) != 5 || testutil.ToFloat64(h.waiting) != 0 {
			t.Fatalf("after release: waiting %d held %v released %v", h.Waiting(), count(h, OutcomeHeld), count(h, OutcomeReleased))
		}
	})
}

// The queue is bounded (full: refused at once), the wait too (expired past MaxWait from the
// first time the request found no replica), a client leaving is counted, and holding off refuses.
func TestBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := New(Options{MaxWaiting: 2, MaxWait: 30 * time.Second}, "m")
		start := time.Now()
		errs := make(chan error, 2)
		ctx, cancel := context.WithCancel(context.Background())
		go func() { errs <- h.Wait(context.Background(), start) }()
		go func() { errs <- h.Wait(ctx, start) }()
		synctest.Wait()
		if err := h.Wait(context.Background(), start); !errors.Is(err, ErrFull) || count(h, OutcomeFull) != 1 {
			t.Fatalf("third waiter with 2 max: %v", err)
		}
		cancel()
		if err := <-errs; !errors.Is(err, context.Canceled) || count(h, OutcomeCanceled) != 1 {
			t.Fatalf("client left: %v", err)
		}
		if err := <-errs; !errors.Is(err, ErrExpired) || time.Since(start) != 30*time.Second || count(h, OutcomeExpired) != 1 {
			t.Fatalf("after %v: %v", time.Since(start), err)
		}
		// Held again after a release that found no replica: the first bound holds.
		if err := h.Wait(context.Background(), start); !errors.Is(err, ErrExpired) {
			t.Fatalf("past its bound: %v", err)
		}
		if h.Waiting() != 0 {
			t.Fatalf("%d still wait", h.Waiting())
		}
		off := New(Options{}, "m")
		if err := off.Wait(context.Background(), time.Now()); !errors.Is(err, ErrOff) || count(off, OutcomeHeld) != 0 {
			t.Fatalf("hold off: %v", err)
		}
	})
}
