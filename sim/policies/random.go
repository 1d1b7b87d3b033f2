package policies

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/router/score"
)

// randomPolicy (`random`) picks a healthy replica uniformly with the seeded generator.
type randomPolicy struct{ rng *rand.Rand }

func newRandom(o score.Options) *randomPolicy { return &randomPolicy{rng: score.NewRNG(o.Seed)} }

func (p *randomPolicy) Name() string { return "random" }

func (p *randomPolicy) Pick(_ *score.Request, cands []score.Candidate) (int, error) {
	healthy := 0
	for i := range cands {
		if cands[i].Healthy {
			healthy++
		}
	}
	if healthy == 0 {
		return -1, score.ErrNoCandidate
	}
	k := p.rng.IntN(healthy)
	for i := range cands {
		if cands[i].Healthy {
			if k == 0 {
				return i, nil
			}
			k--
		}
	}
	return -1, score.ErrNoCandidate
}

func (p *randomPolicy) OnRouted(*score.Request, []score.Candidate, int) {}
