package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Health is one engine's health: passive (consecutive forward failures, or one refused
// connection, take it out for a backoff that doubles up to a cap, and then until an active probe
// started after the failure has succeeded, so passive health never puts an engine back ahead of
// the probe) and active (the result of the last /health probe). Safe for concurrent use.
type Health struct {
	// Threshold consecutive failures make the engine unhealthy (3); Backoff is the first pause
	// (1s), doubling to MaxBackoff (30s).
	Threshold  int
	Backoff    time.Duration
	MaxBackoff time.Duration

	mu        sync.Mutex
	fails     int
	downUntil time.Time
	backoff   time.Duration
	probeOK   bool
	probed    bool
	lastErr   string
	// downAt is when passive health last took the engine out; zero once a probe that started
	// after it succeeded (or a forward succeeded).
	downAt time.Time
}

// HealthState is a snapshot for debug output.
type HealthState struct {
	Healthy     bool      `json:"healthy"`
	Failures    int       `json:"consecutive_failures"`
	DownUntil   time.Time `json:"down_until,omitzero"`
	ProbeOK     bool      `json:"probe_ok"`
	Probed      bool      `json:"probed"`
	LastProblem string    `json:"last_problem,omitempty"`
}

func (h *Health) defaults() {
	if h.Threshold <= 0 {
		h.Threshold = 3
	}
	if h.Backoff <= 0 {
		h.Backoff = time.Second
	}
	if h.MaxBackoff <= 0 {
		h.MaxBackoff = 30 * time.Second
	}
}

// Success records a forward that reached the engine.
func (h *Health) Success() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fails, h.backoff, h.downUntil, h.downAt = 0, 0, time.Time{}, time.Time{}
}

// Unreachable records a forward whose connection was refused or could not be made: the whole
// engine is taken out at once, as if the threshold had been reached.
func (h *Health) Unreachable(now time.Time, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.defaults()
	h.lastErr = why
	h.trip(now)
}

func (h *Health) trip(now time.Time) {
	if h.backoff == 0 {
		h.backoff = h.Backoff
	} else {
		h.backoff = min(2*h.backoff, h.MaxBackoff)
	}
	h.downUntil = now.Add(h.backoff)
	h.downAt = now
	h.fails = 0
}

// Failure records a forward that failed before any answer (connect error, 5xx).
func (h *Health) Failure(now time.Time, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.defaults()
	h.fails++
	h.lastErr = why
	if h.fails >= h.Threshold {
		h.trip(now)
	}
}

// Probed records an active probe's result (see ProbedAt); the probe counts as started now.
func (h *Health) Probed(err error) { h.ProbedAt(time.Now(), err) }

// ProbedAt records the result of an active probe that started at start. A failed probe takes
// the engine out until a probe succeeds; a success lets a passively failed engine back once its
// backoff is over, if the probe started after the failure (an older probe says nothing about it).
func (h *Health) ProbedAt(start time.Time, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.probed = true
	h.probeOK = err == nil
	if err != nil {
		h.lastErr = err.Error()
	} else if !h.downAt.IsZero() && !start.Before(h.downAt) {
		h.downAt = time.Time{}
	}
}

// Healthy reports whether the engine may take traffic at now. An engine never probed counts
// as up (the first probe runs as soon as it is known).
func (h *Health) Healthy(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return (!h.probed || h.probeOK) && !now.Before(h.downUntil) && h.downAt.IsZero()
}

// State is a snapshot.
func (h *Health) State(now time.Time) HealthState {
	h.mu.Lock()
	s := HealthState{Failures: h.fails, DownUntil: h.downUntil, ProbeOK: h.probeOK, Probed: h.probed, LastProblem: h.lastErr}
	h.mu.Unlock()
	s.Healthy = h.Healthy(now)
	return s
}

// Probe asks engineURL's GET /health, bounded by timeout.
func Probe(ctx context.Context, client *http.Client, engineURL string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, engineURL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &StatusError{Path: "/health", Status: resp.StatusCode}
	}
	return nil
}

// StatusError is an engine answering a router call (probe, model discovery) with an
// unexpected status; IsAuthStatus(Status) tells a credential problem from the rest.
type StatusError struct {
	Path   string
	Status int
}

func (e *StatusError) Error() string { return fmt.Sprintf("%s answered %d", e.Path, e.Status) }
