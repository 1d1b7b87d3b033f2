package score

import "math/rand/v2"

// loadPolicy (`load`, alias `least-loaded`) sends each request to the replica with the fewest
// in-flight tokens (prefill still to do plus tokens held by running sequences), ignoring cache.
type loadPolicy struct {
	name string
	rng  *rand.Rand
}

func newLoad(name string, o Options) *loadPolicy { return &loadPolicy{name: name, rng: newRNG(o.Seed)} }

func (p *loadPolicy) Name() string { return p.name }

func (p *loadPolicy) Pick(_ *Request, cands []Candidate) (int, error) {
	i := pickMin(cands, func(i int) float64 { return inflightTokens(&cands[i]) }, p.rng)
	if i < 0 {
		return -1, ErrNoCandidate
	}
	return i, nil
}

func (p *loadPolicy) OnRouted(*Request, []Candidate, int) {}

func inflightTokens(c *Candidate) float64 { return float64(c.PrefillTokens + c.DecodeTokens) }
