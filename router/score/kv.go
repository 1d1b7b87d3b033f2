package score

import (
	"math"
	"math/rand/v2"
	"time"
)

// kvPolicy (`kv-ttft`, benchmark only for now: docs/router.md says what keeps it from being the
// default `kv`) places a request where the fleet expects it to cost
// the least time, in seconds (docs/router.md, "The kv objective", derives it):
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
type kvPolicy struct {
	p   KVParams
	rng *rand.Rand
	// scratch is Pick's per-candidate numbers, reused across calls so Pick does not allocate.
	scratch kvEval
}

func newKV(o Options) *kvPolicy {
	p := DefaultKV
	if o.KV != nil {
		p = *o.KV
	}
	return &kvPolicy{p: p, rng: newRNG(o.Seed)}
}

func (k *kvPolicy) Name() string { return "kv-ttft" }

// uncached is the request's prefill tokens the replica's cache does not cover, less the warm-up
// credit (virtual overlap): what the choice compares. The credit shapes the choice only; the
// balance window records the prefill the replica really does (the ledger's routed uncached
// tokens), so a warming replica's load is never under-counted (issue 22).
func (k *kvPolicy) uncached(req *Request, c *Candidate) float64 {
	return uncachedTokens(req, c, k.p.TierWeights)
}

// minSpanSeconds is the shortest history a replica's window is read over, so a replica seen a
// moment ago does not read one request as a huge rate or a huge share (both kv policies; the
// scale-up measurement behind 1 s is in docs/benchmarks.md, "How kv decides").
const minSpanSeconds = 1

// windowSpan is how long the candidate's window covers at now: the time since the ledger first
// saw it as a candidate, between minSpanSeconds and the window length. A replica not seen yet has
// the shortest span, as if its clock started now; rates read from a younger replica's window are
// over its own time in the fleet, not the full window.
func windowSpan(c *Candidate, now int64, windowSeconds float64) float64 {
	since := now
	if c.Window.Seen {
		since = c.Window.Since
	}
	return math.Min(math.Max(float64(now-since)/1e9, minSpanSeconds), math.Max(windowSeconds, minSpanSeconds))
}

// span is how long the candidate's window covers at now (windowSpan).
func (k *kvPolicy) span(c *Candidate, now int64) float64 {
	return windowSpan(c, now, k.p.WindowSeconds)
}

func grow(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}

// guardUnhealthy is the one reason kv takes a candidate out of the running.
const guardUnhealthy = "unhealthy"

// kvEval is one decision's numbers per candidate, filled by evaluate. Pick reuses the policy's
// scratch one (no allocation per decision); Explain fills a fresh one.
type kvEval struct {
	// unc: uncached tokens (credit applied); ttft, miss: the objective's two parts (seconds);
	// rho, lambda: the utilisation and request rate the miss price reads; val: the cost the
	// pick minimises (+Inf when unhealthy).
	unc, ttft, miss, rho, lambda, val []float64
	minUnc                            float64
}

func (e *kvEval) size(n int) {
	e.unc, e.ttft, e.miss = grow(e.unc, n), grow(e.ttft, n), grow(e.miss, n)
	e.rho, e.lambda, e.val = grow(e.rho, n), grow(e.lambda, n), grow(e.val, n)
}

// evaluate computes every candidate's cost. It changes nothing but e.
func (k *kvPolicy) evaluate(req *Request, cands []Candidate, e *kvEval) {
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

func (k *kvPolicy) Pick(req *Request, cands []Candidate) (int, error) {
	if !anyHealthy(cands) {
		return -1, ErrNoCandidate
	}
	e := &k.scratch
	e.size(len(cands))
	k.evaluate(req, cands, e)
	value := func(i int) float64 { return e.val[i] }
	if k.p.Temperature > 0 {
		return k.sample(cands, value), nil
	}
	return pickMin(cands, value, k.rng), nil
}

// Explain gives each candidate's cost (seconds) and its terms without changing the policy: the
// random tie-break is not drawn, and neither Pick nor Explain writes the windows or the
// calibration (the ledger's). The cheapest healthy candidate is Pick's choice at temperature 0
// (on an exact tie Pick draws among the tied, route.Cheapest takes the first); with a
// temperature Pick samples near it.
func (k *kvPolicy) Explain(req *Request, cands []Candidate) []Explanation {
	out := make([]Explanation, len(cands))
	if !anyHealthy(cands) {
		for i := range out {
			out[i].Excluded = guardUnhealthy
		}
		return out
	}
	var e kvEval
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

// sample draws from a softmax over cost normalised by the mean finite cost.
func (k *kvPolicy) sample(cands []Candidate, value func(int) float64) int {
	best := pickMin(cands, value, nil)
	lo := value(best)
	mean, m := 0.0, 0
	for i := range cands {
		if v := value(i); cands[i].Healthy && !math.IsInf(v, 1) {
			mean += v
			m++
		}
	}
	scale := mean / float64(m) * k.p.Temperature
	if scale <= 0 {
		return best
	}
	total := 0.0
	for i := range cands {
		if v := value(i); cands[i].Healthy && !math.IsInf(v, 1) {
			total += math.Exp(-(v - lo) / scale)
		}
	}
	r := k.rng.Float64() * total
	for i := range cands {
		if v := value(i); cands[i].Healthy && !math.IsInf(v, 1) {
			w := math.Exp(-(v - lo) / scale)
			if r < w {
				return i
			}
			r -= w
		}
	}
	return best
}

// OnRouted changes nothing: the ledger (router/load) records the request in the windows and
// fits the calibration; the policy only reads them (Candidate.Window, Candidate.Calib).
func (k *kvPolicy) OnRouted(*Request, []Candidate, int) {}

// WindowSpan is the length of the window the ledger keeps for this policy (the rates the miss
// price reads).
func (k *kvPolicy) WindowSpan() time.Duration {
	return time.Duration(k.p.WindowSeconds * float64(time.Second))
}

// uncachedTokens is the request's prompt tokens the replica's cache does not cover: tier-weighted
// exact overlap or the predicted side index, whichever is longer, plus the warm-up credit as
// virtual overlap (credit x prompt blocks). Both kv costs (kv and kv-v1's) read it.
func uncachedTokens(req *Request, c *Candidate, tiers [NumTiers]float64) float64 {
	blocks := math.Max(c.gpuEquivalentBlocks(tiers), float64(c.PredictedBlocks))
	blocks += clamp01(c.WarmupCredit) * float64(req.PromptBlocks())
	blocks = math.Min(blocks, float64(len(req.Keys)))
	u := float64(req.Tokens) - blocks*float64(max(req.BlockSize, 1))
	return math.Max(u, 0)
}
