// Package degraded decides, from counters the router already keeps, why one replica's index
// cannot be fully trusted. It is pure: Evaluate reads one replica's samples inside the window
// and names the reasons; Tracker keeps the samples, the reasons in force and since when, on a
// clock it is given.
//
// Every reason fires on evidence, never on the mere passing of a window: a trigger is judged
// over the span that can hold its evidence (since the last applied batch, since the last
// received message, the last Recent seconds, or the whole Window), so a fault shows at the
// first sample after its evidence appears however healthy the replica was before. The one
// trigger that also waits is no-events for traffic too small for QuietRequests: one request
// that must have published, then QuietWindow of silence. Most reasons are reported only (routing goes on as before: a replica is
// never taken out of the index for a symptom that does not prove its keys wrong); keys-wrong
// also demotes the replica to approximate scoring, because it is evidence that its exact index
// entries are wrong.
package degraded

import (
	"fmt"
	"time"
)

// Window is how far back the triggers look: evidence older than this no longer counts, so a
// reason ends at most one Window after its last evidence.
const Window = 60 * time.Second

// Recent is the span over which the ratio triggers (unchained, keys-wrong) are also judged, so
// that a replica healthy a minute ago does not dilute a fault that began since.
const Recent = 15 * time.Second

// StalledReplaying is how long a stream may stay replaying without applying a batch before it
// is stalled. A whole ring of 10,000 batches replays in about 2 s and a replay's first reply
// times out after 5 s, so this is several failed attempts in a row.
const StalledReplaying = 20 * time.Second

// InexactFor is how long a stream may stay inexact before the replica is reported: an engine
// restart heals in about 2 s (replica cleared, new ring replayed from seq 0); a gap older than
// the ring, a replica cleared over its block limit or an engine down does not heal by itself.
const InexactFor = 20 * time.Second

// QuietRequests is how many requests of at least one full block the engine must serve with no
// event coming before no-events fires: the router's stale evidence (router/server marks the
// stream stale at the same count). vLLM publishes the blocks of a prefill within milliseconds;
// one request served wholly from the prefix cache publishes nothing, several in a row do not.
const QuietRequests = 3

// QuietWindow is how long the stream must stay silent (no message received, counted from the
// sample that saw the last one) after a single request that must have published before
// no-events fires on it: traffic too small for QuietRequests. vLLM publishes a prefill's
// BlockStored within milliseconds, so one such request followed by 45 s of silence is a
// publisher that stopped, not a late batch. 45 s, not the whole Window, so that the sample
// (at most 5 s after the last message), the report (1 s) and a reconcile put it on the
// KVRoutedModel within 60 s of the last event (test/e2e/indexhealth checks it).
const QuietWindow = 45 * time.Second

// Reason is one way a replica's index can go wrong.
type Reason string

