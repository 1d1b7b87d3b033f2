package score

import (
	"math"
	"math/rand/v2"
	"time"
)

// kvPolicy is `kv`, the production policy (docs/router.md, "How kv decides", derives it). It
// sends a request to the eligible replica where it costs the least, in prefill tokens:
//
//	cost_i = u_i + w·(A_i + d·D_i)
//
//	u_i  the request's prompt tokens replica i's cache does not cover (UncachedTokens)
//	A_i  the prefill routed to i still ahead of it (PrefillAhead: measured drain and attention)
//	D_i  the context i's steps carry (Candidate.ContextTokens)
//	d    a context token in prefill tokens over a request's wait, the engine's figure (0.005)
//	w    waiting against missing (0.3)
//
// In seconds (x s/w, s the engine's seconds per prefill token) the cost is the request's time to
// first token there, s·(A_i + u_i + d·D_i), plus (1/w − 1)·s·u_i: an uncached token costs the
// fleet 2.33 x its compute beyond this request's wait (the work done again, and the second copy
// of the prefix it stores, which evicts someone else's blocks).
//
// Eligible: healthy, and within three balance constraints on what the cost cannot see, each
// replica's last 60 s of routed requests R_i and uncached tokens W_i (Candidate.Window, read as
// rates over its time in the fleet and stretched to the oldest replica's span), fleet means R̄
// and W̄ after this decision:
//
//	requests  R_i + 1 ≤ 2·R̄ + 4        full hits add no prefill, but each holds a running slot
//	floor     while a replica is starved (R_i < R̄/4 − 1, not over its share in flight), only
//	          starved replicas: one that missed a hot prefix's first copy pays a miss forever
//	tokens    W_i + u_i ≤ 1.2·W̄        unless u_i is under one block (a hit adds no work); the
//	          cost sees the prefill ahead now, not the decode and later turns a group's
//	          holder takes on by winning every decision
//
// When no replica is within the token bound, the least W_i + u_i (within a block) are.
type kvPolicy struct {
	p   KVParams
	rng *rand.Rand
	// scratch is Pick's per-candidate numbers, reused across calls so Pick does not allocate.
	scratch kvEval
}

// KVParams tune the kv policy. DefaultKV holds the router's defaults; the fleet model uses the
// same values, nothing per trace. kvbench's `kv-ttft` (sim/policies) reads TierWeights,
// WindowSeconds and Temperature. docs/router.md, "How kv decides", says why each is what it is.
type KVParams struct {
	// TierWeights credit an exact overlap block by where it sits (GPU, CPU, disk): a block on a
	// slower tier still costs a load.
	TierWeights [NumTiers]float64
	// QueuedPrefillWeight is w: prefill ahead delays this request once, while an avoidable
	// miss is work the fleet does again and a second copy that evicts someone else's blocks.
	// At 1 a prefix group scatters as soon as two queues differ by one prompt.
	QueuedPrefillWeight float64
	// DecodeWeight is d, the context tokens a replica's steps carry in prefill tokens. In vLLM
	// 0.20.1's forward-pass records (sim/vllmsim/stepmodel.go, vllm-0.20.1-b300) a token of
	// decode context adds 0.068 ms per 1,000 to every step and a prefill token 0.044 ms, so a
	// context token slows each step by 0.0015 prefill tokens; a request waits out a few steps.
	DecodeWeight float64
	// WindowSeconds is the length of the windows the balance constraints read; the ledger
	// keeps them (Candidate.Window) at this length (WindowSpan).
	WindowSeconds float64
	// Slack is the token bound's 0.2: W_i + u_i within (1+Slack) x W̄.
	Slack float64
	// RequestSlack and RequestHeadroom make the request bound's 2 (1+RequestSlack) and 4:
	// loose, so that it catches hotspots only and leaves the hit rate where it is.
	RequestSlack    float64
	RequestHeadroom float64
	// StarvedShare and StarvedHeadroom are the floor's 1/4 and 1.
	StarvedShare    float64
	StarvedHeadroom float64
	// Temperature > 0 samples among near-ties (softmax over normalised cost); 0 is deterministic.
	Temperature float64
}

// DefaultKV is the `kv` policy's default tuning.
var DefaultKV = KVParams{
	TierWeights:         [NumTiers]float64{1, 0.5, 0.25}, // as router/config's defaults
	QueuedPrefillWeight: 0.3,
	DecodeWeight:        0.005,
	WindowSeconds:       60,
	Slack:               0.2,
	RequestSlack:        1.0,
	RequestHeadroom:     4,
	StarvedShare:        0.25,
	StarvedHeadroom:     1,
	Temperature:         0,
}

