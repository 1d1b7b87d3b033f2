package score

import (
	"math"
	"math/rand/v2"
)

// KVParams tune kvroute's default cost model. DefaultKV holds the router's defaults; the fleet
// model uses the same values, nothing per trace.
type KVParams struct {
	// TierWeights credit an exact overlap block by where it sits (GPU, CPU, disk): a block on a
	// slower tier still costs a load.
	TierWeights [NumTiers]float64
	// DecodeWeight converts tokens held by running sequences into prefill-token equivalents.
	DecodeWeight float64
	// QueueTokens is the cost of one waiting request in prefill-token equivalents.
	QueueTokens float64
	// Slack bounds imbalance: a replica is eligible only while its recent prefill work plus this
	// request stays within (1+Slack) x the fleet mean (plus one request's worth, so a lone
	// request on an idle fleet is never refused its cache).
	Slack float64
	// SlackRequests adds that many of this request's prompt tokens to the bound.
	SlackRequests float64
	// RecentWeight adds the replica's recent prefill work to its cost, so that among similar
	// choices the one with less recent work wins (it keeps windows balanced, not just totals).
	RecentWeight float64
	// WindowSeconds is the time constant over which recent prefill work decays.
	WindowSeconds float64
	// Temperature > 0 samples among near-ties (softmax over normalised cost); 0 is deterministic.
	Temperature float64
}

// DefaultKV is the `kv` policy's default tuning.
var DefaultKV = KVParams{
	TierWeights:   [NumTiers]float64{1, 0.75, 0.25},
	DecodeWeight:  0.05,
	QueueTokens:   2000,
	Slack:         0.05,
	SlackRequests: 0,
	RecentWeight:  0,
	WindowSeconds: 30,
	Temperature:   0,
}

// kvPolicy (`kv`) is kvroute's default: the cost of a replica is the prefill work it would do
// for this request that its cache does not cover (tier-weighted exact overlap or the predicted
// side index, whichever is longer, plus warm-up credit as virtual overlap = credit x prompt
// blocks), plus the work already queued and running there. With no overlap anywhere this is the
// least-loaded replica. A bounded-imbalance guard keeps a hot prefix from taking an unbounded
// share: replicas whose recent prefill work would exceed (1+Slack) x the mean are skipped.
type kvPolicy struct {
	p      KVParams
	rng    *rand.Rand
	recent map[string]*decayed
}

// decayed is an exponentially decaying sum of prefill tokens sent to one replica.
type decayed struct {
	v  float64
	at int64
}

func newKV(o Options) *kvPolicy {
	p := DefaultKV
	if o.KV != nil {
		p = *o.KV
	}
	return &kvPolicy{p: p, rng: newRNG(o.Seed), recent: map[string]*decayed{}}
}

func (k *kvPolicy) Name() string { return "kv" }

// uncached is the request's prefill tokens the replica's cache does not cover.
func (k *kvPolicy) uncached(req *Request, c *Candidate) float64 {
	blocks := math.Max(c.gpuEquivalentBlocks(k.p.TierWeights), float64(c.PredictedBlocks))
	pb := float64(req.PromptBlocks())
	blocks += clamp01(c.WarmupCredit) * pb
	blocks = math.Min(blocks, float64(len(req.Keys)))
	u := float64(req.Tokens) - blocks*float64(max(req.BlockSize, 1))
	return math.Max(u, 0)
}

func (k *kvPolicy) recentAt(id string, now int64) float64 {
	d := k.recent[id]
	if d == nil {
		return 0
	}
	if now > d.at && k.p.WindowSeconds > 0 {
		d.v *= math.Exp(-float64(now-d.at) / (k.p.WindowSeconds * 1e9))
		d.at = now
	}
	return d.v
}

func (k *kvPolicy) Pick(req *Request, cands []Candidate) (int, error) {
	if !anyHealthy(cands) {
		return -1, ErrNoCandidate
	}
	n := 0
	sum := 0.0
	rec := make([]float64, len(cands))
	unc := make([]float64, len(cands))
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		n++
		rec[i] = k.recentAt(cands[i].ID, req.NowNs)
		unc[i] = k.uncached(req, &cands[i])
		sum += rec[i]
	}
	// After this decision the fleet's recent work grows by about one request.
	limit := (1+k.p.Slack)*(sum+float64(req.Tokens))/float64(n) + k.p.SlackRequests*float64(req.Tokens)
	cost := func(i int) float64 {
		c := &cands[i]
		return float64(c.PrefillTokens) + unc[i] + k.p.DecodeWeight*float64(c.DecodeTokens) +
			k.p.QueueTokens*float64(c.Queue) + k.p.RecentWeight*rec[i]
	}
	// A (near) full hit adds no prefill work, so it never breaks the bound.
	eligible := func(i int) bool { return unc[i] <= float64(req.BlockSize) || rec[i]+unc[i] <= limit }
	any := false
	for i := range cands {
		if cands[i].Healthy && eligible(i) {
			any = true
			break
		}
	}
	if !any {
		// Everyone is over the bound (an idle fleet, or a burst): among the replicas with the
		// least recent work (within one block) the cheapest wins.
		lo := math.Inf(1)
		for i := range cands {
			if cands[i].Healthy {
				lo = math.Min(lo, rec[i]+unc[i])
			}
		}
		return pickMin(cands, func(i int) float64 {
			if rec[i]+unc[i] > lo+float64(req.BlockSize) {
				return math.Inf(1)
			}
			return cost(i)
		}, k.rng), nil
	}
	value := func(i int) float64 {
		if !eligible(i) {
			return math.Inf(1)
		}
		return cost(i)
	}
	if k.p.Temperature > 0 {
		return k.sample(cands, value), nil
	}
	return pickMin(cands, value, k.rng), nil
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
	scale := math.Max(mean/float64(m), 1) * k.p.Temperature
	w := make([]float64, len(cands))
	total := 0.0
	for i := range cands {
		if v := value(i); cands[i].Healthy && !math.IsInf(v, 1) {
			w[i] = math.Exp(-(v - lo) / scale)
			total += w[i]
		}
	}
	r := k.rng.Float64() * total
	for i := range w {
		if r < w[i] {
			return i
		}
		r -= w[i]
	}
	return best
}

func (k *kvPolicy) OnRouted(req *Request, cands []Candidate, i int) {
	id := cands[i].ID
	v := k.recentAt(id, req.NowNs)
	d := k.recent[id]
	if d == nil {
		d = &decayed{at: req.NowNs}
		k.recent[id] = d
	}
	d.v = v + k.uncached(req, &cands[i])
}
