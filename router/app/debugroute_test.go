package app

import (
	"encoding/json"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// explaining wraps the kv policy with an explanation and counts every call that may change
// a policy's state.
type explaining struct {
	score.Policy
	mu                          sync.Mutex
	picks, routed, retracts, ex int
}

func (p *explaining) Pick(req *score.Request, cands []score.Candidate) (int, error) {
	p.mu.Lock()
	p.picks++
	p.mu.Unlock()
	return p.Policy.Pick(req, cands)
}

func (p *explaining) OnRouted(req *score.Request, cands []score.Candidate, i int) {
	p.mu.Lock()
	p.routed++
	p.mu.Unlock()
	p.Policy.OnRouted(req, cands, i)
}

func (p *explaining) Retract(req *score.Request, cands []score.Candidate, i int) {
	p.mu.Lock()
	p.retracts++
	p.mu.Unlock()
	p.Policy.(score.Retractor).Retract(req, cands, i)
}

// Explain costs each candidate by its uncached prompt blocks, the second one excluded.
func (p *explaining) Explain(req *score.Request, cands []score.Candidate) []score.Explanation {
	p.mu.Lock()
	p.ex++
	p.mu.Unlock()
	out := make([]score.Explanation, len(cands))
	for i, c := range cands {
		unc := float64(len(req.Keys) - max(c.ExactBlocks, c.PredictedBlocks))
		out[i] = score.Explanation{Cost: unc, Terms: []score.Term{{Name: "uncached_blocks", Value: unc}}}
	}
	if len(out) > 1 {
		out[1].Excluded = "test_guard"
	}
	return out
}

func (p *explaining) calls() [4]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return [4]int{p.picks, p.routed, p.retracts, p.ex}
}

// routerState is everything a decision reads or a routed request writes: the ledger (requests
// in flight, side-index entries, every replica's load), the exact index, the decision counters.
type routerState struct {
	Ledger  load.Stats
	Loads   map[string]load.Load
	Keys    int
	Blocks  map[string][index.NumTiers]int
	Routed  map[string]uint64
	Decided uint64
}

func stateOf(t *testing.T, s *Router) routerState {
	t.Helper()
	st := routerState{Ledger: s.ledger.Stats(), Loads: map[string]load.Load{}, Keys: s.ix.Keys(),
		Blocks: map[string][index.NumTiers]int{}, Routed: map[string]uint64{}, Decided: s.routedCount.Load()}
	for _, r := range s.reps() {
		st.Loads[r.Name] = r.Load.Load()
		st.Routed[r.Name] = r.C.Routed.Load()
		is, err := s.ix.Stats(r.ID)
		if err != nil {
			t.Fatal(err)
		}
		st.Blocks[r.Name] = is.Blocks
	}
	return st
}