const (
	// Undecodable: payloads failed to decode and no batch was applied since.
	Undecodable Reason = "undecodable"
	// Unchained: more stored events had a parent the replica does not hold than blocks were
	// indexed, over the window or the last Recent seconds (BlockStored events skipped: the
	// index misses their blocks).
	Unchained Reason = "unchained"
	// NoEvents: an event stream is configured, and the engine served QuietRequests requests of
	// at least a block with no event coming and no message received since; or (traffic too
	// small for that) it served one such request after the last applied batch and nothing
	// arrived for QuietWindow. Requests that stored no full block (shorter than a block, or
	// served wholly from the prefix cache) publish nothing and never count, so an idle replica
	// or one whose cache did not change is not no-events. Wrong endpoint, topic or model name;
	// publisher off.
	NoEvents Reason = "no-events"
	// Stalled: messages arrive but none is applied (and none failed to decode) since the last
	// applied batch, or the stream stayed replaying for StalledReplaying without applying one.
	Stalled Reason = "stalled"
	// TokenizerFailing: the engine's render/tokenize calls failed with a server error, a
	// connection error or 401/403 in the window (client 4xx never count).
	TokenizerFailing Reason = "tokenizer-failing"
	// Inexact: the stream stayed inexact for InexactFor (it lost events it cannot recover: a gap
	// older than the engine's ring, more blocks than the engine holds, the engine down); the
	// replica is scored approximately until the engine's cache is reset or it restarts. Not
	// reported while no-events explains it.
	Inexact Reason = "inexact"
	// HashMismatch: the parity check recomputed a block hash and the engine's differed (seed or
	// algorithm mismatch), or two replicas hashed the same block differently, in the window.
	HashMismatch Reason = "hash-mismatch"
	// MultimodalUnkeyed: multimodal requests were routed to it by load in the window (image
	// identities are not keyed).
	MultimodalUnkeyed Reason = "multimodal-unkeyed"
	// HybridGroupsSkipped: events of non-attention KV groups (sliding window, Mamba) were
	// skipped in the window; the index holds the full-attention group only.
	HybridGroupsSkipped Reason = "hybrid-groups-skipped"
	// Partial: the stream is approximate because the engine's ring had already dropped its
	// first batches when the router asked (a router started after the ring wrapped, with no peer
	// snapshot to start from): blocks stored before the ring's oldest batch are unknown until the
	// engine's cache is reset. A known limit of starting late, not a fault: informational.
	Partial Reason = "partial"
	// KeysWrong: re-keying failed for more stored events than blocks were indexed, or the
	// engines reported under DivergenceRatio of the cached tokens the exact index predicted
	// (MinDivergenceTokens at least), over the window or the last Recent seconds. The replica is
	// scored approximately.
	KeysWrong Reason = "keys-wrong"
)

// Reasons lists every reason, in the order reports show them.
var Reasons = []Reason{Undecodable, Unchained, NoEvents, Stalled, Inexact, TokenizerFailing, HashMismatch, KeysWrong,
	MultimodalUnkeyed, HybridGroupsSkipped, Partial}

// KeyCorrectness reports whether the reason means the replica's keys may be wrong (as opposed
// to missing, stale or informational). The operator raises Degraded for these.
func (r Reason) KeyCorrectness() bool {
	switch r {
	case Undecodable, Unchained, HashMismatch, KeysWrong:
		return true
	}
	return false
}

// Informational reports whether the reason is a known limit rather than a fault: it is shown
// but does not make the index unhealthy.
func (r Reason) Informational() bool {
	return r == MultimodalUnkeyed || r == HybridGroupsSkipped || r == Partial
}

// Thresholds below which a trigger does not fire.
const (
	// MinDivergenceTokens is the predicted exact-mode cached tokens a window needs before the
	// predicted-vs-actual comparison counts.
	MinDivergenceTokens = 1024
	// DivergenceRatio: actual below this share of predicted is divergence.
	DivergenceRatio = 0.5
)

// Sample is one replica's counters at one instant. Counters are cumulative; Evaluate works on
// their differences.
type Sample struct {
	At time.Time
	// Events: an event stream is configured for the replica.
	Events bool
	// State is the stream's state ("exact", "replaying", ...; "" without a stream).
	State string
	// Partial: the stream began after the engine's ring had dropped its first batches.
	Partial bool

	Received, Applied, DecodeErrors, Panics uint64
	// Dropped are received messages never meant to be applied: duplicates (replay overlap),
	// wrong topics, malformed frames.
	Dropped                                  uint64
	BlocksStored, UnknownParent, RekeyErrors uint64
	SkippedGroups, ParityMismatch            uint64

	// Routed: requests routed to the replica; MultimodalRouted: of those, multimodal ones routed
	// unkeyed.
	Routed, MultimodalRouted uint64
	// QuietRequests: requests of at least one full block the engine served in a row, each with
	// no event applied in the seconds before its answer (the router's stale evidence; it
	// restarts at 0 when a request finds events flowing).
	QuietRequests uint64
	// LastQuiet is when the engine last answered such a quiet request (zero: never), and
	// LastApplied when the stream last applied a batch (zero: never): a quiet request after the
	// last applied batch is still waiting for its events.
	LastQuiet, LastApplied time.Time
	// TokenizerFailures: server, connection or auth failures of render calls to the engine.
	TokenizerFailures uint64
	// ExactPredicted, ExactActual: cached tokens predicted and reported for exact-mode decisions
	// on the replica (answers with usage only).
	ExactPredicted, ExactActual uint64

	// PeerMismatch names a replica that hashed the same block differently ("" none), and
	// PeerMismatches counts such findings (cumulative).
	PeerMismatch   string
	PeerMismatches uint64
	// TokenizerError is the latest tokenizer failure, for the detail.
	TokenizerError string
}

