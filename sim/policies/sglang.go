package policies

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/router/score"
)

// sglangCacheAware (`sglang-cache-aware`) follows SGLang router's `cache_aware` policy (CLI
// defaults): an approximate tree of the text routed to each worker, and per-gateway in-flight
// request counts as load. If (max_load - min_load) > 64 and max_load > 1.5 x min_load, the
// shortest queue wins. Otherwise the best-matching worker wins if its match rate exceeds 0.3,
// else the worker with the smallest tree. The chosen worker's tree gets the prompt. Trees are
// trimmed LRU-first beyond max_tree_size (67,108,864 characters per worker).
type sglangCacheAware struct {
	rng      *rand.Rand
	capChars int
	idx      *approxIndex // created at the first request, when the chunk size per key is known
}

// SGLang cache_aware CLI defaults.
const (
	sglangCacheThreshold = 0.3
	sglangBalanceAbs     = 64
	sglangBalanceRel     = 1.5
	sglangMaxTreeChars   = 67108864
)

func newSGLang(o score.Options) *sglangCacheAware {
	return &sglangCacheAware{rng: score.NewRNG(o.Seed), capChars: sglangMaxTreeChars}
}

// index returns the tree, sized in keys of per chunks each from the character budget.
func (p *sglangCacheAware) index(per int) *approxIndex {
	if p.idx == nil {
		p.idx = newApproxIndex(max(p.capChars/(per*prefixChunkChars), 1))
	}
	return p.idx
}

func (p *sglangCacheAware) Name() string { return "sglang-cache-aware" }

func (p *sglangCacheAware) Pick(req *score.Request, cands []score.Candidate) (int, error) {
	if !score.AnyHealthy(cands) {
		return -1, score.ErrNoCandidate
	}
	load := func(i int) float64 { return float64(cands[i].Queue + cands[i].Running) }
	minL, maxL := -1.0, -1.0
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		l := load(i)
		if minL < 0 || l < minL {
			minL = l
		}
		if l > maxL {
			maxL = l
		}
	}
	if maxL-minL > sglangBalanceAbs && maxL > sglangBalanceRel*minL {
		return score.PickMin(cands, load, p.rng), nil
	}
	keys, per := chunkKeys(req)
	idx := p.index(per)
	totalChunks := max((req.Tokens*CharsPerToken+prefixChunkChars-1)/prefixChunkChars, 1)
	// Longest match first; among equal matches the less loaded worker.
	best := score.PickMin(cands, func(i int) float64 {
		return -float64(idx.match(cands[i].ID, keys))*1e9 + load(i)
	}, p.rng)
	rate := float64(idx.match(cands[best].ID, keys)*per) / float64(totalChunks)
	if rate > sglangCacheThreshold {
		return best, nil
	}
	return score.PickMin(cands, func(i int) float64 { return float64(idx.size(cands[i].ID)) }, p.rng), nil
}

func (p *sglangCacheAware) OnRouted(req *score.Request, cands []score.Candidate, i int) {
	keys, per := chunkKeys(req)
	p.index(per).insert(cands[i].ID, keys)
}

// Forget drops a replica's learned keys (it left the fleet).
func (p *sglangCacheAware) Forget(id string) { p.idx.forget(id) }
