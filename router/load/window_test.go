package load

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/score"
)

// The ledger owns the balance windows: a routed request's uncached tokens enter its
// replica's window at the decision's time and every healthy candidate's clock starts; a failed
// attempt takes its tokens back; a replica that leaves loses its window; the window's length is
// the kv policy's. The policy's own Pick and Explain write nothing.
func TestLedgerOwnsTheBalanceWindows(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	kv, err := score.New("kv", score.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	l := New(Options{Now: c.now, Policy: kv})
	if got := l.win.Span(); got != time.Duration(score.DefaultKV.WindowSeconds*float64(time.Second)) {
		t.Fatalf("window span %v, want kv's", got)
	}
	a, b := l.NewReplica(0, "e0/0"), l.NewReplica(1, "e1/0")
	now := c.t.UnixNano()
	req := &score.Request{Keys: keys(4), Tokens: 64, BlockSize: 16, NowNs: now}
	cands := []score.Candidate{{ID: "e0/0", Healthy: true}, {ID: "e1/0", Healthy: true}}
	routing := func(i int) Routing {
		r := []*Replica{a, b}[i]
		return Routing{Replica: r, Keys: keys(4), Uncached: 48, Held: 64}
	}
	id, rc, err := l.Decide(decision(req, cands), nil, routing)
	if err != nil {
		t.Fatal(err)
	}
	chosen, other := cands[rc.Chosen].ID, cands[1-rc.Chosen].ID
	if w := l.Window(chosen, now); w.Tokens != 48 || w.Requests != 1 || !w.Seen || w.Since != now {
		t.Fatalf("chosen replica's window %+v, want 48 tokens, 1 request, seen since the decision", w)
	}
	if w := l.Window(other, now); w.Tokens != 0 || w.Requests != 0 || !w.Seen {
		t.Fatalf("the other candidate's window %+v, want its clock started and nothing in it", w)
	}
	span := int64(l.win.Span())
	if w := l.Window(chosen, now+span); w.Tokens != 0 || w.Requests != 0 {
		t.Fatalf("window one span later %+v, want empty", w)
	}
	// Explain and a dry Pick change nothing in the windows.
	before := l.Window(chosen, now)
	l.Explain(req, cands)
	if _, err := l.Pick(req, cands); err != nil {
		t.Fatal(err)
	}
	if after := l.Window(chosen, now); after != before {
		t.Fatalf("Explain/Pick changed the window: %+v -> %+v", before, after)
	}
	if _, err := l.Failed(id); err != nil {
		t.Fatal(err)
	}
	if w := l.Window(chosen, now); w.Tokens != 0 {
		t.Fatalf("window after the failed attempt %+v, want its tokens taken back", w)
	}
	l.Remove([]*Replica{a, b}[rc.Chosen])
	if w := l.Window(chosen, now); w.Seen {
		t.Fatalf("a removed replica keeps its window: %+v", w)
	}
}
