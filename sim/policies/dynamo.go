package policies

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/router/score"
)

// dynamoKV (`dynamo-kv`) follows NVIDIA Dynamo's KV router cost (the router concepts page of
// ai-dynamo/dynamo's docs), lowest cost wins:
//
//	adjusted_prefill = max(active_prefill_blocks + request_blocks - overlap_credit, 0)
//	decode           = active_decode_blocks + request_blocks
//	cost             = prefill_load_scale * adjusted_prefill + decode
//
// with overlap_credit = device overlap x credit (1.0) + host x 0.75 + disk x 0.25, prefill load
// scale 1.0, temperature 0 (deterministic; exact ties broken at random), credit decay 0, and only
// the primary (event-fed) index: the predicted side index is off by default there.
type dynamoKV struct{ rng *rand.Rand }

// Dynamo defaults.
const (
	dynamoCredit       = 1.0
	dynamoPrefillScale = 1.0
)

var dynamoTierWeights = [score.NumTiers]float64{dynamoCredit, 0.75, 0.25}

func newDynamo(o score.Options) *dynamoKV { return &dynamoKV{rng: score.NewRNG(o.Seed)} }

func (p *dynamoKV) Name() string { return "dynamo-kv" }

func (p *dynamoKV) Pick(req *score.Request, cands []score.Candidate) (int, error) {
	bs := float64(max(req.BlockSize, 1))
	reqBlocks := float64(req.PromptBlocks())
	i := score.PickMin(cands, func(i int) float64 {
		c := &cands[i]
		prefill := float64(c.PrefillTokens)/bs + reqBlocks - c.GPUEquivalentBlocks(dynamoTierWeights)
		if prefill < 0 {
			prefill = 0
		}
		decode := float64(c.DecodeTokens)/bs + reqBlocks
		return dynamoPrefillScale*prefill + decode
	}, p.rng)
	if i < 0 {
		return -1, score.ErrNoCandidate
	}
	return i, nil
}

func (p *dynamoKV) OnRouted(*score.Request, []score.Candidate, int) {}
