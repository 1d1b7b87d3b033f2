package policies

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/router/score"
)

// ttftPolicy is `kv-ttft`, a benchmark policy: kv's cost (router/score, kv.go) read in seconds with the miss
// price derived from queueing instead of kv's fixed weight, the engine's timing fitted online, and
// no balance constraints. docs/router.md, "The kv-ttft objective", derives it and says what keeps
// it from being `kv`. It places a request where the fleet expects it to cost the least time:
//
//	cost_i = TTFT_i + miss_i
//	TTFT_i = L + B_i + s·u_i                        this request's time to first token
//	B_i    = s·P_i + c·D_i                          the time ahead of it
//	miss_i = λ_i·Δ_i·(B_i + Δ_i/2) / (1 − ρ_i)      what its avoidable prefill delays later ones
//	Δ_i    = s·(u_i − u_min)
//
// u_i: the request's prompt tokens replica i's cache does not cover (tier-weighted exact overlap
// or the predicted side index, whichever is longer, less the warm-up credit as virtual overlap);
// u_min the least over the healthy replicas. P_i: uncached prefill routed there whose first
// token has not come; D_i: the context its steps carry, decoding sequences and those still in
// prefill (score.Candidate.ContextTokens). L, s, c: the engines' timing (TTFTFit, fitted online
// from the first tokens the ledger tells it of; DefaultTiming before any). λ_i and ρ_i: requests
// per second and prefill utilisation (λ x mean work) over the ledger's window
// (score.Candidate.Window), ρ capped at rhoMax. The only guard is health.
type ttftPolicy struct {
	// TTFTFit is the policy's timing; being a load.Observer, the ledger that serialises the
	// policy tells it of every first token.
	*TTFTFit
	p   score.KVParams
	rng *rand.Rand
	// scratch is Pick's per-candidate numbers, reused across calls so Pick does not allocate.
	scratch ttftEval
}

// rhoMax caps the utilisation the miss price reads (docs/router.md): the windowed estimate is
// noisy, and at or above 1 the queueing factor 1/(1-rho) has no meaning (the queue grows without
// bound whatever is placed). 0.9 caps the price of extra work at 10x its first-order delay.
const rhoMax = 0.9

func newTTFT(o score.Options) *ttftPolicy { return newTTFTWith(o, DefaultTiming) }

// newTTFTWith starts the policy's fit from prior.
func newTTFTWith(o score.Options, prior Timing) *ttftPolicy {
	p := score.DefaultKV
	if o.KV != nil {
		p = *o.KV
	}
	return &ttftPolicy{TTFTFit: NewTTFTFit(prior), p: p, rng: score.NewRNG(o.Seed)}
}

func (k *ttftPolicy) Name() string { return "kv-ttft" }

// uncached is the request's prefill tokens the replica's cache does not cover, less the warm-up
// credit (virtual overlap): what the choice compares. The credit shapes the choice only; the
// balance window records the prefill the replica really does (the ledger's routed uncached
// tokens), so a warming replica's load is never under-counted (issue 22).
func (k *ttftPolicy) uncached(req *score.Request, c *score.Candidate) float64 {
	return score.UncachedTokens(req, c, k.p.TierWeights)
}

// span is how long the candidate's window covers at now (score.WindowSpanSeconds).
func (k *ttftPolicy) span(c *score.Candidate, now int64) float64 {
	return score.WindowSpanSeconds(c, now, k.p.WindowSeconds)
}

// ttftEval is one decision's numbers per candidate, filled by evaluate. Pick reuses the policy's
// scratch one (no allocation per decision); Explain fills a fresh one.
type ttftEval struct {
	// unc: uncached tokens (credit applied); ttft, miss: the objective's two parts (seconds);
	// rho, lambda: the utilisation and request rate the miss price reads; val: the cost the
	// pick minimises (+Inf when unhealthy).
	unc, ttft, miss, rho, lambda, val []float64
	minUnc                            float64
}

func (e *ttftEval) size(n int) {
	e.unc, e.ttft, e.miss = grow(e.unc, n), grow(e.ttft, n), grow(e.miss, n)
	e.rho, e.lambda, e.val = grow(e.rho, n), grow(e.lambda, n), grow(e.val, n)
}

