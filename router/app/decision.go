package app

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/fleet"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/route"
	"github.com/kvroute/kvroute/router/score"
)

// decision is one routing decision and what it was based on. Its memory is reused from one
// request to the next (newDecision, release): the ledger's Record of the request lives in rec,
// and the policy's inputs (route.Decision: keys, candidates) are the ledger's and the
// observers' until the request ends.
type decision struct {
	route.Decision
	reps   []*replica
	chosen int
	took   time.Duration
	// id is the request's ledger entry (0: not routed, a dry run, or ended).
	id load.ID
	// pulled: booked as a split request's decode leg, its uncached prompt pulled from a
	// prefill engine (load.Routing.Transfer); whole says why a legChoose booking was not
	// (disagg.go), "" when it was or for any other booking.
	pulled bool
	whole  string
	// rec is the ledger's Record of the request (load.Ledger.DecideInto).
	rec load.Record
	// views and tried are buffers the next decision reuses.
	views []route.Replica
	tried []bool
}

// newDecision is an empty decision, a released one when there is one.
func (s *Router) newDecision() *decision {
	if d, ok := s.decisions.Get().(*decision); ok {
		return d
	}
	return new(decision)
}

// release hands back a decision once its request is over: the ledger has ended it (Done or
// Failed) and nothing reads it any more. One still in the ledger is left to the garbage
// collector instead, so a missed end costs an allocation, never a live record.
func (s *Router) release(d *decision) {
	if d == nil || d.id != 0 {
		return
	}
	d.reps, d.rec = nil, load.Record{} // drop what the pool would keep alive
	s.decisions.Put(d)
}

// views is the decision's read-only view of every replica at now: one atomic load of each
// replica's fleet.View, no lock. It also returns the fleet's block size from the same views.
// It writes into out when out has the capacity.
func (s *Router) views(reps []*replica, now time.Time, out []route.Replica) ([]route.Replica, int) {
	if cap(out) < len(reps) {
		out = make([]route.Replica, len(reps))
	}
	out = out[:len(reps)]
	var bs fleet.BlockSizeVote
	for i, r := range reps {
		v := r.View()
		bs.Add(v)
		exact := v.Exact
		if s.exactHook != nil {
			exact = s.exactHook(r)
		}
		out[i] = route.Replica{Name: r.Name, ID: r.ID, Ready: v.Ready, Healthy: r.Eng.Health.Healthy(now),
			Approximate: !exact, WarmupCredit: s.warmupCredit(v.WarmupUntil, now), Queue: v.Figures.Waiting, KVUtil: v.Figures.KVUsage,
			Peer: s.peer.Load(r.Name)} // what the other router replicas have in flight there
	}
	size, _ := bs.Result(s.o.Config.BlockSize)
	return out, size
}

// decide scores every replica for the prompt (route.Decide) and, when commit is set, routes
// the request through the ledger (the policy picks, the ledger records the load and the
// predicted blocks in one step). tried marks replicas this request already failed on. A dry
// run (commit unset: /debug/route) changes no state: it asks the policy to explain itself and
// takes the cheapest candidate, or, for a policy without explanations, asks for its pick
// without recording it. unkeyed, when set, says why the request must not be keyed.
func (s *Router) decide(toks []uint32, id blockkey.Identity, session, unkeyed string, reps []*replica, tried map[*replica]bool, commit bool) (*decision, []score.Explanation, error) {
	return s.decideLeg(toks, id, session, unkeyed, reps, tried, commit, legWhole)
}

// decideLeg is decide booking what lg says on the chosen replica (disagg.go): the whole
// request, a decode leg that pulls its prompt, or, for legChoose, one of the two by the
// conditional-disaggregation threshold, chosen under the ledger's lock from the booking's own
// decision.
func (s *Router) decideLeg(toks []uint32, id blockkey.Identity, session, unkeyed string, reps []*replica, tried map[*replica]bool, commit bool, lg leg) (*decision, []score.Explanation, error) {
	t0 := time.Now()
	now := s.now()
	d := s.newDecision()
	d.reps, d.chosen, d.took, d.id, d.pulled, d.whole = reps, 0, 0, 0, false, ""
	views, bs := s.views(reps, now, d.views)
	d.views = views
	in := route.Input{Tokens: toks, Identity: id, Session: session, Unkeyed: unkeyed, BlockSize: bs, NowNs: now.UnixNano()}
	if len(tried) > 0 {
		d.tried = slices.Grow(d.tried[:0], len(reps))[:len(reps)]
		for i, r := range reps {
			d.tried[i] = tried[r]
		}
		in.Tried = d.tried
	}
	err := d.Decision.Decide(in, views, s.ix, s.ledger)
	if err != nil {
		s.release(d)
		return nil, nil, err
	}
	if d.Unkeyed != "" && commit {
		s.met.UnkeyedRequests.WithLabelValues(d.Unkeyed).Inc()
		s.logLimited("unkeyed:"+d.Unkeyed, "request routed by load without keys; counted in kvroute_router_unkeyed_requests_total",
			"reason", d.Unkeyed)
	}
	if !commit {
		ex := s.ledger.Explain(&d.Req, d.Cands)
		i := route.Cheapest(d.Cands, ex)
		if ex == nil {
			i, err = s.ledger.Pick(&d.Req, d.Cands)
		} else if i < 0 {
			err = score.ErrNoCandidate
		}
		d.took = time.Since(t0)
		d.chosen = i
		return d, ex, err
	}
	// The candidates were built outside the ledger's lock; the ledger re-reads what siblings
	// routed since then changed under it (route.Decision.Refresh), or concurrent siblings
	// would scatter.
	lid, _, err := s.ledger.DecideInto(&d.rec, &d.Decision, views, func(i int) load.Routing {
		// Outside the measured decision, still under the ledger's lock: a sibling decided right
		// after this one must already see it in the predicted side index.
		d.took = time.Since(t0)
		d.chosen = i
		rt := load.Routing{Replica: reps[i].Load, Keys: d.Req.Keys, Approximate: d.Cands[i].Approximate,
			Uncached: d.Uncached(i), Held: d.Req.Tokens, Cached: d.Cached[i],
			Tokens: toks, Identity: id, Multimodal: unkeyed == unkeyedMultimodal}
		switch lg {
		case legChoose:
			if d.whole = s.wholeReason(d, i); d.whole == "" {
				pull(&rt)
				d.pulled = true
			}
		case legDecode:
			pull(&rt)
			d.pulled = true
		}
		return rt
	})
	if err != nil {
		d.took = time.Since(t0)
		return d, nil, err
	}
	d.id = lid
	rep := reps[d.chosen]
	rep.C.Routed.Add(1)
	if d.Unkeyed == unkeyedMultimodal {
		rep.C.MultimodalRouted.Add(1)
	}
	return d, nil, nil
}

// accessLog logs one routed request in Options.AccessLogSample with the breakdown of its
// decision and the policy's explanation: each candidate's cost terms and the guard that
// excluded it, as /debug/route shows them. The explanation reads the decision's own candidates
// (the snapshot the pick saw, windows and load included) at the decision's time, so it is the
// decision's; it allocates, which only sampled decisions pay.
func (s *Router) accessLog(d *decision, p *prepared) {
	n := s.o.AccessLogSample
	if n <= 0 || s.routedCount.Add(1)%uint64(n) != 0 {
		return
	}
	s.log.Info("routed", "sample_every", n, "decision", s.routeAnswer(d, s.ledger.Explain(&d.Req, d.Cands), p))
}
