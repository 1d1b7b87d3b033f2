package app

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/extproc"
	"github.com/kvroute/kvroute/router/extproc/gatewaytest"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// Two kvrouter pickers under one pool share their load (router/peers): requests picked by one
// and still in flight are in the other's view of each engine, and its picks (the load policy,
// no prefix to follow) go to the engine the first did not load; once the first's requests end
// the share drops back.
func TestTwoPickersShareLoad(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{})
	withPeers := func(id string, routes []string) func(*Options) {
		return func(o *Options) {
			o.Config.Policy = "load"
			o.Config.Peers = &config.Peers{ID: id, Subject: "kvroute.load.test", ClusterListen: "127.0.0.1:0", Routes: routes}
		}
	}
	a := startRouter(t, discovery.NewStatic(f.engines()), withPeers("picker-a", nil))
	b := startRouter(t, discovery.NewStatic(f.engines()), withPeers("picker-b", []string{a.s.PeerClusterAddr()}))
	gwB, _ := startPicker(t, b, false)
	testkit.WaitFor(t, waitBound, "the pickers see each other", func() bool { return len(a.s.Peers()) == 1 && len(b.s.Peers()) == 1 })

	// Picker a books three requests on one engine and holds them (the gateway has not answered).
	pa := a.s.Picker()
	var held []extproc.Booking
	loaded := ""
	for i := range 3 {
		p, ref := pa.Prepare(context.Background(), &extproc.Request{Method: "POST", Path: "/v1/completions", Body: []byte(idsPrompt(40+i, 64, 0, 0, 1))})
		if ref != nil {
			t.Fatalf("prepare: %d %s", ref.Status, ref.Body)
		}
		sub := extproc.Subset{} // the later ones onto the first one's engine
		if loaded != "" {
			sub = extproc.Subset{Set: true, Endpoints: []string{loaded}}
		}
		bk, err := pa.Pick(context.Background(), p, sub)
		if err != nil {
			t.Fatal(err)
		}
		loaded = bk.Endpoints()[0]
		held = append(held, bk)
	}
	peerRunning := func(rt *router, ep string) int64 {
		for _, e := range rt.s.Engines() {
			for _, en := range f.engines() {
				if en.Name == e.Name && hostOf(t, en.URL) == ep && e.Ranks[0].PeerInflight != nil {
					return e.Ranks[0].PeerInflight.Running
				}
			}
		}
		return 0
	}
	testkit.WaitFor(t, waitBound, "picker b sees a's three requests", func() bool { return peerRunning(b, loaded) == 3 })
	for i := range 2 {
		res, err := gwB.Do(context.Background(), gatewaytest.Request{Path: "/v1/completions", Body: []byte(idsPrompt(50+i, 64, 0, 0, 1))})
		if err != nil || res.Status != 200 || res.Endpoints[0] == loaded {
			t.Fatalf("picker b's request %d: %v, picked %v; want the engine a did not load (not %s)", i, err, res.Endpoints, loaded)
		}
	}
	for _, bk := range held {
		bk.End(extproc.Result{Phase: extproc.Abandoned, Reason: "gateway_closed"})
	}
	testkit.WaitFor(t, waitBound, "a's ended requests leave b's view", func() bool { return peerRunning(b, loaded) == 0 })
	testkit.WaitFor(t, waitBound, "every booking released", func() bool { return idle(a.s) && idle(b.s) })
}
