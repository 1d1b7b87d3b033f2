package app

import (
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
)

// A routed decision in the steady state (every replica already chosen once, so every side-index
// entry of the prompt exists) allocates nothing: keys, views, candidates, matches, the ledger's
// Record and the side-index records all reuse memory (the decision's share of
// BenchmarkDecision: an allocation per decision is garbage at every request). It covers what Generate does around forward: decide,
// the ledger's Done, release.
func TestSteadyStateDecisionDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not the program's under -race (sync.Pool drops items at random)")
	}
	for _, exact := range []bool{true, false} {
		name := "approximate"
		if exact {
			name = "exact"
		}
		t.Run("streams="+name, func(t *testing.T) {
			toks := promptTokens(32_000, 1)
			s, reps := benchServer(t, 16, toks)
			if exact {
				s.exactHook = func(*replica) bool { return true }
			}
			one := func() int {
				d, _, err := s.decide(toks, blockkey.Identity{}, "", "", reps, nil, true)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.ledger.Done(d.id, nil); err != nil {
					t.Fatal(err)
				}
				chosen := d.chosen
				d.id = 0
				s.release(d)
				return chosen
			}
			seen := map[int]bool{}
			for i := 0; i < 2000 && len(seen) < len(reps); i++ {
				seen[one()] = true
			}
			if len(seen) < len(reps) {
				t.Fatalf("warm-up chose %d of %d replicas", len(seen), len(reps))
			}
			if n := testing.AllocsPerRun(200, func() { one() }); n != 0 {
				t.Errorf("%v allocations per steady-state decision, want 0", n)
			}
		})
	}
}