// POST /debug/route answers with the pick and every candidate's breakdown and changes no
// router state: the ledger, the index, the load and the policy (no Pick, OnRouted or Retract
// when the policy explains itself) are the same before and after.
func TestDebugRouteChangesNoState(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{KVEventsPort: 0})
	kv, err := score.New("kv", score.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	pol := &explaining{Policy: kv}
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) { o.Policy = pol; o.AccessLogSample = 1 })
	rt.waitStreams(t, "exact")
	for i := range 3 {
		if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(70, 256, i, 16, 1)); a.status != 200 {
			t.Fatalf("%d %s", a.status, a.body)
		}
	}
	settled(t, rt)
	before, calls := stateOf(t, rt.s), pol.calls()
	if calls[0] != 3 || calls[1] != 3 {
		t.Fatalf("policy calls %v after 3 requests", calls)
	}
	for i := range 4 {
		a := postJSON(t, rt.admin.URL+"/debug/route", idsPrompt(70, 256, 100+i, 16, 1))
		var ans RouteAnswer
		if a.status != 200 || json.Unmarshal(a.body, &ans) != nil {
			t.Fatalf("/debug/route: %d %s", a.status, a.body)
		}
		if len(ans.Candidates) != 3 || ans.Pick == "" || ans.Pick != ans.Chosen {
			t.Fatalf("answer %s", a.body)
		}
		cheapest := -1
		for j, c := range ans.Candidates {
			b := c.Breakdown
			if b.Policy == nil || len(b.Policy.Terms) != 1 || b.CachedTokens != c.CachedTokens ||
				b.CachedTokens+b.UncachedTokens != ans.Tokens || b.PrefillTokens != c.PrefillTokens {
				t.Fatalf("candidate %d breakdown %+v", j, b)
			}
			if j == 1 {
				if b.Policy.Excluded != "test_guard" {
					t.Fatalf("policy guard not shown: %+v", b)
				}
				continue
			}
			if cheapest < 0 || b.Policy.Cost < ans.Candidates[cheapest].Breakdown.Policy.Cost {
				cheapest = j
			}
		}
		if ans.Pick != ans.Candidates[cheapest].Replica {
			t.Fatalf("pick %s, cheapest eligible %s", ans.Pick, ans.Candidates[cheapest].Replica)
		}
		if len(ans.Candidates[0].Breakdown.Overlap.Tiers) != 3 || ans.Candidates[0].Breakdown.Overlap.Tiers[0] == 0 &&
			ans.Candidates[1].Breakdown.Overlap.Tiers[0] == 0 && ans.Candidates[2].Breakdown.Overlap.Tiers[0] == 0 {
			t.Fatalf("no replica shows the shared prefix's overlap: %s", a.body)
		}
	}
	after, callsAfter := stateOf(t, rt.s), pol.calls()
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("/debug/route changed the router's state:\nbefore %+v\nafter  %+v", before, after)
	}
	// The 3 routed requests were explained for the access log (sampled 1 in 1).
	if calls[3] != 3 {
		t.Errorf("%d explanations for 3 logged decisions, want 3", calls[3])
	}
	if want := [4]int{calls[0], calls[1], calls[2], calls[3] + 4}; callsAfter != want {
		t.Fatalf("policy calls (pick, routed, retract, explain) %v, want %v", callsAfter, want)
	}
	// The same request routed for real does change it: the comparison can fail.
	if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(70, 256, 100, 16, 1)); a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	if reflect.DeepEqual(after, stateOf(t, rt.s)) {
		t.Fatal("a routed request left no trace in the compared state")
	}
}

// The kv policy explains itself in /debug/route (its cost in prefill-token equivalents, each
// term and bound, the guard that excluded a candidate) without touching the ledger or the index.
func TestDebugRouteKVLeavesLedger(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{KVEventsPort: 0})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(71, 256, 1, 16, 1)); a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	settled(t, rt)
	before := stateOf(t, rt.s)
	a := postJSON(t, rt.admin.URL+"/debug/route", idsPrompt(71, 256, 2, 16, 1))
	var ans RouteAnswer
	if a.status != 200 || json.Unmarshal(a.body, &ans) != nil || ans.Pick == "" || len(ans.Candidates) != 2 {
		t.Fatalf("/debug/route: %d %s", a.status, a.body)
	}
	if after := stateOf(t, rt.s); !reflect.DeepEqual(before, after) {
		t.Fatalf("/debug/route changed the router's state:\nbefore %+v\nafter  %+v", before, after)
	}
	cheapest := ""
	best := 0.0
	for _, c := range ans.Candidates {
		p := c.Breakdown.Policy
		if p == nil || len(p.Terms) == 0 || p.Terms[0].Name != "uncached_tokens" {
			t.Fatalf("candidate %s has no kv explanation: %s", c.Replica, a.body)
		}
		// The policy's uncached tokens are the breakdown's (no warm-up credit here).
		if int(p.Terms[0].Value) != c.Breakdown.UncachedTokens {
			t.Errorf("%s: kv's uncached_tokens %v, the breakdown's %d", c.Replica, p.Terms[0].Value, c.Breakdown.UncachedTokens)
		}
		if p.Excluded == "" && (cheapest == "" || p.Cost < best) {
			cheapest, best = c.Replica, p.Cost
		}
	}
	if ans.Pick != cheapest {
		t.Errorf("pick %s, the cheapest explained candidate %s: %s", ans.Pick, cheapest, a.body)
	}
	// The replica holding the shared prefix is the cheaper one.
	for _, c := range ans.Candidates {
		if c.Replica == ans.Pick && c.Breakdown.CachedTokens == 0 {
			t.Errorf("picked %s, which holds none of the shared prefix: %s", ans.Pick, a.body)
		}
	}
}

