package score

// roundRobin (`round-robin`) takes the healthy replicas in turn, like production-stack's
// `roundrobin` (one cursor over the endpoint list).
type roundRobin struct{ next uint64 }

func newRoundRobin() *roundRobin { return &roundRobin{} }

func (p *roundRobin) Name() string { return "round-robin" }

func (p *roundRobin) Pick(_ *Request, cands []Candidate) (int, error) {
	n := len(cands)
	for k := 0; k < n; k++ {
		i := int((p.next + uint64(k)) % uint64(n))
		if cands[i].Healthy {
			return i, nil
		}
	}
	return -1, ErrNoCandidate
}

func (p *roundRobin) OnRouted(_ *Request, cands []Candidate, i int) {
	if len(cands) > 0 {
		p.next = uint64(i+1) % uint64(len(cands))
	}
}
