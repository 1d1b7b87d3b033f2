package score

import "math"

// Calibration is the engines' prefill drain as the router has measured it (router/load fits it
// from observed first tokens; PrefillAhead reads it). The zero value means "not measured": the
// prefill ahead is then the ledger's counter.
type Calibration struct {
	// DrainTokensPerS is the measured rate at which a replica's routed prefill reaches first
	// tokens while some is pending (router/load, Calibrations.ObserveDrain); 0 before any.
	DrainTokensPerS float64
	// DrainAttentionWeight is what one token pair of prefill attention (AttentionPairs) costs
	// in tokens at that rate, measured beside it; 0 when the first tokens seen do not tell it
	// apart from the per-token cost (prompts of one length) or before any.
	DrainAttentionWeight float64
}

// AttentionPairs is the attention a prefill of uncached tokens after cached ones computes, in
// token pairs: each new token attends over the context before it, Σ over positions p in
// [cached, cached+uncached) of p, about uncached x (cached + uncached/2). vLLM's forward pass
// pays for it on top of the per-token cost (sim/vllmsim/stepmodel.go, PerMAttn against PerToken,
// from vLLM 0.20.1's records: at about 36k tokens of context a token's attention costs as much
// as the rest of its prefill), so the drain credit weighs it (PrefillAhead).
func AttentionPairs(uncached, cached int) int64 {
	if uncached <= 0 {
		return 0
	}
	u, c := int64(uncached), int64(max(cached, 0))
	return u*c + u*(u-1)/2
}

// PrefillAhead is the routed prefill still ahead of a request sent to c at nowNs, in tokens at
// the drain rate: the ledger's counter plus what its attention costs (PrefillAttention x
// Calib.DrainAttentionWeight: a long prompt is more work than its token count says), less what
// the replica has drained since its prefill last moved (c.PrefillSince: its last first token,
// or the counter leaving zero) at the measured drain rate
// (Calib.DrainTokensPerS), never below zero. The counter drops only at first tokens, so without
// this a replica about to finish a long prefill looks as busy as one that just began it, and
// among equal counters least-queued-prefill picks by the decode term, which says nothing about
// when each replica's pending prefill ends (round-robin's turn order does).
//
// The rate is the one measured from first tokens: vLLM's scheduler
// (vllm/v1/core/sched/scheduler.py, Scheduler.schedule) serves the running requests first in
// every step (a decode token each, or a partial prefill's next chunk) and then waiting requests
// FCFS while the step's token budget (max_num_batched_tokens) lasts, so pending prefill drains at
// the budget the decodes leave, per step time, oldest first. The ledger measures that drain
// directly: uncached tokens that reached their first token over the time the replica had prefill
// pending (router/load, Calibrations.ObserveDrain). Before any first token the rate is 0 and this
// is the counter.
//
// With several routers PrefillTokens includes the peers' part (their shared totals), and
// PrefillSince is the replica's last progress that any of them saw (load.Ledger.PeerProgress):
// vLLM drains the replica's waiting prefill in one FCFS order whoever routed it, so the whole
// counter is credited.
func PrefillAhead(c *Candidate, nowNs int64) float64 {
	ahead := float64(c.PrefillTokens) + c.Calib.DrainAttentionWeight*float64(c.PrefillAttention)
	rate := c.Calib.DrainTokensPerS
	if ahead <= 0 || rate <= 0 || c.PrefillSince <= 0 || nowNs <= c.PrefillSince {
		return math.Max(ahead, 0)
	}
	return math.Max(ahead-float64(nowNs-c.PrefillSince)/1e9*rate, 0)
}
