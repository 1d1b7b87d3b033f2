package score

import (
	"math"
	"math/rand/v2"
	"time"
)

// KVParams tune the kv policies. DefaultKV holds the router's defaults; the fleet model uses the
// same values, nothing per trace. The `kv-ttft` objective (kv.go) reads TierWeights,
// WindowSeconds, RhoMax and Temperature; the other fields are `kv`'s.
type KVParams struct {
	// TierWeights credit an exact overlap block by where it sits (GPU, CPU, disk): a block on a
	// slower tier still costs a load.
	TierWeights [NumTiers]float64
	// QueuedPrefillWeight weighs the prefill already routed to a replica against this
	// request's own uncached tokens. It is below 1 because queued work drains and delays this
	// request once, while an avoidable miss is work the fleet does in addition and a second
	// copy of the prefix that evicts someone else's; at 1 a prefix group scatters as soon as
	// two queues differ by one prompt.
	QueuedPrefillWeight float64
	// DecodeWeight converts the context tokens a replica's steps carry (its sequences decoding
	// and those in prefill, Candidate.ContextTokens) into prefill-token equivalents;
	// they are load, weighed with the queued prefill by QueuedPrefillWeight (kvV1Policy.load).
	// The engine's step time sets it: in vLLM 0.20.1's forward-pass records (sim/vllmsim,
	// stepmodel.go, vllm-0.20.1-b300) a token of decode context adds 0.068 ms per 1,000 to
	// every step and a prefill token 0.044 ms, so a running sequence's token slows each step by
	// 0.0015 prefill tokens; a request waits out its own prefill step and those of the prefill
	// ahead, a few steps, so 0.005 (history: docs/benchmarks.md, "kv's load terms at the
	// engine's figures").
	DecodeWeight float64
	// WindowSeconds is the length of the sliding window over which each replica's routed
	// uncached prefill tokens are summed (the quantity the balance bound limits). The ledger
	// keeps the windows (Candidate.Window) at this length (WindowSpan).
	WindowSeconds float64
	// Slack bounds imbalance: a replica stays eligible while its windowed work plus this
	// request is within (1+Slack) x the fleet mean after this decision.
	Slack float64
	// RequestSlack and RequestHeadroom bound each replica's requests routed inside the window
	// at (1+RequestSlack) x the fleet mean after this decision + RequestHeadroom. The token
	// bound above is on uncached work, so full hits on a hot prefix pass it: the replicas that
	// hold it would take every request (each still costs decode steps and a running slot) and
	// one that missed the first copy would never get one. This bound makes the hot prefix
	// spill over, and one spilled request makes the next replica a hit as well. It is loose
	// (2x a fair share plus 4) so it only catches hotspots: tighter (0.2 / 2) cost 0.07-0.08 x
	// of the hit rate on the Mooncake traces in the fleet model; at 1.0 / 4 it changes nothing
	// there.
	RequestSlack    float64
	RequestHeadroom float64
	// StarvedShare and StarvedHeadroom are the floor: a healthy replica with fewer windowed
	// requests than StarvedShare x the fleet mean after this decision - StarvedHeadroom is
	// starved (unless it already has its share of the requests in flight), and while any
	// replica is, only starved replicas are candidates. Without it a
	// hot prefix cached on three of four replicas keeps the fourth idle for as long as the
	// three are not loaded past one miss (measured: 6 s of a 25 req/s replay), so the fleet
	// serves on three. At 0.25 / 1 it never fires in the fleet model's traces.
	StarvedShare    float64
	StarvedHeadroom float64
	// Temperature > 0 samples among near-ties (softmax over normalised cost); 0 is deterministic.
	Temperature float64
	// RhoMax caps the utilisation the kv objective's miss price reads (docs/router.md): the
	// windowed estimate is noisy, and at or above 1 the queueing factor 1/(1-rho) has no
	// meaning (the queue grows without bound whatever is placed). 0.9 caps the price of extra
	// work at 10x its first-order delay.
	RhoMax float64
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
	RhoMax:              0.9,
}

// kvV1Policy (`kv`, the production default) is the cost in prefill-token equivalents; the TTFT
// objective (kv.go, `kv-ttft`, benchmark only until it keeps siblings together and does not
// flood a warming replica: docs/router.md) is meant to replace it. The cost of a replica is the prefill work it would do
// for this request that its cache does not cover (tier-weighted exact overlap or the predicted
// side index, whichever is longer, plus warm-up credit as virtual overlap = credit x prompt
// blocks), plus the work already queued and running there. With no overlap anywhere this is the
// least-loaded replica. A bounded-imbalance guard keeps a hot prefix from taking an unbounded
// share: replicas whose windowed prefill work would exceed the bound are skipped.
type kvV1Policy struct {
	p   KVParams
	rng *rand.Rand
	// scratch is Pick's per-candidate numbers, reused across calls so Pick does not allocate.
	scratch kvV1Eval
}

func newKVV1(o Options) *kvV1Policy {
	p := DefaultKV
	if o.KV != nil {
		p = *o.KV
	}
	return &kvV1Policy{p: p, rng: newRNG(o.Seed)}
}

func (k *kvV1Policy) Name() string { return "kv" }

