package score

import (
	"math"
	"math/rand/v2"
	"time"
)

// ttftPolicy is `kv-ttft`, a benchmark policy: kv's cost read in seconds (kv.go) with the miss
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
// prefill (Candidate.ContextTokens). L, s, c: the engines'
// calibration (Candidate.Calib, fitted online by the ledger from first-token times;
// DefaultCalibration before any). λ_i and ρ_i: requests per
// second and prefill utilisation (λ x mean work) over the ledger's window (Candidate.Window),
// ρ capped at RhoMax. The only guard is health.
type ttftPolicy struct {
	p   KVParams
	rng *rand.Rand
	// scratch is Pick's per-candidate numbers, reused across calls so Pick does not allocate.
	scratch ttftEval
}

func newTTFT(o Options) *ttftPolicy {
	p := DefaultKV
	if o.KV != nil {
		p = *o.KV
	}
	return &ttftPolicy{p: p, rng: newRNG(o.Seed)}
}

func (k *ttftPolicy) Name() string { return "kv-ttft" }

// uncached is the request's prefill tokens the replica's cache does not cover, less the warm-up
// credit (virtual overlap): what the choice compares. The credit shapes the choice only; the
// balance window records the prefill the replica really does (the ledger's routed uncached
// tokens), so a warming replica's load is never under-counted.
func (k *ttftPolicy) uncached(req *Request, c *Candidate) float64 {
	return uncachedTokens(req, c, k.p.TierWeights)
}

// span is how long the candidate's window covers at now (windowSpan).
func (k *ttftPolicy) span(c *Candidate, now int64) float64 {
	return windowSpan(c, now, k.p.WindowSeconds)
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
func (k *ttftPolicy) evaluate(req *Request, cands []Candidate, e *ttftEval) {
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
		cal := c.Calib.Or(DefaultCalibration)
		e.ttft[i] = cal.TTFT(c, e.unc[i], req.NowNs)
		span := k.span(c, req.NowNs)
		e.lambda[i] = float64(c.Window.Requests) / span
		e.rho[i] = math.Min(c.Window.Tokens*cal.SecondsPerToken/span, k.p.RhoMax)
		if extra := cal.SecondsPerToken * (e.unc[i] - e.minUnc); extra > 0 {
			ahead := e.ttft[i] - cal.LatencyS - cal.SecondsPerToken*e.unc[i]
			e.miss[i] = e.lambda[i] * extra * (ahead + extra/2) / (1 - e.rho[i])
		}
		e.val[i] = e.ttft[i] + e.miss[i]
	}
}

func (k *ttftPolicy) Pick(req *Request, cands []Candidate) (int, error) {
	if !anyHealthy(cands) {
		return -1, ErrNoCandidate
	}
	e := &k.scratch
	e.size(len(cands))
	k.evaluate(req, cands, e)
	value := func(i int) float64 { return e.val[i] }
	if k.p.Temperature > 0 {
		return sampleNearTies(cands, value, k.p.Temperature, 0, k.rng), nil
	}
	return pickMin(cands, value, k.rng), nil
}

// Explain gives each candidate's cost (seconds) and its terms without changing the policy: the
// random tie-break is not drawn, and neither Pick nor Explain writes the windows or the
// calibration (the ledger's). The cheapest healthy candidate is Pick's choice at temperature 0
// (on an exact tie Pick draws among the tied, route.Cheapest takes the first); with a
// temperature Pick samples near it.
func (k *ttftPolicy) Explain(req *Request, cands []Candidate) []Explanation {
	out := make([]Explanation, len(cands))
	if !anyHealthy(cands) {
		for i := range out {
			out[i].Excluded = guardUnhealthy
		}
		return out
	}
	var e ttftEval
	e.size(len(cands))
	k.evaluate(req, cands, &e)
	for i := range cands {
		c := &cands[i]
		if !c.Healthy {
			out[i] = Explanation{Excluded: guardUnhealthy}
			continue
		}
		cal := c.Calib.Or(DefaultCalibration)
		out[i] = Explanation{Cost: e.val[i], Terms: []Term{
			{"uncached_tokens", e.unc[i]}, // first, as kv's: /debug/route's readers find it there
			{"ttft_s", e.ttft[i]},
			{"miss_s", e.miss[i]},
			{"extra_uncached_tokens", e.unc[i] - e.minUnc},
			{"latency_s", cal.LatencyS},
			{"queued_prefill_s", cal.SecondsPerToken * PrefillAhead(c, req.NowNs)},
			{"own_prefill_s", cal.SecondsPerToken * e.unc[i]},
			{"decode_s", cal.SecondsPerDecodeToken * float64(c.ContextTokens())},
			{"prefill_tokens_per_s", 1 / cal.SecondsPerToken},
			{"calibration_weight", c.Calib.Observations},
			{"rho", e.rho[i]},
			{"requests_per_s", e.lambda[i]},
		}}
	}
	return out
}

// OnRouted changes nothing: the ledger (router/load) records the request in the windows and
// fits the calibration; the policy only reads them (Candidate.Window, Candidate.Calib).
func (k *ttftPolicy) OnRouted(*Request, []Candidate, int) {}

// WindowSpan is the length of the window the ledger keeps for this policy (the rates the miss
// price reads).
func (k *ttftPolicy) WindowSpan() time.Duration {
	return time.Duration(k.p.WindowSeconds * float64(time.Second))
}
