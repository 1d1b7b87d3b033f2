package score

import "math"

// Calibration is one replica's engine timing as the router has measured it (router/load fits it
// from observed first-token times): the expected time to first token of a request routed there
// is
//
//	LatencyS + SecondsPerToken x (prefill tokens queued ahead + its own uncached tokens)
//	         + SecondsPerDecodeToken x context tokens (Candidate.ContextTokens)
//
// The zero value means "not measured": policies use DefaultCalibration.
type Calibration struct {
	LatencyS              float64
	SecondsPerToken       float64
	SecondsPerDecodeToken float64
	// DrainTokensPerS is the measured rate at which a replica's routed prefill reaches first
	// tokens while some is pending (router/load, Calibrations.ObserveDrain); 0 before any.
	DrainTokensPerS float64
	// DrainAttentionWeight is what one token pair of prefill attention (AttentionPairs) costs
	// in tokens at that rate, measured beside it; 0 when the first tokens seen do not tell it
	// apart from the per-token cost (prompts of one length) or before any.
	DrainAttentionWeight float64
	// Observations is the (decayed) weight of first-token times behind the fit; 0 when the
	// values are the prior.
	Observations float64
}

// DefaultCalibration is the prior a replica uses before anything is measured in the fleet: a
// vLLM engine's order of magnitude (10k prefill tokens/s, a 50 ms step and transfer, 0.1 ms of
// step time per 1k tokens of decode context). Only its
// proportions matter while every replica uses it; the first observations replace it.
var DefaultCalibration = Calibration{
	LatencyS:              0.05,
	SecondsPerToken:       1e-4,
	SecondsPerDecodeToken: 1e-7,
}

// Or is c, or d when c was never measured (zero).
func (c Calibration) Or(d Calibration) Calibration {
	if c.SecondsPerToken <= 0 {
		return d
	}
	return c
}

// TTFT is the expected time to first token at nowNs of a request whose own uncached prefill is
// uncached tokens on a replica with candidate c's load, under this calibration. The prefill
// ahead is the ledger's counter less what the replica drained since it last moved
// (PrefillAhead): the fit's feature is the same quantity (router/load records it at routing).
func (c Calibration) TTFT(cand *Candidate, uncached float64, nowNs int64) float64 {
	return c.LatencyS + c.SecondsPerToken*(PrefillAhead(cand, nowNs)+uncached) +
		c.SecondsPerDecodeToken*float64(cand.ContextTokens())
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
// The rate is the one measured from first tokens, not the TTFT fit's slope: vLLM's scheduler
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