// Finding is one reason in force with a human explanation.
type Finding struct {
	Reason Reason `json:"reason"`
	Detail string `json:"detail"`
}

// span is what changed between two samples of one replica.
type span struct {
	from, to Sample
}

// d is a counter's increase; a counter below its earlier value was restarted (a new stream or
// run) and counts from zero.
func d(a, b uint64) uint64 {
	if b < a {
		return b
	}
	return b - a
}

func (s span) dur() time.Duration { return s.to.At.Sub(s.from.At).Round(time.Second) }

// since returns the span from the last sample at which moved reports a change (hist[0] when
// none did) to the current sample: "since the last applied batch", "since the last message".
func since(hist []Sample, moved func(prev, cur Sample) bool) span {
	for i := len(hist) - 1; i > 0; i-- {
		if moved(hist[i-1], hist[i]) {
			return span{hist[i], hist[len(hist)-1]}
		}
	}
	return span{hist[0], hist[len(hist)-1]}
}

// recent is the span from the newest sample at least Recent older than the current one (the
// oldest sample when none is) to the current one.
func recent(hist []Sample) span {
	cur := hist[len(hist)-1]
	from := hist[0]
	for _, s := range hist {
		if cur.At.Sub(s.At) >= Recent {
			from = s
		}
	}
	return span{from, cur}
}

