package peers

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/fleet"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/peersync"
)

// fakeLedger records what the group tells the ledger.
type fakeLedger struct {
	routed   map[string]int // uncached tokens by replica
	progress map[string]int // PeerProgress calls by replica
}

func (l *fakeLedger) RoutedPeer(r *load.Replica, _ []blockkey.Key, uncached int) {
	l.routed[r.Name] += uncached
}
func (l *fakeLedger) PeerProgress(r *load.Replica)                      { l.progress[r.Name]++ }
func (l *fakeLedger) ExportApprox(*load.Replica, int) []index.SideEntry { return nil }
func (l *fakeLedger) ImportApprox(*load.Replica, []index.SideEntry)     {}

type fakeFleet []*fleet.Replica

func (f fakeFleet) Replicas() []*fleet.Replica { return f }
func (f fakeFleet) Snapshot() ([]*fleet.Replica, map[string]*fleet.Engine) {
	return f, map[string]*fleet.Engine{}
}

// The group is the one owner of the peers' load share: ApplyPeer writes it, Load and Prefill
// read it. A peer's routed prefill enters the ledger once (a replayed batch changes nothing),
// starts an idle replica's drain, and a replica this router does not know is skipped.
func TestApplyPeerOwnsTheShare(t *testing.T) {
	g, err := New(Options{Config: &config.Peers{ID: "router-a"}})
	if err != nil {
		t.Fatal(err)
	}
	l := &fakeLedger{routed: map[string]int{}, progress: map[string]int{}}
	g.Attach(Deps{Ledger: l, Fleet: fakeFleet{{Name: "e0/0", Load: &load.Replica{Name: "e0/0"}}}})
	g.Observer().Routed(1, &load.Record{Routing: load.Routing{Replica: &load.Replica{Name: "e0/0"}}}) // not joined: publishes nothing, no panic
	b := &peersync.Batch{Peer: "router-b", Epoch: 1, Seq: 1, Sent: time.Now().UnixNano(),
		Totals: []peersync.Total{{Replica: "e0/0", Load: peersync.Load{Prefill: 480, Running: 1}}},
		Deltas: []peersync.Delta{
			{Kind: peersync.Routed, Request: 1, Replica: "e0/0", Prefill: 480, Tokens: 512},
			{Kind: peersync.Routed, Request: 2, Replica: "gone/0", Prefill: 64, Tokens: 64},
		}}
	g.ApplyPeer(b, time.Now())
	g.ApplyPeer(b, time.Now()) // replayed
	if l.routed["e0/0"] != 480 || l.progress["e0/0"] != 1 || len(l.routed) != 1 {
		t.Fatalf("ledger told routed %v, progress %v; want e0/0 480 once and one progress", l.routed, l.progress)
	}
	if got := g.Load("e0/0"); got.PrefillTokens != 480 || got.Running != 1 {
		t.Fatalf("peers' load on e0/0: %+v, want the batch's total", got)
	}
	if got := g.Prefill("e0/0"); got != 480 {
		t.Fatalf("peers' prefill on e0/0: %d, want 480", got)
	}
	var alone *Group
	if got := alone.Load("e0/0"); got != (load.Load{}) || alone.NotReady() != "" || alone.SeedStream("e0", 0, "x") != nil {
		t.Fatalf("a router alone reads peers' load %+v", got)
	}
}
