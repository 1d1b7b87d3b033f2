package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// rankDebug is what GET /debug/engines says of engine's rank 0 ("" and false when absent).
func rankDebug(t *testing.T, rt *router, engine string) (stream string, partial bool) {
	t.Helper()
	resp, err := http.Get(rt.admin.URL + "/debug/engines")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Engines []EngineInfo `json:"engines"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	for _, e := range v.Engines {
		if e.Name == engine && len(e.Ranks) > 0 {
			return e.Ranks[0].Stream, e.Ranks[0].Partial
		}
	}
	return "", false
}

// engineCache is rank 0's blocks as the engine's GET /debug/cache lists them.
func engineCache(t *testing.T, sim *vllmsim.Sim) []uint64 {
	t.Helper()
	resp, err := http.Get(sim.URL() + "/debug/cache")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var cs vllmsim.CacheState
	if err := json.NewDecoder(resp.Body).Decode(&cs); err != nil {
		t.Fatal(err)
	}
	return cs.Ranks[0].Hashes
}

// indexEquals reports whether the router's replica holds exactly the given GPU blocks.
func indexEquals(rt *router, engine string, want []uint64) bool {
	id, ok := rt.s.ix.Replica(engine, 0)
	if !ok {
		return false
	}
	tiers, err := rt.s.ix.Export(id)
	if err != nil || len(tiers[index.GPU]) != len(want) {
		return false
	}
	have := map[uint64]bool{}
	for _, e := range tiers[index.GPU] {
		have[e.Hash] = true
	}
	for _, h := range want {
		if !have[h] {
			return false
		}
	}
	return true
}

// A router started after the engine's replay ring wrapped, given the engine's snapshot endpoint
// in its --engine spec, is exact within seconds with the engine's whole cache; the same router
// without snapshot= can only replay the ring and stays partial.
func TestLateRouterExactFromEngineSnapshot(t *testing.T) {
	sim := startSim(t, vllmsim.Config{KVSnapshotPort: -1, BufferSteps: 4, NumGPUBlocks: 32})
	for i := range 12 { // a batch or more each: the 4-batch ring wraps
		if a := postJSON(t, sim.URL()+"/v1/completions", idsPrompt(i, 64, i, 16, 1)); a.status != 200 {
			t.Fatalf("status %d: %s", a.status, a.body)
		}
	}
	if len(sim.SnapshotEndpoints()) != 1 {
		t.Fatalf("snapshot endpoints %v", sim.SnapshotEndpoints())
	}
	spec := fmt.Sprintf("e=%s;events=%s;replay=%s", sim.URL(), strings.Join(sim.EventEndpoints(), ","), strings.Join(sim.ReplayEndpoints(), ","))
	parse := func(spec string) discovery.Engine {
		e, err := discovery.ParseEngineFlag(spec)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}

	// The control: the ring alone cannot rebuild what the engine holds.
	ringOnly := startRouter(t, discovery.NewStatic([]discovery.Engine{parse(spec)}), nil)
	testkit.WaitFor(t, waitBound, "the ring-only router's replay", func() bool {
		for _, e := range ringOnly.s.Engines() {
			if r := e.Ranks[0]; r.Replays > 0 && r.Stream != "replaying" {
				return true
			}
		}
		return false
	})
	stream, partial := rankDebug(t, ringOnly, "e")
	if stream == "exact" || !partial {
		t.Fatalf("ring-only router: stream %s partial %v; the ring should have wrapped", stream, partial)
	}
	t.Logf("ring-only router: stream %s, partial", stream)

	start := time.Now()
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{parse(spec + ";snapshot=" + sim.SnapshotEndpoints()[0])}), nil)
	want := engineCache(t, sim)
	testkit.WaitFor(t, 5*time.Second, "exact with the engine's cache from its snapshot", func() bool {
		stream, partial := rankDebug(t, rt, "e")
		return stream == "exact" && !partial && indexEquals(rt, "e", want)
	})
	t.Logf("exact %v after the router started, %d blocks", time.Since(start).Round(time.Millisecond), len(want))
	if len(want) == 0 {
		t.Fatal("the engine caches nothing; the test proves nothing")
	}
	// The ring-only router is still not exact: nothing since has filled its gap.
	if stream, partial := rankDebug(t, ringOnly, "e"); stream == "exact" || !partial {
		t.Fatalf("ring-only router became stream %s partial %v", stream, partial)
	}
}