// uncached is the request's prefill tokens the replica's cache does not cover, less the warm-up
// credit (virtual overlap): what the choice compares. The credit shapes the choice only; the
// balance window records the prefill the replica really does (the ledger's routed uncached
// tokens), so a warming replica's load is never under-counted (issue 22).
func (k *kvV1Policy) uncached(req *Request, c *Candidate) float64 {
	return uncachedTokens(req, c, k.p.TierWeights)
}

// span is how long the candidate's window covers at now (windowSpan).
func (k *kvV1Policy) span(c *Candidate, now int64) float64 {
	return windowSpan(c, now, k.p.WindowSeconds)
}

// load is the replica's load term: QueuedPrefillWeight x (prefill still ahead + DecodeWeight x
// the context its steps carry, Candidate.ContextTokens). Both delay this request once, by the
// engine's step time, so both take the same weight against an avoidable miss. The decode term
// used to stand outside the weight, so against queued prefill it counted 1/QueuedPrefillWeight
// (3.3x) what DecodeWeight says: with the drain credit below, a replica nearly done with a
// prefill but running fewer sequences then looked cheaper than an idle one (fleet model,
// no-reuse at 12 req/s: 1,223 of 4,000 decisions against 81; docs/benchmarks.md, "Prefill
// drain").
func (k *kvV1Policy) load(c *Candidate, nowNs int64) float64 {
	return k.p.QueuedPrefillWeight * (PrefillAhead(c, nowNs) + k.p.DecodeWeight*float64(c.ContextTokens()))
}

func growV1(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}

// The kv guards, as Explain names them when one takes a candidate out of the running.
const (
	v1GuardUnhealthy  = "unhealthy"
	v1GuardRequests   = "request_bound"    // over (1+RequestSlack) x the mean windowed requests + headroom
	v1GuardStarvation = "starvation_floor" // another replica is starved and this one is not
	v1GuardTokens     = "token_bound"      // its windowed uncached work would pass (1+Slack) x the mean
)

// kvV1Eval is one decision's numbers per candidate, filled by evaluate. Pick reuses the policy's
// scratch one (no allocation per decision); Explain fills a fresh one with the reasons.
type kvV1Eval struct {
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

func (e *kvV1Eval) size(n int, reasons bool) {
	e.unc, e.win, e.cnt, e.scale = growV1(e.unc, n), growV1(e.win, n), growV1(e.cnt, n), growV1(e.scale, n)
	e.raw, e.val = growV1(e.raw, n), growV1(e.val, n)
	if reasons {
		e.why = make([]string, n)
	}
}

func (e *kvV1Eval) exclude(i int, guard string) {
	e.val[i] = math.Inf(1)
	if e.why != nil && e.why[i] == "" {
		e.why[i] = guard
	}
}

// evaluate computes every candidate's cost and applies the guards. It changes nothing but e.
func (k *kvV1Policy) evaluate(req *Request, cands []Candidate, e *kvV1Eval) {
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
	cheapest := math.Inf(1)
	for i := range cands {
		c := &cands[i]
		val[i], raw[i] = 0, 0
		if !c.Healthy {
			e.exclude(i, v1GuardUnhealthy)
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
		val[i] = raw[i]
		switch {
		case cnt[i]+scale[i] > e.reqLimit:
			e.exclude(i, v1GuardRequests)
		case anyStarved && !starved(i):
			e.exclude(i, v1GuardStarvation)
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
			e.exclude(i, v1GuardTokens)
		}
	}
}

func (k *kvV1Policy) Pick(req *Request, cands []Candidate) (int, error) {
	if !anyHealthy(cands) {
		return -1, ErrNoCandidate
	}
	e := &k.scratch
	e.size(len(cands), false)
	k.evaluate(req, cands, e)
	value := func(i int) float64 { return e.val[i] }
	if k.p.Temperature > 0 {
		return k.sample(cands, value), nil
	}
	return pickMin(cands, value, k.rng), nil
}

// Explain gives each candidate's cost and its terms, in prefill-token equivalents, and the guard
// that excluded it, without changing the policy: the random tie-break is not drawn (the windows
// are the ledger's, and neither Pick nor Explain writes them). The cheapest candidate not excluded is Pick's
// choice at temperature 0 (on an exact tie Pick draws among the tied, route.Cheapest takes the
// first); with a temperature Pick samples near it.
func (k *kvV1Policy) Explain(req *Request, cands []Candidate) []Explanation {
	out := make([]Explanation, len(cands))
	if !anyHealthy(cands) {
		for i := range out {
			out[i].Excluded = v1GuardUnhealthy
		}
		return out
	}
	var e kvV1Eval
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
	}
	return out
}

// sample draws from a softmax over cost normalised by the mean finite cost.
func (k *kvV1Policy) sample(cands []Candidate, value func(int) float64) int {
	best := pickMin(cands, value, nil)
	lo := value(best)
	mean, m := 0.0, 0
	for i := range cands {
		if v := value(i); cands[i].Healthy && !math.IsInf(v, 1) {
			mean += v
			m++
		}
	}
	scale := math.Max(mean/float64(m), 1) * k.p.Temperature
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

// OnRouted changes nothing: the request's work is recorded in the balance window by the ledger
// (router/load), which owns the windows; the policy only reads them (Candidate.Window).
func (k *kvV1Policy) OnRouted(*Request, []Candidate, int) {}

// WindowSpan is the length of the balance window the ledger keeps for this policy.
func (k *kvV1Policy) WindowSpan() time.Duration {
	return time.Duration(k.p.WindowSeconds * float64(time.Second))
}
