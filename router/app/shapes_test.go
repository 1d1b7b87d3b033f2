package app

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// A router in front of engines that publish each of the three batch shapes vLLM has used (E1
// array batch of array events, E2 map batch of map events, E3 array batch of map events; the
// simulator's encoder is its own, checked against vLLM's bytes) indexes exactly what each
// engine holds: every block hash in the engine's /debug/cache, and no other.
func TestEveryBatchShapeIndexesExactly(t *testing.T) {
	var sims []*vllmsim.Sim
	var es []discovery.Engine
	for i, shape := range []string{"E1", "E2", "E3"} {
		s := startSim(t, vllmsim.Config{KVEventsPort: 0, KVReplayPort: 0, EventLayout: shape})
		sims = append(sims, s)
		es = append(es, simEngine(fmt.Sprintf("e%d", i), s))
	}
	rt := startRouter(t, discovery.NewStatic(es), nil)
	rt.waitStreams(t, "exact")
	// Enough distinct prompts, some sharing a prefix, that every engine stores blocks.
	var bodies []string
	for p := range 6 {
		bodies = append(bodies, idsPrompt(p%3, 64, p, 32, 2))
	}
	routeAll(t, rt.api.URL, bodies, 3)
	for i, s := range sims { // and one straight to each engine, so none is left empty
		postJSON(t, s.URL()+"/v1/completions", idsPrompt(10+i, 48, 0, 0, 1))
	}
	for i, s := range sims {
		name := fmt.Sprintf("e%d", i)
		id, ok := rt.s.ix.Replica(name, 0)
		if !ok {
			t.Fatalf("%s has no replica", name)
		}
		testkit.WaitFor(t, waitBound, name+" index equal to the engine's cache", func() bool {
			want := s.CacheState().Ranks[0].Hashes
			st, err := rt.s.ix.Stats(id)
			if err != nil || len(want) == 0 || st.Blocks[index.GPU] != len(want) {
				return false
			}
			for _, h := range want {
				if _, ok := rt.s.ix.ParentKey(id, h); !ok {
					return false
				}
			}
			return true
		})
		st, _ := rt.s.sub.Stats(name, 0)
		if st.DecodeErrors != 0 || st.UnknownParent != 0 || st.RekeyErrors != 0 || st.State.String() != "exact" {
			t.Errorf("%s (%s): decode errors %d, unknown parents %d, rekey errors %d, state %v",
				name, sims[i].Config().EventLayout, st.DecodeErrors, st.UnknownParent, st.RekeyErrors, st.State)
		}
	}
}
