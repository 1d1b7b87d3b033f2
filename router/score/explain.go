package score

// Term is one number a policy weighed for a candidate, in the policy's own unit (kv: prefill-token
// equivalents; the peers: their score). Names are stable: /debug/route and the
// sampled access log print them as they are.
type Term struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
}

// Explanation is why a policy ranked one candidate as it did: its cost (lower wins; a policy
// that maximises a score reports the negated score), the terms that add up to it and, when a
// guard took the candidate out of the running, the guard's name.
type Explanation struct {
	Cost     float64 `json:"cost"`
	Terms    []Term  `json:"terms,omitempty"`
	Excluded string  `json:"excluded,omitempty"`
}

// Explainer is implemented by policies that can give the terms of their decision per
// candidate. Explain must not change the policy's state (it answers /debug/route while traffic
// flows) and returns one Explanation per candidate, in order. Policies without it are shown
// with their pick only.
type Explainer interface {
	Explain(req *Request, cands []Candidate) []Explanation
}
