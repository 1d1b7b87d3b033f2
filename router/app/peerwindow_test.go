package app

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/peers"
	"github.com/kvroute/kvroute/router/peersync"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// A peer router's routed requests enter this router's balance windows: the kv
// policy's token and request bounds read the fleet's routed work, as one router's would, not
// this router's third of it. Each peer Routed change adds its uncached tokens and one request
// to its replica's window (a request routed without keys too); /debug/route's kv terms show
// them; a replayed batch is counted once. (Keys enter the predicted index: load.TestRoutedPeer.)
func TestPeerRoutedEntersTheWindow(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{KVEventsPort: 0})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	sink := peerSink(t, rt)
	b := &peersync.Batch{Peer: "router-b", Epoch: 1, Seq: 1, Sent: time.Now().UnixNano(), Deltas: []peersync.Delta{
		{Kind: peersync.Routed, Request: 1, Replica: "e1/0", Prefill: 480, Tokens: 512},
		{Kind: peersync.Routed, Request: 2, Replica: "e1/0", Prefill: 96, Tokens: 512},
	}}
	sink.ApplyPeer(b, time.Now())
	sink.ApplyPeer(b, time.Now()) // replayed: counted once
	now := rt.s.now().UnixNano()
	if w := rt.s.ledger.Window("e1/0", now); w.Tokens != 576 || w.Requests != 2 {
		t.Fatalf("e1/0's window after a peer routed 2 requests (480 + 96 uncached tokens) there: %+v", w)
	}
	if w := rt.s.ledger.Window("e0/0", now); w.Tokens != 0 || w.Requests != 0 {
		t.Fatalf("e0/0's window, where no router routed anything: %+v", w)
	}
	a := postJSON(t, rt.admin.URL+"/debug/route", idsPrompt(73, 256, 1, 16, 1))
	var ans RouteAnswer
	if a.status != 200 || json.Unmarshal(a.body, &ans) != nil || len(ans.Candidates) != 2 {
		t.Fatalf("/debug/route: %d %s", a.status, a.body)
	}
	for _, c := range ans.Candidates {
		p := c.Breakdown.Policy
		if p == nil {
			t.Fatalf("%s has no kv explanation: %s", c.Replica, a.body)
		}
		terms := map[string]float64{}
		for _, tm := range p.Terms {
			terms[tm.Name] = tm.Value
		}
		wantTok, wantReq := 0.0, 0.0
		if c.Replica == "e1/0" {
			wantTok, wantReq = 576, 2
		}
		if terms["windowed_tokens"] != wantTok || terms["windowed_requests"] != wantReq {
			t.Errorf("%s: windowed_tokens %v, windowed_requests %v; want %v, %v: %s", c.Replica,
				terms["windowed_tokens"], terms["windowed_requests"], wantTok, wantReq, a.body)
		}
	}
}

// A peer's progress on a replica's prefill moves the replica's PrefillSince, so kv's drain
// credit reads the replica's last progress whichever router saw it: a peer routing prefill to
// a replica with none pending starts it, the peer's first token and failure move it, its Done
// (after the first token) and a routing behind pending prefill do not, and a replayed batch
// changes nothing.
func TestPeerProgressMovesPrefillSince(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{KVEventsPort: 0})
	clk := &fakeClock{} // the ledger's clock: each step below moves it on, as time passing would
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) { o.Now = clk.now })
	rt.waitStreams(t, "exact")
	var e1 *replica
	for _, r := range rt.s.reps() {
		if r.Name == "e1/0" {
			e1 = r
		}
	}
	if e1 == nil || e1.Load.PrefillSince() != 0 {
		t.Fatalf("replica e1/0 missing or already progressed: %+v", e1)
	}
	sink := peerSink(t, rt)
	seq := uint64(0)
	apply := func(total int64, ds ...peersync.Delta) int64 {
		seq++
		b := &peersync.Batch{Peer: "router-b", Epoch: 1, Seq: seq, Sent: time.Now().UnixNano(), Deltas: ds}
		if total > 0 {
			b.Totals = []peersync.Total{{Replica: "e1/0", Load: peersync.Load{Prefill: total, Running: 1}}}
		}
		before := clk.now().UnixNano()
		sink.ApplyPeer(b, time.Now())
		return before
	}
	atLeast := func(what string, floor int64) int64 {
		t.Helper()
		got := e1.Load.PrefillSince()
		if got < floor {
			t.Fatalf("%s: since %d, want at least %d", what, got, floor)
		}
		return got
	}
	unchanged := func(what string, want int64) {
		t.Helper()
		if got := e1.Load.PrefillSince(); got != want {
			t.Fatalf("%s: since moved from %d to %d", what, want, got)
		}
	}
	started := atLeast("a peer routed to the idle replica", apply(480,
		peersync.Delta{Kind: peersync.Routed, Request: 1, Replica: "e1/0", Prefill: 480, Tokens: 512}))
	clk.advance(2 * time.Millisecond)
	apply(960, peersync.Delta{Kind: peersync.Routed, Request: 2, Replica: "e1/0", Prefill: 480, Tokens: 512})
	unchanged("a peer routed behind pending prefill", started)
	seq-- // the same batch delivered again
	apply(960, peersync.Delta{Kind: peersync.FirstToken, Request: 1, Replica: "e1/0", Tokens: 512})
	unchanged("a replayed batch", started)
	clk.advance(2 * time.Millisecond)
	first := atLeast("the peer's first token", apply(480, peersync.Delta{Kind: peersync.FirstToken, Request: 1, Replica: "e1/0", Tokens: 512}))
	if first <= started {
		t.Fatalf("since %d did not move past %d at the peer's first token", first, started)
	}
	clk.advance(2 * time.Millisecond)
	apply(480, peersync.Delta{Kind: peersync.Done, Request: 1, Replica: "e1/0"})
	unchanged("the peer's Done after its first token", first)
	clk.advance(2 * time.Millisecond)
	failed := atLeast("the peer's failure before a first token", apply(0, peersync.Delta{Kind: peersync.Failed, Request: 2, Replica: "e1/0"}))
	if failed <= first {
		t.Fatalf("since %d did not move past %d at the peer's failure", failed, first)
	}
}

// peerSink is a peer group attached to rt's ledger and fleet that joins no network: the
// batches a test hands its ApplyPeer are what a peer would have published.
func peerSink(t *testing.T, rt *router) *peers.Group {
	t.Helper()
	g, err := peers.New(peers.Options{Config: &config.Peers{ID: "router-a"}, Now: rt.s.now})
	if err != nil {
		t.Fatal(err)
	}
	g.Attach(rt.s.peerDeps())
	return g
}