func newKV(o Options) *kvPolicy {
	p := DefaultKV
	if o.KV != nil {
		p = *o.KV
	}
	return &kvPolicy{p: p, rng: NewRNG(o.Seed)}
}

func (k *kvPolicy) Name() string { return "kv" }

// uncached is the request's prefill tokens the replica's cache does not cover, less the warm-up
// credit (virtual overlap): what the choice compares. The credit shapes the choice only; the
// balance window records the prefill the replica really does (the ledger's routed uncached
// tokens), so a warming replica's load is never under-counted.
func (k *kvPolicy) uncached(req *Request, c *Candidate) float64 {
	return UncachedTokens(req, c, k.p.TierWeights)
}

// span is how long the candidate's window covers at now (WindowSpanSeconds).
func (k *kvPolicy) span(c *Candidate, now int64) float64 {
	return WindowSpanSeconds(c, now, k.p.WindowSeconds)
}

// load is w·(A_i + d·D_i): the prefill still ahead and the context the replica's steps carry
// both delay this request once, by the engine's step time, so both take the same weight against
// an avoidable miss.
func (k *kvPolicy) load(c *Candidate, nowNs int64) float64 {
	return k.p.QueuedPrefillWeight * (PrefillAhead(c, nowNs) + k.p.DecodeWeight*float64(c.ContextTokens()))
}

// The kv guards, as Explain names them when one takes a candidate out of the running.
const (
	GuardUnhealthy  = "unhealthy"        // every Explainer names an unhealthy candidate so
	guardRequests   = "request_bound"    // over (1+RequestSlack) x the mean windowed requests + headroom
	guardStarvation = "starvation_floor" // another replica is starved and this one is not
	guardTokens     = "token_bound"      // its windowed uncached work would pass (1+Slack) x the mean
)

// kvEval is one decision's numbers per candidate, filled by evaluate. Pick reuses the policy's
// scratch one (no allocation per decision); Explain fills a fresh one with the reasons.
type kvEval struct {
	// unc: the request's uncached tokens there (warm-up credit applied) x scale; win: its
	// windowed uncached work x scale; cnt: its windowed requests x scale; scale stretches a
	// younger replica's window to the oldest one's span.
	unc, win, cnt, scale []float64
	// raw is the cost before the guards; val the cost the pick minimises (+Inf when excluded).
	raw, val []float64
	// why names the guard that excluded each candidate (Explain only: nil in Pick).
	why []string
	// The bounds of this decision.
	tokenLimit, reqLimit, starvedLimit float64
}

func (e *kvEval) size(n int, reasons bool) {
	e.unc, e.win, e.cnt, e.scale = grow(e.unc, n), grow(e.win, n), grow(e.cnt, n), grow(e.scale, n)
	e.raw, e.val = grow(e.raw, n), grow(e.val, n)
	if reasons {
		e.why = make([]string, n)
	}
}

func (e *kvEval) exclude(i int, guard string) {
	e.val[i] = math.Inf(1)
	if e.why != nil && e.why[i] == "" {
		e.why[i] = guard
	}
}

