package policies

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/router/score"
)

// llmdDefault (`llmd-default`) follows llm-d Router's built-in default configuration: a weighted
// sum of queue-scorer (weight 2: min-max normalised waiting queue, shortest = 1, all equal = 1),
// kv-cache-utilization-scorer (weight 2: 1 - KV utilisation) and prefix-cache-scorer (weight 3:
// matched blocks / prompt blocks from the approximate producer), max-score picker (random among
// ties). The approximate producer hashes 64-token blocks (its minimum) and keeps one LRU of
// 31,250 blocks per pod, inserting the chosen pod's blocks after each decision.
type llmdDefault struct {
	rng      *rand.Rand
	idx      *approxIndex
	capUnits int
}

// llm-d defaults.
const (
	llmdQueueWeight  = 2
	llmdKVWeight     = 2
	llmdPrefixWeight = 3
	llmdBlockTokens  = 64
	llmdLRUCapacity  = 31250
)

func newLLMD(o score.Options) *llmdDefault {
	return &llmdDefault{rng: score.NewRNG(o.Seed), capUnits: llmdLRUCapacity}
}

func (p *llmdDefault) Name() string { return "llmd-default" }

// index sizes the LRU in keys: each key may stand for several 64-token blocks.
func (p *llmdDefault) index(per int) *approxIndex {
	if p.idx == nil {
		p.idx = newApproxIndex(max(p.capUnits/per, 1))
	}
	return p.idx
}

func (p *llmdDefault) Pick(req *score.Request, cands []score.Candidate) (int, error) {
	if !score.AnyHealthy(cands) {
		return -1, score.ErrNoCandidate
	}
	keys, per, total := coarseKeys(req, llmdBlockTokens)
	idx := p.index(per)
	minQ, maxQ := -1, -1
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		q := cands[i].Queue
		if minQ < 0 || q < minQ {
			minQ = q
		}
		if q > maxQ {
			maxQ = q
		}
	}
	weighted := func(i int) float64 {
		c := &cands[i]
		qs := 1.0
		if maxQ > minQ {
			qs = float64(maxQ-c.Queue) / float64(maxQ-minQ)
		}
		kv := 1 - clamp01(c.KVUtil)
		ps := 0.0
		if total > 0 {
			ps = float64(idx.match(c.ID, keys)*per) / float64(total)
		}
		return llmdQueueWeight*qs + llmdKVWeight*kv + llmdPrefixWeight*ps
	}
	return score.PickMin(cands, func(i int) float64 { return -weighted(i) }, p.rng), nil
}

func (p *llmdDefault) OnRouted(req *score.Request, cands []score.Candidate, i int) {
	keys, per, _ := coarseKeys(req, llmdBlockTokens)
	p.index(per).insert(cands[i].ID, keys)
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

// Forget drops a replica's learned keys (it left the fleet).
func (p *llmdDefault) Forget(id string) { p.idx.forget(id) }
