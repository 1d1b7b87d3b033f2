// Package degraded decides, from counters the router already keeps, why one replica's index
// cannot be fully trusted. It is pure: Evaluate compares two samples of one replica's counters
// (the oldest one inside the window and the current one) and names the reasons; Tracker keeps
// the samples, the reasons in force and since when, on a clock it is given.
//
// Every reason has a trigger over a sliding window (Window, 60 s) and says what kvroute does:
// most are reported only (routing goes on as before: a replica is never taken out of the index
// for a symptom that does not prove its keys wrong); keys-wrong also demotes the replica to
// approximate scoring, because it is evidence that its exact index entries are wrong.
package degraded

import (
	"fmt"
	"time"
)

// Window is how far back the triggers look.
const Window = 60 * time.Second

// Reason is one way a replica's index can go wrong.
type Reason string

const (
	// Undecodable: payloads failed to decode and no batch was applied in the window.
	Undecodable Reason = "undecodable"
	// Unchained: more than half of the stored blocks in the window had a parent the replica
	// does not hold (BlockStored events skipped: the index misses their blocks).
	Unchained Reason = "unchained"
	// NoEvents: an event stream is configured but nothing arrived for a whole window while
	// requests were routed to the replica (wrong endpoint, topic or model name; publisher off).
	NoEvents Reason = "no-events"
	// Stalled: messages arrive but none is applied (and none failed to decode), or the stream
	// stayed replaying for the whole window.
	Stalled Reason = "stalled"
	// TokenizerFailing: the engine's render/tokenize calls failed with a server error, a
	// connection error or 401/403 in the window (client 4xx never count).
	TokenizerFailing Reason = "tokenizer-failing"
	// HashMismatch: the parity check recomputed a block hash and the engine's differed (seed or
	// algorithm mismatch), or two replicas hashed the same block differently.
	HashMismatch Reason = "hash-mismatch"
	// MultimodalUnkeyed: multimodal requests were routed to it by load (image identities are
	// not keyed).
	MultimodalUnkeyed Reason = "multimodal-unkeyed"
	// HybridGroupsSkipped: events of non-attention KV groups (sliding window, Mamba) were
	// skipped; the index holds the full-attention group only.
	HybridGroupsSkipped Reason = "hybrid-groups-skipped"
	// KeysWrong: re-keying failed for most stored blocks, or the engines reported far fewer
	// cached tokens than the exact index predicted. The replica is scored approximately.
	KeysWrong Reason = "keys-wrong"
)

// Reasons lists every reason, in the order reports show them.
var Reasons = []Reason{Undecodable, Unchained, NoEvents, Stalled, TokenizerFailing, HashMismatch, KeysWrong,
	MultimodalUnkeyed, HybridGroupsSkipped}

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
func (r Reason) Informational() bool { return r == MultimodalUnkeyed || r == HybridGroupsSkipped }

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

	Received, Applied, DecodeErrors, Panics uint64
	// Dropped are received messages never meant to be applied: duplicates (replay overlap),
	// wrong topics, malformed frames.
	Dropped                                  uint64
	BlocksStored, UnknownParent, RekeyErrors uint64
	SkippedGroups, ParityMismatch            uint64

	// Routed: requests routed to the replica; MultimodalRouted: of those, multimodal ones routed
	// unkeyed.
	Routed, MultimodalRouted uint64
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

// Evaluate names the reasons the counters between prev and cur show, and whether the replica
// must be demoted to approximate scoring. prev is the oldest sample inside the window (or the
// first one, for a router younger than the window); triggers that need a silent whole window
// (no-events, replaying throughout) fire only when cur - prev spans it.
func Evaluate(prev, cur Sample) (out []Finding, demote bool) {
	d := func(a, b uint64) uint64 {
		if b < a { // the stream was replaced: counters restarted
			return b
		}
		return b - a
	}
	full := cur.At.Sub(prev.At) >= Window
	span := cur.At.Sub(prev.At).Round(time.Second)
	received, applied := d(prev.Received, cur.Received), d(prev.Applied, cur.Applied)
	decodeErr, panics := d(prev.DecodeErrors, cur.DecodeErrors), d(prev.Panics, cur.Panics)
	stored, unknownParent := d(prev.BlocksStored, cur.BlocksStored), d(prev.UnknownParent, cur.UnknownParent)
	rekey := d(prev.RekeyErrors, cur.RekeyErrors)
	add := func(r Reason, format string, args ...any) {
		out = append(out, Finding{Reason: r, Detail: fmt.Sprintf(format, args...)})
	}
	if cur.Events {
		if decodeErr > 0 && applied == 0 {
			add(Undecodable, "%d event batches did not decode and none was applied in %s", decodeErr, span)
		}
		if unknownParent > 0 && unknownParent > stored {
			add(Unchained, "%d stored events had an unknown parent against %d blocks indexed in %s", unknownParent, stored, span)
		}
		if full && received == 0 && d(prev.Routed, cur.Routed) > 0 {
			add(NoEvents, "no event in %s while %d requests were routed here", span, d(prev.Routed, cur.Routed))
		}
		switch {
		// At least two messages: one received an instant before the sample is still on its way
		// to the worker (a quiet stream's first batch after a silent window), not a stall.
		case received > d(prev.Dropped, cur.Dropped)+1 && applied == 0 && decodeErr == 0 && panics == 0:
			add(Stalled, "%d messages received and none applied in %s", received, span)
		case full && prev.State == "replaying" && cur.State == "replaying" && applied == 0:
			add(Stalled, "replaying for %s without applying a batch", span)
		}
	}
	if n := d(prev.TokenizerFailures, cur.TokenizerFailures); n > 0 {
		add(TokenizerFailing, "%d render calls failed in %s (last: %s)", n, span, cur.TokenizerError)
	}
	pm, peer := d(prev.ParityMismatch, cur.ParityMismatch), d(prev.PeerMismatches, cur.PeerMismatches)
	switch {
	case pm > 0 && peer > 0:
		add(HashMismatch, "%d recomputed block hashes differed from the engine's in %s (hash seed or algorithm); block hashes also differ from replica %s", pm, span, cur.PeerMismatch)
	case pm > 0:
		add(HashMismatch, "%d recomputed block hashes differed from the engine's in %s (hash seed or algorithm)", pm, span)
	case peer > 0:
		add(HashMismatch, "the same block hashed differently on replica %s (%d times in %s)", cur.PeerMismatch, peer, span)
	}
	pred, act := d(prev.ExactPredicted, cur.ExactPredicted), d(prev.ExactActual, cur.ExactActual)
	switch {
	case rekey > 0 && rekey > stored:
		add(KeysWrong, "%d stored events could not be re-keyed against %d blocks indexed in %s", rekey, stored, span)
		demote = true
	case pred >= MinDivergenceTokens && float64(act) < DivergenceRatio*float64(pred):
		add(KeysWrong, "exact index predicted %d cached tokens, the engine reported %d in %s", pred, act, span)
		demote = true
	}
	if n := d(prev.MultimodalRouted, cur.MultimodalRouted); n > 0 {
		add(MultimodalUnkeyed, "%d multimodal requests routed here by load, without keys, in %s", n, span)
	}
	if n := d(prev.SkippedGroups, cur.SkippedGroups); n > 0 {
		add(HybridGroupsSkipped, "%d events of non-attention KV groups skipped in %s", n, span)
	}
	return out, demote
}
