package score

// kvRig is the kv policy (the production cost; its guard tests) with the balance windows the router's ledger (router/load) keeps for
// it: OnRouted and Retract record as the ledger does (the routed uncached tokens, route's
// Decision.Uncached), Pick and Explain read the windows into the candidates first, as
// route.Decision.Refresh does.
type kvRig struct {
	*kvPolicy
	w *Windows
}

func newKVRig(o Options) *kvRig {
	k := newKV(o)
	return &kvRig{kvPolicy: k, w: NewWindows(k.WindowSpan())}
}

func (r *kvRig) fill(req *Request, c []Candidate) {
	for j := range c {
		c[j].Window = r.w.Read(c[j].ID, req.NowNs)
	}
}

func (r *kvRig) Pick(req *Request, c []Candidate) (int, error) {
	r.fill(req, c)
	return r.kvPolicy.Pick(req, c)
}

func (r *kvRig) Explain(req *Request, c []Candidate) []Explanation {
	r.fill(req, c)
	return r.kvPolicy.Explain(req, c)
}

func (r *kvRig) OnRouted(req *Request, c []Candidate, i int) {
	r.w.Routed(req.NowNs, c, i, routedUncached(req, &c[i]))
}

func (r *kvRig) Retract(req *Request, c []Candidate, i int) {
	r.w.Retract(c[i].ID, req.NowNs, routedUncached(req, &c[i]))
}

func (r *kvRig) Forget(id string) { r.w.Forget(id) }

// windowed reads a replica's window: its tokens and requests.
func (r *kvRig) windowed(id string, now int64) (float64, float64) {
	w := r.w.Read(id, now)
	return w.Tokens, float64(w.Requests)
}

// routedUncached is the prompt tokens the ledger records as the replica's prefill: no tier
// weight, no warm-up credit.
func routedUncached(req *Request, c *Candidate) float64 {
	blocks := min(max(c.ExactBlocks, c.PredictedBlocks), len(req.Keys))
	return float64(max(req.Tokens-blocks*max(req.BlockSize, 1), 0))
}