// With AccessLogSample 2 every other routed request is logged once with its decision: the pick
// and each candidate's breakdown with the policy's explanation, as /debug/route gives them,
// taken with the pick (the windows before this request was recorded in them).
func TestAccessLogPrintsTheDecision(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{KVEventsPort: 0})
	var logs syncBuffer
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) {
		o.AccessLogSample = 2
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	rt.waitStreams(t, "exact")
	for i := range 4 {
		if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(72, 256, i, 16, 1)); a.status != 200 {
			t.Fatalf("%d %s", a.status, a.body)
		}
	}
	var lines []RouteAnswer
	for _, l := range strings.Split(logs.String(), "\n") {
		var rec struct {
			Msg      string      `json:"msg"`
			Sample   int         `json:"sample_every"`
			Decision RouteAnswer `json:"decision"`
		}
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Msg == "routed" {
			if rec.Sample != 2 {
				t.Errorf("sample_every %d, want 2", rec.Sample)
			}
			lines = append(lines, rec.Decision)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d access log lines for 4 requests sampled 1 in 2, want 2:\n%s", len(lines), logs.String())
	}
	for n, d := range lines {
		if d.Pick == "" || len(d.Candidates) != 2 || d.Policy != "kv" || d.Tokens == 0 {
			t.Errorf("access log decision %+v", d)
		}
		windowed := 0.0
		for _, c := range d.Candidates {
			if c.Breakdown.CachedTokens+c.Breakdown.UncachedTokens != d.Tokens {
				t.Errorf("candidate %s breakdown %+v does not split the prompt's %d tokens", c.Replica, c.Breakdown, d.Tokens)
			}
			pol := c.Breakdown.Policy
			if pol == nil || len(pol.Terms) == 0 || pol.Terms[0].Name != "uncached_tokens" {
				t.Fatalf("candidate %s has no policy explanation in the access log: %+v", c.Replica, c.Breakdown)
			}
			for _, term := range pol.Terms {
				if term.Name == "windowed_tokens" {
					windowed += term.Value
				}
			}
		}
		// The requests before this one were routed and recorded in the windows; this one was not
		// yet when its candidates were read. The first logged decision (the second request) sees
		// the first request's work only: at most one prompt, where candidates read after the
		// record would add this request's uncached tokens too.
		if windowed <= 0 || (n == 0 && windowed > float64(d.Tokens)) {
			t.Errorf("logged decision %d: the windows hold %v tokens for prompts of %d; want the earlier requests' work only", n, windowed, d.Tokens)
		}
		// The pick is the cheapest candidate the explanation leaves in (kv at temperature 0; the
		// shared prefix makes its holder cheaper, so there is no tie).
		cheapest := ""
		lo := math.Inf(1)
		for _, c := range d.Candidates {
			if pol := c.Breakdown.Policy; pol.Excluded == "" && pol.Cost < lo {
				cheapest, lo = c.Replica, pol.Cost
			}
		}
		if d.Pick != cheapest {
			t.Errorf("logged decision %d picked %s; its explanation's cheapest eligible is %s", n, d.Pick, cheapest)
		}
	}
}

// settled waits until the engines' events confirmed every predicted block: the index holds, per
// replica, what the ledger predicted there, so nothing moves while the state is compared.
func settled(t *testing.T, rt *router) {
	t.Helper()
	testkit.WaitFor(t, waitBound, "every predicted block indexed", func() bool {
		st := stateOf(t, rt.s)
		n := 0
		for _, b := range st.Blocks {
			n += b[0]
		}
		return n > 0 && n == st.Ledger.Predicted
	})
}
