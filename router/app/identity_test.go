package app

import (
	"encoding/json"
	"fmt"
	"net"
	"testing"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

func withField(body, field string, v any) string {
	var m map[string]any
	_ = json.Unmarshal([]byte(body), &m)
	m[field] = v
	b, _ := json.Marshal(m)
	return string(b)
}

// A LoRA adapter's blocks and a salted prompt's blocks only attract requests with the same
// adapter or salt: the identity is in the keys, as in the engine's hashes.
func TestLoRAAndCacheSaltIdentity(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{LoRAAdapters: []string{"ad1"}})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	base := idsPrompt(61, 320, 1, 3, 1)
	lora := withField(base, "model", "ad1")
	if a := postJSON(t, f.sims[1].URL()+"/v1/completions", lora); a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	salted := withField(base, "cache_salt", "tenant-a")
	if a := postJSON(t, f.sims[2].URL()+"/v1/completions", salted); a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	testkit.WaitFor(t, waitBound, "both indexed", func() bool {
		es := rt.s.Engines()
		return es[1].Ranks[0].Blocks["GPU"] >= 20 && es[2].Ranks[0].Blocks["GPU"] >= 20
	})
	for _, c := range []struct {
		body, want string
		cached     int
	}{
		{withField(idsPrompt(61, 320, 2, 20, 1), "model", "ad1"), "e1", 320},
		{withField(idsPrompt(61, 320, 3, 20, 1), "cache_salt", "tenant-a"), "e2", 320},
	} {
		a := postJSON(t, rt.api.URL+"/v1/completions", c.body)
		if a.header.Get("x-kvroute-engine") != c.want || a.cachedTokens(t) != c.cached {
			t.Fatalf("routed to %q cached %d; want %s with %d", a.header.Get("x-kvroute-engine"), a.cachedTokens(t), c.want, c.cached)
		}
	}
	// The base model with the same tokens has no hit anywhere: the router must predict none.
	var ans RouteAnswer
	a := postJSON(t, rt.admin.URL+"/debug/route", idsPrompt(61, 320, 4, 20, 1))
	if err := json.Unmarshal(a.body, &ans); err != nil {
		t.Fatalf("%s: %v", a.body, err)
	}
	for _, c := range ans.Candidates {
		if c.CachedTokens != 0 {
			t.Fatalf("base-model request predicted %d cached on %s", c.CachedTokens, c.Replica)
		}
	}
	if ans.LoRA != "" || ans.Blocks != 21 || ans.Tokens != 340 {
		t.Fatalf("debug route %+v", ans)
	}
}

// Engines added and removed at runtime; a new incarnation of an engine restarts its streams.
func TestEnginesChangeAtRuntime(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{})
	first := f.engines()
	first[0].Incarnation = "uid-0"
	src := newPushSource(first[:1])
	rt := startRouter(t, src, nil)
	rt.waitStreams(t, "exact")
	es := f.engines()
	es[0].Incarnation = "uid-0"
	es[1].Incarnation = "uid-1"
	src.ch <- es
	testkit.WaitFor(t, waitBound, "second engine added", func() bool { return len(rt.s.Engines()) == 2 })
	rt.waitStreams(t, "exact")
	if a := postJSON(t, f.sims[1].URL()+"/v1/completions", idsPrompt(71, 320, 1, 3, 1)); a.status != 200 {
		t.Fatal(a.status)
	}
	testkit.WaitFor(t, waitBound, "e1 indexed", func() bool { return rt.s.Engines()[1].Ranks[0].Blocks["GPU"] >= 20 })
	if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(71, 320, 2, 3, 1)); a.header.Get("x-kvroute-engine") != "e1" {
		t.Fatalf("routed to %q", a.header.Get("x-kvroute-engine"))
	}
	// A restart seen by discovery drops e1's entries at once.
	es[1].Incarnation = "uid-2"
	src.ch <- es
	testkit.WaitFor(t, waitBound, "restart applied", func() bool {
		r := rt.s.Engines()[1].Ranks[0]
		return r.Resets > 0 || r.Blocks["GPU"] == 0
	})
	src.ch <- es[:1]
	testkit.WaitFor(t, waitBound, "e1 removed", func() bool { return len(rt.s.Engines()) == 1 })
	for i := range 4 {
		if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(71, 320, 10+i, 3, 1)); a.header.Get("x-kvroute-engine") != "e0" {
			t.Fatalf("routed to removed engine: %q", a.header.Get("x-kvroute-engine"))
		}
	}
}

// Bound mode: the engine dials the router's --events-bind socket; its stream is found by topic.
func TestBoundModeEvents(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	// Bind first: a PUB dialling a closed loopback port in the ephemeral range can connect to
	// itself (TCP simultaneous open) and never reach the router.
	src := newPushSource(nil)
	rt := startRouter(t, src, func(o *Options) { o.EventsBind = bind })
	sim := startSim(t, vllmsim.Config{KVEventsConnect: bind})
	src.ch <- []discovery.Engine{{Name: "b0", URL: sim.URL(), Replay: sim.ReplayEndpoints(), Ready: true}}
	testkit.WaitFor(t, waitBound, "engine added", func() bool { return len(rt.s.Engines()) == 1 })
	rt.waitStreams(t, "exact")
	// A PUB that dials in drops what it sends before its connection is up, and a lost tail
	// is only noticed at the next batch: keep sending until the index has the blocks.
	i := 0
	testkit.WaitFor(t, waitBound, "events over the bound socket", func() bool {
		i++
		if a := postJSON(t, sim.URL()+"/v1/completions", idsPrompt(81, 320, i, 3, 1)); a.status != 200 {
			t.Fatal(a.status)
		}
		return rt.s.Engines()[0].Ranks[0].Blocks["GPU"] >= 20
	})
}
