package route_test

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/route"
	"github.com/kvroute/kvroute/router/score"
)

// The other routers' load on a replica (Replica.Peer) is added to the candidate's load terms,
// and the breakdown shows that part alone; a replica without any shows none.
func TestPeerLoadAddedToCandidates(t *testing.T) {
	now := time.Unix(1000, 0)
	ix := index.New(index.Options{Now: func() time.Time { return now }})
	l := load.New(load.Options{Now: func() time.Time { return now }, Policy: mustPolicy(t)})
	a := l.NewReplica(0, "e0/0")
	l.NewReplica(1, "e1/0")
	l.Routed(load.Routing{Replica: a, Uncached: 100, Held: 100})
	peer := load.Load{PrefillTokens: 300, DecodeTokens: 50, Running: 2}
	reps := []route.Replica{{Name: "e0/0", ID: 0, Ready: true, Healthy: true, Peer: peer},
		{Name: "e1/0", ID: 1, Ready: true, Healthy: true}}
	d, err := route.Decide(route.Input{Tokens: make([]uint32, 64), BlockSize: 16, NowNs: now.UnixNano()}, reps, ix, l)
	if err != nil {
		t.Fatal(err)
	}
	if c := d.Cands[0]; c.PrefillTokens != 400 || c.DecodeTokens != 50 || c.Running != 3 {
		t.Fatalf("candidate with a peer's load: prefill %d decode %d running %d, want 400 50 3", c.PrefillTokens, c.DecodeTokens, c.Running)
	}
	if c := d.Cands[1]; c.PrefillTokens != 0 || c.Running != 0 {
		t.Fatalf("candidate without load: %+v", c)
	}
	// The whole prefill is credited from the replica's last progress (score.PrefillAhead):
	// here this router's routing, the replica having been idle.
	if c := d.Cands[0]; c.PrefillSince != now.UnixNano() {
		t.Fatalf("candidate with a peer's prefill: since %d; want the routing's %d", c.PrefillSince, now.UnixNano())
	}
	bd := d.Breakdowns(nil)
	if bd[0].PeerLoad == nil || *bd[0].PeerLoad != peer || bd[1].PeerLoad != nil {
		t.Fatalf("breakdown peer load %+v, %+v; want %+v and none", bd[0].PeerLoad, bd[1].PeerLoad, peer)
	}
}

func mustPolicy(t *testing.T) score.Policy {
	t.Helper()
	p, err := score.New("load", score.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