// evaluate computes every candidate's cost and applies the guards. It changes nothing but e.
func (k *kvPolicy) evaluate(req *Request, cands []Candidate, e *kvEval) {
	unc, win, cnt, scale, raw, val := e.unc, e.win, e.cnt, e.scale, e.raw, e.val
	// Windows are compared as rates over the time each replica has been in the fleet: a
	// replica that joined 5 s ago has 5 s of work in its window, not 60, and read raw it would
	// look idle next to the others; doubling a fleet would then send every request to the
	// newcomers until their windows caught up. scale[i] stretches a younger replica's window
	// to the oldest one's span; replicas seen together (a fleet starting at once) all get 1.
	oldest := 0.0
	for i := range cands {
		if cands[i].Healthy {
			scale[i] = k.span(&cands[i], req.NowNs)
			oldest = math.Max(oldest, scale[i])
		}
	}
	n, sum, reqs, inflight := 0, 0.0, 0.0, 0
	for i := range cands {
		if cands[i].Healthy {
			n++
			scale[i] = oldest / scale[i]
			win[i], cnt[i] = cands[i].Window.Tokens*scale[i], float64(cands[i].Window.Requests)*scale[i]
			sum += win[i]
			reqs += cnt[i]
			inflight += cands[i].Running + cands[i].Queue
		}
	}
	e.reqLimit = (1+k.p.RequestSlack)*(reqs+1)/float64(n) + k.p.RequestHeadroom
	// The floor first: while a replica is starved only starved replicas are candidates (the
	// token bound below still applies among them). A replica already carrying its share of
	// the requests in flight is not starved, so a replica that comes back to a busy fleet
	// is not sent every request until its window fills.
	e.starvedLimit = k.p.StarvedShare*(reqs+1)/float64(n) - k.p.StarvedHeadroom
	starved := func(i int) bool {
		c := &cands[i]
		return c.Healthy && cnt[i] < e.starvedLimit &&
			float64(c.Running+c.Queue)*float64(n) <= float64(inflight)
	}
	anyStarved := false
	for i := range cands {
		anyStarved = anyStarved || starved(i)
	}
	credit := k.sessionCredit(req, cands)
	cheapest := math.Inf(1)
	for i := range cands {
		c := &cands[i]
		val[i], raw[i] = 0, 0
		if !c.Healthy {
			e.exclude(i, GuardUnhealthy)
			continue
		}
		unc[i] = k.uncached(req, c) * scale[i]
		// Cost in prefill-token equivalents: the uncached part of this request, then the
		// replica's load, which delays it once: the prefill still ahead and the running
		// sequences (they slow every step) weighed together, as load, by QueuedPrefillWeight.
		// The engine's waiting-request gauge (Candidate.Queue) is not a term: every request
		// it counts is already in the prefill ahead, exactly and at routing, while the gauge
		// is a sample up to a scrape interval old (router/fleet, DefaultInterval).
		raw[i] = unc[i]/scale[i] + k.load(c, req.NowNs)
		if c.SessionHome {
			raw[i] -= credit
		}
		val[i] = raw[i]
		switch {
		case cnt[i]+scale[i] > e.reqLimit:
			e.exclude(i, guardRequests)
		case anyStarved && !starved(i):
			e.exclude(i, guardStarvation)
		default:
			cheapest = math.Min(cheapest, unc[i])
		}
	}
	// The bound is on the fleet mean after this decision: it grows by at least the cheapest
	// placement.
	limit := (1 + k.p.Slack) * (sum + cheapest) / float64(n)
	anyEligible := false
	for i := range cands {
		if !math.IsInf(val[i], 1) {
			// A (near) full hit adds no prefill work, so it never breaks the bound.
			anyEligible = anyEligible || unc[i] <= float64(req.BlockSize)*scale[i] || win[i]+unc[i] <= limit
		}
	}
	if !anyEligible {
		// Everyone is over the bound (a burst, or an idle fleet): the replicas with the least
		// windowed work after this request (within one block) are what the bound protects;
		// among them the cheapest wins.
		lo := math.Inf(1)
		for i := range cands {
			if !math.IsInf(val[i], 1) {
				lo = math.Min(lo, win[i]+unc[i])
			}
		}
		limit = lo + float64(req.BlockSize)
	}
	e.tokenLimit = limit
	for i := range cands {
		if !math.IsInf(val[i], 1) && unc[i] > float64(req.BlockSize)*scale[i] && win[i]+unc[i] > limit {
			e.exclude(i, guardTokens)
		}
	}
}

// sessionCredit is what the session's home replica (Candidate.SessionHome) is credited, in
// prefill tokens: one block when every healthy candidate would compute the same uncached
// tokens, so the overlap tells none apart (a new turn whose prompt the router cannot key, an
// idle fleet, a prefix every replica holds), and 0 when the overlap already decides. One block
// is what the token bound treats as no work: the home wins when its load is within a block's
// prefill of the least loaded, and load decides past that.
func (k *kvPolicy) sessionCredit(req *Request, cands []Candidate) float64 {
	if req.SessionKey == "" {
		return 0
	}
	home, first, same := false, math.NaN(), true
	for i := range cands {
		c := &cands[i]
		if !c.Healthy {
			continue
		}
		home = home || c.SessionHome
		u := k.uncached(req, c)
		if math.IsNaN(first) {
			first = u
		} else if math.Abs(u-first) >= 0.5 {
			same = false
		}
	}
	if !home || !same {
		return 0
	}
	return float64(req.BlockSize)
}

