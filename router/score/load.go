package score

import "math/rand/v2"

// loadPolicy (`load`, alias `least-loaded`) sends each request to the replica with the fewest
// in-flight tokens (prefill still to do plus the context its sequences hold, those still in
// prefill included: Candidate.ContextTokens), ignoring cache.
type loadPolicy struct {
	name string
	rng  *rand.Rand
}

func newLoad(name string, o Options) *loadPolicy { return &loadPolicy{name: name, rng: NewRNG(o.Seed)} }

func (p *loadPolicy) Name() string { return p.name }

func (p *loadPolicy) Pick(_ *Request, cands []Candidate) (int, error) {
	i := PickMin(cands, func(i int) float64 { return inflightTokens(&cands[i]) }, p.rng)
	if i < 0 {
		return -1, ErrNoCandidate
	}
	return i, nil
}

func (p *loadPolicy) OnRouted(*Request, []Candidate, int) {}

// inflightTokens counts a request in prefill by its whole prompt, as it counts one decoding,
// plus its uncached part as the work still to do. Counted by its uncached tokens alone, a
// request that shares a cached prefix weighed a fraction of one that had reached its first
// token, and the replica just sent one looked the least loaded and took the next ones
// (hot-prefix TTFT p90 2.6 x round-robin's; docs/benchmarks.md "Requests still in prefill").
func inflightTokens(c *Candidate) float64 { return float64(c.PrefillTokens + c.ContextTokens()) }
