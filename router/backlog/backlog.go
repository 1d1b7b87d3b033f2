// Package backlog turns the router's picture of the fleet into the signal an autoscaler reads:
// the prefill work queued on each replica in seconds, and the share of the fleet's measured
// prefill capacity that the routed traffic uses. Both come from the quantities the kv policy
// decides on (the ledger's pending prefill, its drain credit and its measured drain rate,
// score.PrefillAhead), so what scales the fleet is what routes it. With several routers the
// inputs are the shared totals (each router's own load plus its peers'), so every router
// reports the fleet's figure, not its share: an autoscaler takes the max over router pods,
// never the sum.
package backlog

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/route"
	"github.com/kvroute/kvroute/router/score"
)

// Replica is one replica's inputs at one moment.
type Replica struct {
	Name string
	// Ready: routable now (discovered ready and healthy); only ready replicas are capacity.
	Ready bool
	// PrefillTokens is the uncached prompt tokens routed there whose first token has not
	// come, this router's and its peers' (score.Candidate.PrefillTokens).
	PrefillTokens int64
	// PrefillAttention is the attention of this router's part of it, in token pairs.
	PrefillAttention int64
	// PrefillSince is when the replica's prefill last made progress (unix ns; 0: unknown).
	PrefillSince int64
	// WindowTokens is the uncached prefill routed there over the last WindowSeconds (peers'
	// included: the ledger's balance window).
	WindowTokens float64
}

// ReplicaBacklog is one replica's figures.
type ReplicaBacklog struct {
	Name  string `json:"replica"`
	Ready bool   `json:"ready"`
	// PendingTokens is the prefill still ahead after the drain credit (score.PrefillAhead).
	PendingTokens float64 `json:"pending_prefill_tokens"`
	// Seconds is PendingTokens over the drain rate; 0 while the rate is not measured.
	Seconds float64 `json:"backlog_seconds"`
}

// Fleet is the model's figures.
type Fleet struct {
	// Measured: the drain rate is known (some first token has come). Until then the seconds
	// and the utilisation are unknown, and an exporter leaves them out so that an autoscaler
	// falls back to another signal instead of reading a false zero.
	Measured        bool    `json:"measured"`
	DrainTokensPerS float64 `json:"drain_tokens_per_second"`
	Ready           int     `json:"ready_replicas"`
	// PendingTokens and Seconds are the replicas' sums.
	PendingTokens float64 `json:"pending_prefill_tokens"`
	Seconds       float64 `json:"backlog_seconds"`
	// Utilisation is the uncached prefill routed per second over the window against what the
	// ready replicas drain per second (routed rate / (drain rate x ready)): 1 is a fleet that
	// keeps up exactly, above 1 one whose backlog grows.
	Utilisation float64          `json:"utilisation"`
	Replicas    []ReplicaBacklog `json:"replicas"`
}

// Compute is the fleet's backlog at nowNs. cal is the ledger's drain fit; windowSeconds the
// span WindowTokens covers (the ledger's balance window). It changes nothing.
func Compute(reps []Replica, cal score.Calibration, windowSeconds float64, nowNs int64) Fleet {
	f := Fleet{DrainTokensPerS: cal.DrainTokensPerS, Measured: cal.DrainTokensPerS > 0,
		Replicas: make([]ReplicaBacklog, 0, len(reps))}
	var routed float64
	for i := range reps {
		r := &reps[i]
		c := score.Candidate{PrefillTokens: int(r.PrefillTokens), PrefillAttention: r.PrefillAttention,
			PrefillSince: r.PrefillSince, Calib: cal}
		rb := ReplicaBacklog{Name: r.Name, Ready: r.Ready, PendingTokens: score.PrefillAhead(&c, nowNs)}
		if f.Measured {
			rb.Seconds = rb.PendingTokens / cal.DrainTokensPerS
		}
		if r.Ready {
			f.Ready++
		}
		f.PendingTokens += rb.PendingTokens
		f.Seconds += rb.Seconds
		routed += math.Max(r.WindowTokens, 0)
		f.Replicas = append(f.Replicas, rb)
	}
	if f.Measured && windowSeconds > 0 {
		// With no ready replica there is no capacity to divide by: the utilisation stays 0 and
		// the demand the router holds (router/admission) is the signal instead.
		if capacity := cal.DrainTokensPerS * float64(f.Ready); capacity > 0 {
			f.Utilisation = routed / windowSeconds / capacity
		}
	}
	return f
}

// Ledger is where the inputs are read: router/load's request ledger, in kvrouter and in the
// fleet model (sim/fleet) alike, so that what the model scales on is what the router exports.
type Ledger interface {
	Load(id index.ReplicaID) route.ReplicaLoad
	Window(name string, nowNs int64) score.Window
	WindowSpan() time.Duration
	Calibration(name string) score.Calibration
}

// Member is one replica as the caller knows it: its ledger slot, whether it is ready, and
// what the other routers have pending there (their shared totals; 0 alone).
type Member struct {
	ID          index.ReplicaID
	Name        string
	Ready       bool
	PeerPrefill int64
}

// FromLedger is the fleet's backlog at now from the ledger's figures; up is how long the
// ledger has been counting (the balance windows cover no more than that).
func FromLedger(l Ledger, ms []Member, up time.Duration, now time.Time) Fleet {
	nowNs := now.UnixNano()
	in := make([]Replica, len(ms))
	for i, m := range ms {
		ld := l.Load(m.ID)
		in[i] = Replica{Name: m.Name, Ready: m.Ready, PrefillTokens: ld.PrefillTokens + m.PeerPrefill,
			PrefillAttention: ld.PrefillAttention, PrefillSince: ld.PrefillSince, WindowTokens: l.Window(m.Name, nowNs).Tokens}
	}
	span := min(l.WindowSpan(), up)
	return Compute(in, l.Calibration(""), span.Seconds(), nowNs)
}
