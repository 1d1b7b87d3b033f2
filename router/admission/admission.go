// Package admission holds generation requests while their model has no ready replica (a model
// scaled to zero, or every replica restarting), in a bounded FIFO with a bounded wait, and
// lets them go in arrival order once one is ready. What it holds is the demand an autoscaler
// reads to bring the model up (Waiting, the kvroute_router_held_requests gauge). Past the
// wait, or with the queue full, the caller answers 503 with Retry-After.
package admission

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Options bound the hold.
type Options struct {
	// MaxWaiting is how many requests may wait at once; 0 holds none (Wait refuses at once).
	MaxWaiting int
	// MaxWait is how long one request may wait for a ready replica.
	MaxWait time.Duration
}

// The ways a held request can end other than being released.
var (
	// ErrOff: holding is switched off (MaxWaiting 0).
	ErrOff = errors.New("admission: holding is off")
	// ErrFull: MaxWaiting requests wait already.
	ErrFull = errors.New("admission: the hold queue is full")
	// ErrExpired: no replica became ready within MaxWait.
	ErrExpired = errors.New("admission: no replica became ready within the wait")
)

// Outcomes name what happened to held requests on /metrics (kvroute_router_hold_requests_total).
const (
	OutcomeHeld     = "held"     // entered the queue
	OutcomeReleased = "released" // let go to be routed: a replica became ready
	OutcomeExpired  = "expired"  // waited MaxWait
	OutcomeFull     = "full"     // refused: the queue was full
	OutcomeCanceled = "canceled" // the client left while it waited
)

// Hold is the queue. Safe for concurrent use.
type Hold struct {
	o  Options
	mu sync.Mutex
	// q is the waiters in arrival order; a waiter leaves it when released, expired or canceled.
	q []*waiter

	waiting prometheus.Gauge
	total   *prometheus.CounterVec
	// counts mirror total for Stats, by outcome.
	counts map[string]*atomic.Uint64
}

// outcomes are every outcome, in the order Stats and /metrics list them.
var outcomes = []string{OutcomeHeld, OutcomeReleased, OutcomeExpired, OutcomeFull, OutcomeCanceled}

// count adds n requests to outcome o.
func (h *Hold) count(o string, n int) {
	h.total.WithLabelValues(o).Add(float64(n))
	h.counts[o].Add(uint64(n))
}

type waiter struct {
	release chan struct{}
}

// New returns an empty hold; model labels its metrics.
func New(o Options, model string) *Hold {
	h := &Hold{o: o,
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute_router", Name: "held_requests",
			Help:        "Generation requests held now because the model has no ready replica: the demand that brings a model at zero replicas up.",
			ConstLabels: prometheus.Labels{"model_name": model}}),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "hold_requests_total",
			Help:        "Generation requests through the hold, by outcome: held (entered), released (a replica became ready), expired (answered 503 past the wait), full (answered 503 at once: the queue was full), canceled (the client left).",
			ConstLabels: prometheus.Labels{"model_name": model}}, []string{"outcome"}),
	}
	h.counts = map[string]*atomic.Uint64{}
	for _, o := range outcomes {
		h.total.WithLabelValues(o) // present at 0, so rate() works from the start
		h.counts[o] = new(atomic.Uint64)
	}
	return h
}

// Options are the hold's bounds.
func (h *Hold) Options() Options { return h.o }

// Collectors are the hold's metrics.
func (h *Hold) Collectors() []prometheus.Collector {
	return []prometheus.Collector{h.waiting, h.total}
}

// Stats is the hold as /debug/engines shows it.
type Stats struct {
	Waiting    int     `json:"waiting"`
	MaxWaiting int     `json:"max_waiting"`
	MaxWaitSec float64 `json:"max_wait_seconds"`
	// Outcomes are the requests through the hold so far, by outcome (as on /metrics).
	Outcomes map[string]uint64 `json:"outcomes"`
}

// Stats reads the hold.
func (h *Hold) Stats() Stats {
	st := Stats{Waiting: h.Waiting(), MaxWaiting: h.o.MaxWaiting, MaxWaitSec: h.o.MaxWait.Seconds(), Outcomes: map[string]uint64{}}
	for _, o := range outcomes {
		st.Outcomes[o] = h.counts[o].Load()
	}
	return st
}

// Waiting is how many requests wait now.
func (h *Hold) Waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.q)
}

// Wait holds the caller until Release lets it go (nil: route it again), MaxWait after since
// passes (ErrExpired), ctx ends (its error), or refuses it at once (ErrOff, ErrFull). since is
// when the request first found no replica: one released and held again keeps its first bound.
func (h *Hold) Wait(ctx context.Context, since time.Time) error {
	if h.o.MaxWaiting <= 0 {
		return ErrOff
	}
	left := time.Until(since.Add(h.o.MaxWait))
	if left <= 0 {
		h.count(OutcomeExpired, 1)
		return ErrExpired
	}
	h.mu.Lock()
	if len(h.q) >= h.o.MaxWaiting {
		h.mu.Unlock()
		h.count(OutcomeFull, 1)
		return ErrFull
	}
	w := &waiter{release: make(chan struct{})}
	h.q = append(h.q, w)
	h.waiting.Set(float64(len(h.q)))
	h.mu.Unlock()
	h.count(OutcomeHeld, 1)

	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-w.release:
		return nil
	case <-t.C:
		if !h.leave(w) {
			return nil // released as the wait ended: route it
		}
		h.count(OutcomeExpired, 1)
		return ErrExpired
	case <-ctx.Done():
		if !h.leave(w) {
			return nil
		}
		h.count(OutcomeCanceled, 1)
		return ctx.Err()
	}
}

// leave takes w out of the queue; false when Release took it first.
func (h *Hold) leave(w *waiter) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, x := range h.q {
		if x == w {
			h.q = append(h.q[:i], h.q[i+1:]...)
			h.waiting.Set(float64(len(h.q)))
			return true
		}
	}
	return false
}

// Release lets every waiting request go, in arrival order, and returns how many.
func (h *Hold) Release() int {
	h.mu.Lock()
	q := h.q
	h.q = nil
	h.waiting.Set(0)
	h.mu.Unlock()
	for _, w := range q {
		close(w.release)
	}
	h.count(OutcomeReleased, len(q))
	return len(q)
}

// Run releases the waiting requests once ready says a replica can take them, looking every
// interval while some wait, until ctx ends. A released request that finds no candidate after
// all (the replica went again) waits anew, within its own bound.
func (h *Hold) Run(ctx context.Context, ready func() bool, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if h.Waiting() > 0 && ready() {
				h.Release()
			}
		}
	}
}