func (k *kvPolicy) Pick(req *Request, cands []Candidate) (int, error) {
	if !AnyHealthy(cands) {
		return -1, ErrNoCandidate
	}
	e := &k.scratch
	e.size(len(cands), false)
	k.evaluate(req, cands, e)
	value := func(i int) float64 { return e.val[i] }
	if k.p.Temperature > 0 {
		return SampleNearTies(cands, value, k.p.Temperature, 1, k.rng), nil
	}
	return PickMin(cands, value, k.rng), nil
}

// Explain gives each candidate's cost and its terms, in prefill-token equivalents, and the guard
// that excluded it, without changing the policy: the random tie-break is not drawn (the windows
// are the ledger's, and neither Pick nor Explain writes them). The cheapest candidate not excluded is Pick's
// choice at temperature 0 (on an exact tie Pick draws among the tied, route.Cheapest takes the
// first); with a temperature Pick samples near it.
func (k *kvPolicy) Explain(req *Request, cands []Candidate) []Explanation {
	out := make([]Explanation, len(cands))
	if !AnyHealthy(cands) {
		for i := range out {
			out[i].Excluded = GuardUnhealthy
		}
		return out
	}
	var e kvEval
	e.size(len(cands), true)
	k.evaluate(req, cands, &e)
	for i := range cands {
		c := &cands[i]
		out[i] = Explanation{Cost: e.raw[i], Excluded: e.why[i]}
		if !c.Healthy {
			continue
		}
		out[i].Terms = []Term{
			{"uncached_tokens", e.unc[i] / e.scale[i]},
			{"queued_prefill", k.p.QueuedPrefillWeight * PrefillAhead(c, req.NowNs)},
			{"decode", k.p.QueuedPrefillWeight * k.p.DecodeWeight * float64(c.ContextTokens())},
			{"windowed_tokens", e.win[i]},
			{"token_bound", e.tokenLimit},
			{"windowed_requests", e.cnt[i]},
			{"request_bound", e.reqLimit},
			{"starved_below", e.starvedLimit},
			{"window_scale", e.scale[i]},
		}
		if c.SessionHome {
			out[i].Terms = append(out[i].Terms, Term{"session_home_credit", -k.sessionCredit(req, cands)})
		}
	}
	return out
}

// OnRouted changes nothing: the request's work is recorded in the balance window by the ledger
// (router/load), which owns the windows; the policy only reads them (Candidate.Window).
func (k *kvPolicy) OnRouted(*Request, []Candidate, int) {}

// WindowSpan is the length of the balance window the ledger keeps for this policy.
func (k *kvPolicy) WindowSpan() time.Duration {
	return time.Duration(k.p.WindowSeconds * float64(time.Second))
}

// UncachedTokens is the request's prompt tokens the replica's cache does not cover: tier-weighted
// exact overlap or the predicted side index, whichever is longer, plus the warm-up credit as
// virtual overlap (credit x prompt blocks). kv reads it (and kvbench's kv-ttft).
func UncachedTokens(req *Request, c *Candidate, tiers [NumTiers]float64) float64 {
	blocks := math.Max(c.GPUEquivalentBlocks(tiers), float64(c.PredictedBlocks))
	blocks += clamp01(c.WarmupCredit) * float64(req.PromptBlocks())
	blocks = math.Min(blocks, float64(len(req.Keys)))
	u := float64(req.Tokens) - blocks*float64(max(req.BlockSize, 1))
	return math.Max(u, 0)
}

// minSpanSeconds is the shortest history a replica's window is read over, so a replica seen a
// moment ago does not read one request as a huge rate or a huge share (kv, and kvbench's kv-ttft).
// Much longer, and a replica that joined a running fleet a moment ago has its work read over more
// time than it was there: it looks idle and takes a burst of requests, most of them misses.
const minSpanSeconds = 1

// WindowSpanSeconds is how long (seconds) the candidate's window covers at now: the time since the ledger first
// saw it as a candidate, between minSpanSeconds and the window length. A replica not seen yet has
// the shortest span, as if its clock started now; rates read from a younger replica's window are
// over its own time in the fleet, not the full window.
func WindowSpanSeconds(c *Candidate, now int64, windowSeconds float64) float64 {
	since := now
	if c.Window.Seen {
		since = c.Window.Since
	}
	return math.Min(math.Max(float64(now-since)/1e9, minSpanSeconds), math.Max(windowSeconds, minSpanSeconds))
}

// grow returns s resized to n, reusing its array when it is large enough.
func grow(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}

func clamp01(x float64) float64 {
	if x < 0 {
		return 0
	}
	if x > 1 {
		return 1
	}
	return x
}