// Evaluate names the reasons one replica's samples show, and whether the replica must be
// demoted to approximate scoring. hist is the samples inside the window, oldest first (the
// newest one at least Window old, or the first one for a router younger than the window), the
// current one last; with fewer than two there is nothing to compare.
func Evaluate(hist []Sample) (out []Finding, demote bool) {
	if len(hist) < 2 {
		return nil, false
	}
	cur := hist[len(hist)-1]
	whole, rec := span{hist[0], cur}, recent(hist)
	sinceApplied := since(hist, func(p, c Sample) bool { return d(p.Applied, c.Applied) > 0 })
	sinceReceived := since(hist, func(p, c Sample) bool { return d(p.Received, c.Received) > 0 })
	add := func(r Reason, format string, args ...any) {
		out = append(out, Finding{Reason: r, Detail: fmt.Sprintf(format, args...)})
	}
	// ratio reports the first span (the whole window, then the recent one) over which the
	// counter part grew, and grew more than the counter of.
	ratio := func(part, of func(Sample) uint64) (span, uint64, uint64, bool) {
		for _, sp := range []span{whole, rec} {
			p, o := d(part(sp.from), part(sp.to)), d(of(sp.from), of(sp.to))
			if p > 0 && p > o {
				return sp, p, o, true
			}
		}
		return span{}, 0, 0, false
	}
	if cur.Events {
		sa := sinceApplied
		decodeErr, panics := d(sa.from.DecodeErrors, cur.DecodeErrors), d(sa.from.Panics, cur.Panics)
		if decodeErr > 0 {
			add(Undecodable, "%d event batches did not decode and none was applied in %s", decodeErr, sa.dur())
		}
		if sp, unknown, stored, ok := ratio(func(s Sample) uint64 { return s.UnknownParent }, func(s Sample) uint64 { return s.BlocksStored }); ok {
			add(Unchained, "%d stored events had an unknown parent against %d blocks indexed in %s", unknown, stored, sp.dur())
		}
		sr := sinceReceived
		switch quiet := d(sr.from.QuietRequests, cur.QuietRequests); {
		case quiet >= QuietRequests:
			add(NoEvents, "%d requests of at least a block served with no KV event coming, none received in %s", quiet, sr.dur())
		// Rounded to the second (span.dur): samples come from a ticker, 45 s apart give or take
		// a millisecond.
		case !cur.LastQuiet.IsZero() && cur.LastQuiet.After(cur.LastApplied) && sr.dur() >= QuietWindow:
			add(NoEvents, "a request of at least a block served with no KV event coming, none received in %s", sr.dur())
		default:
			if run := stateRun(hist, "inexact", time.Time{}); run >= InexactFor {
				add(Inexact, "stream inexact for %s: events were lost that the engine's ring cannot replay (scored approximately until its cache is reset or it restarts)", run.Round(time.Second))
			}
		}
		received := d(sa.from.Received, cur.Received)
		switch {
		// At least two messages: one received an instant before the sample is still on its way
		// to the worker (a quiet stream's first batch after a silent pause), not a stall.
		case received > d(sa.from.Dropped, cur.Dropped)+1 && decodeErr == 0 && panics == 0:
			add(Stalled, "%d messages received and none applied in %s", received, sa.dur())
		default:
			if run := stateRun(hist, "replaying", sa.from.At); run >= StalledReplaying {
				add(Stalled, "replaying for %s without applying a batch", run.Round(time.Second))
			}
		}
	}
	if n := d(hist[0].TokenizerFailures, cur.TokenizerFailures); n > 0 {
		add(TokenizerFailing, "%d render calls failed in %s (last: %s)", n, whole.dur(), cur.TokenizerError)
	}
	pm, peer := d(hist[0].ParityMismatch, cur.ParityMismatch), d(hist[0].PeerMismatches, cur.PeerMismatches)
	switch {
	case pm > 0 && peer > 0:
		add(HashMismatch, "%d recomputed block hashes differed from the engine's in %s (hash seed or algorithm); block hashes also differ from replica %s", pm, whole.dur(), cur.PeerMismatch)
	case pm > 0:
		add(HashMismatch, "%d recomputed block hashes differed from the engine's in %s (hash seed or algorithm)", pm, whole.dur())
	case peer > 0:
		add(HashMismatch, "the same block hashed differently on replica %s (%d times in %s)", cur.PeerMismatch, peer, whole.dur())
	}
	if sp, rekey, stored, ok := ratio(func(s Sample) uint64 { return s.RekeyErrors }, func(s Sample) uint64 { return s.BlocksStored }); ok {
		add(KeysWrong, "%d stored events could not be re-keyed against %d blocks indexed in %s", rekey, stored, sp.dur())
		demote = true
	} else {
		for _, sp := range []span{whole, rec} {
			pred, act := d(sp.from.ExactPredicted, cur.ExactPredicted), d(sp.from.ExactActual, cur.ExactActual)
			if pred >= MinDivergenceTokens && float64(act) < DivergenceRatio*float64(pred) {
				add(KeysWrong, "exact index predicted %d cached tokens, the engine reported %d in %s", pred, act, sp.dur())
				demote = true
				break
			}
		}
	}
	if n := d(hist[0].MultimodalRouted, cur.MultimodalRouted); n > 0 {
		add(MultimodalUnkeyed, "%d multimodal requests routed here by load, without keys, in %s", n, whole.dur())
	}
	if cur.Events && cur.Partial && cur.State == "approximate" {
		add(Partial, "the engine's ring had dropped its first batches when the router asked: blocks stored before them are unknown (scored approximately until the engine's cache is reset)")
	}
	if n := d(hist[0].SkippedGroups, cur.SkippedGroups); n > 0 {
		add(HybridGroupsSkipped, "%d events of non-attention KV groups skipped in %s", n, whole.dur())
	}
	return out, demote
}

// stateRun is how long the stream has been in state without interruption, counted from the
// first sample of the current run of such samples taken at or after notBefore: zero when the
// current sample is in another state.
func stateRun(hist []Sample, state string, notBefore time.Time) time.Duration {
	cur := hist[len(hist)-1]
	start := time.Time{}
	for i := len(hist) - 1; i >= 0 && hist[i].State == state && !hist[i].At.Before(notBefore); i-- {
		start = hist[i].At
	}
	if start.IsZero() {
		return 0
	}
	return cur.At.Sub(start)
}
