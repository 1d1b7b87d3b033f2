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

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Bound mode with an engine that is down when the router starts: its /v1/models cannot be read,
// so the topic its events will carry (<prefix>@<host>:<port>@<model>) is unknown and nothing it
// sends would match. Once a probe finds it up, the router reads its models, re-adds its stream
// under the right topic — replayed from the engine's ring, given as a replay endpoint without
// an events endpoint, bound mode's shape — and learns its LoRA adapters.
func TestBoundModeEngineDownAtStart(t *testing.T) {
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	httpPort, replayPort := freePort(t), freePort(t)
	late := discovery.Engine{Name: "late", URL: fmt.Sprintf("http://127.0.0.1:%d", httpPort), Ready: true,
		Replay: []string{fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)}}
	rt := startRouter(t, newPushSource([]discovery.Engine{late}), func(o *Options) { o.EventsBind = bind })
	if es := rt.s.Engines(); len(es) != 1 || es[0].Model != "" || es[0].Ranks[0].Stream == "none" {
		t.Fatalf("before the engine is up: %+v", es)
	}
	sim := startSim(t, vllmsim.Config{Port: httpPort, KVEventsConnect: bind, KVReplayPort: replayPort, LoRAAdapters: []string{"ad1"}})
	// Events sent before the router knows the topic (and before the dial-in connects) are
	// lost on the wire; the re-added stream replays them from the ring.
	if a := postJSON(t, sim.URL()+"/v1/completions", idsPrompt(91, 320, 1, 3, 1)); a.status != 200 {
		t.Fatal(a.status)
	}
	testkit.WaitFor(t, waitBound, "models read", func() bool { return rt.s.Engines()[0].Model == "vllm-sim" })
	rt.waitStreams(t, "exact")
	testkit.WaitFor(t, waitBound, "the early blocks replayed into the index", func() bool {
		return rt.s.Engines()[0].Ranks[0].Blocks["GPU"] >= 20
	})
	// And live events over the bound socket now match the topic.
	before := rt.s.Engines()[0].Ranks[0].Blocks["GPU"]
	i := 1
	testkit.WaitFor(t, waitBound, "live events over the bound socket", func() bool {
		i++
		if a := postJSON(t, sim.URL()+"/v1/completions", idsPrompt(92+i, 320, i, 3, 1)); a.status != 200 {
			t.Fatal(a.status)
		}
		return rt.s.Engines()[0].Ranks[0].Blocks["GPU"] > before
	})
	var ans RouteAnswer
	a := postJSON(t, rt.admin.URL+"/debug/route", withField(idsPrompt(91, 320, 2, 3, 1), "model", "ad1"))
	if err := json.Unmarshal(a.body, &ans); err != nil || ans.LoRA != "ad1" {
		t.Fatalf("adapter not learned: %d %s", a.status, a.body)
	}
	// The re-added engine keeps routing: the replayed prefix attracts its sibling.
	if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(91, 320, 5, 3, 1)); a.status != 200 ||
		a.header.Get("x-kvroute-predicted-cached-tokens") != fmt.Sprint(a.cachedTokens(t)) {
		t.Fatalf("%d predicted %s cached %d", a.status, a.header.Get("x-kvroute-predicted-cached-tokens"), a.cachedTokens(t))
	}
}