// evaluate computes every candidate's cost. It changes nothing but e.
func (k *ttftPolicy) evaluate(req *score.Request, cands []score.Candidate, cal Timing, e *ttftEval) {
	e.minUnc = math.Inf(1)
	for i := range cands {
		if cands[i].Healthy {
			e.unc[i] = k.uncached(req, &cands[i])
			e.minUnc = math.Min(e.minUnc, e.unc[i])
		}
	}
	for i := range cands {
		c := &cands[i]
		e.ttft[i], e.miss[i], e.rho[i], e.lambda[i] = 0, 0, 0, 0
		if !c.Healthy {
			e.val[i] = math.Inf(1)
			continue
		}
		e.ttft[i] = cal.TTFT(c, e.unc[i], req.NowNs)
		span := k.span(c, req.NowNs)
		e.lambda[i] = float64(c.Window.Requests) / span
		e.rho[i] = math.Min(c.Window.Tokens*cal.SecondsPerToken/span, rhoMax)
		if extra := cal.SecondsPerToken * (e.unc[i] - e.minUnc); extra > 0 {
			ahead := e.ttft[i] - cal.LatencyS - cal.SecondsPerToken*e.unc[i]
			e.miss[i] = e.lambda[i] * extra * (ahead + extra/2) / (1 - e.rho[i])
		}
		e.val[i] = e.ttft[i] + e.miss[i]
	}
}

func (k *ttftPolicy) Pick(req *score.Request, cands []score.Candidate) (int, error) {
	if !score.AnyHealthy(cands) {
		return -1, score.ErrNoCandidate
	}
	e := &k.scratch
	e.size(len(cands))
	k.evaluate(req, cands, k.Read(), e)
	value := func(i int) float64 { return e.val[i] }
	if k.p.Temperature > 0 {
		return score.SampleNearTies(cands, value, k.p.Temperature, 0, k.rng), nil
	}
	return score.PickMin(cands, value, k.rng), nil
}

// Explain gives each candidate's cost (seconds) and its terms without changing the policy: the
// random tie-break is not drawn, and neither Pick nor Explain writes the windows (the ledger's)
// or the fit (written by first tokens only). The cheapest healthy candidate is Pick's choice at temperature 0
// (on an exact tie Pick draws among the tied, route.Cheapest takes the first); with a
// temperature Pick samples near it.
func (k *ttftPolicy) Explain(req *score.Request, cands []score.Candidate) []score.Explanation {
	out := make([]score.Explanation, len(cands))
	if !score.AnyHealthy(cands) {
		for i := range out {
			out[i].Excluded = score.GuardUnhealthy
		}
		return out
	}
	var e ttftEval
	e.size(len(cands))
	cal := k.Read()
	k.evaluate(req, cands, cal, &e)
	for i := range cands {
		c := &cands[i]
		if !c.Healthy {
			out[i] = score.Explanation{Excluded: score.GuardUnhealthy}
			continue
		}
		out[i] = score.Explanation{Cost: e.val[i], Terms: []score.Term{
			{Name: "uncached_tokens", Value: e.unc[i]}, // first, as kv's: /debug/route's readers find it there
			{Name: "ttft_s", Value: e.ttft[i]},
			{Name: "miss_s", Value: e.miss[i]},
			{Name: "extra_uncached_tokens", Value: e.unc[i] - e.minUnc},
			{Name: "latency_s", Value: cal.LatencyS},
			{Name: "queued_prefill_s", Value: cal.SecondsPerToken * score.PrefillAhead(c, req.NowNs)},
			{Name: "own_prefill_s", Value: cal.SecondsPerToken * e.unc[i]},
			{Name: "decode_s", Value: cal.SecondsPerDecodeToken * float64(c.ContextTokens())},
			{Name: "prefill_tokens_per_s", Value: 1 / cal.SecondsPerToken},
			{Name: "calibration_weight", Value: cal.Observations},
			{Name: "rho", Value: e.rho[i]},
			{Name: "requests_per_s", Value: e.lambda[i]},
		}}
	}
	return out
}

// OnRouted changes nothing: the ledger (router/load) records the request in the windows, which
// the policy reads (score.Candidate.Window); the fit learns from first tokens (TTFTFit).
func (k *ttftPolicy) OnRouted(*score.Request, []score.Candidate, int) {}

// WindowSpan is the length of the window the ledger keeps for this policy (the rates the miss
// price reads).
func (k *ttftPolicy) WindowSpan() time.Duration {
	return time.Duration(k.p.WindowSeconds * float64(time.Second))
}

// grow returns s resized to n, reusing its array when it is large enough.
func grow(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}
