package score

import "math/rand/v2"

// randomPolicy (`random`) picks a healthy replica uniformly with the seeded generator.
type randomPolicy struct{ rng *rand.Rand }

func newRandom(o Options) *randomPolicy { return &randomPolicy{rng: newRNG(o.Seed)} }

func (p *randomPolicy) Name() string { return "random" }

func (p *randomPolicy) Pick(_ *Request, cands []Candidate) (int, error) {
	healthy := 0
	for i := range cands {
		if cands[i].Healthy {
			healthy++
		}
	}
	if healthy == 0 {
		return -1, ErrNoCandidate
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
	return -1, ErrNoCandidate
}

func (p *randomPolicy) OnRouted(*Request, []Candidate, int) {}
