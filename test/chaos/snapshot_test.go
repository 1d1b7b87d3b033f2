package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// A lone kvrouter, restarted in front of an engine whose replay ring wrapped while it was down,
// is exact again within seconds when the engine offers a snapshot endpoint (vLLM PR #57789's
// protocol, which vllm-sim speaks): no peer to seed from, the ring alone could only give it a
// partial index (TestRouterStartInFrontOfWrappedRing).
func TestLoneRouterRestartExactFromSnapshot(t *testing.T) {
	sim, err := vllmsim.New(vllmsim.Config{KVEventsPort: -1, KVReplayPort: -1, KVSnapshotPort: -1,
		BufferSteps: 4, NumGPUBlocks: 32, TimeScale: 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = sim.Close() })
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	serve := func(from, n int) {
		for i := from; i < from+n; i++ {
			body := fmt.Sprintf(`{"model":"vllm-sim","max_tokens":1,"prompt":%s}`, promptIDs(i, 64))
			resp, err := http.Post(sim.URL()+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("engine answered %d", resp.StatusCode)
			}
		}
	}
	spec := fmt.Sprintf("e=%s;events=%s;replay=%s;snapshot=%s", sim.URL(), sim.EventEndpoints()[0],
		sim.ReplayEndpoints()[0], sim.SnapshotEndpoints()[0])
	args := []string{"--model", "vllm-sim", "--block-size", "16", "--engine", spec}
	kvrouterBin(t)

	serve(0, 12) // the 4-batch ring wraps before the first start too
	r := startRouter(t, args...)
	exactIn(t, r, sim, time.Now(), 10*time.Second)
	r.stop()

	serve(12, 12) // while no router listens: the ring wraps again
	t0 := time.Now()
	r = startRouter(t, args...)
	took := exactIn(t, r, sim, t0, 5*time.Second)
	t.Logf("MEASURE lone router restarted in front of a wrapped ring with a snapshot endpoint: exact with the engine's %d blocks %v after start",
		len(simCache(t, sim)), took.Round(time.Millisecond))
	if n, _ := r.metric("kvroute_router_stream_snapshots_total", `engine="e"`, `rank="0"`); n < 1 {
		t.Fatalf("no snapshot taken (%v)", n)
	}
	r.stop()
}

// exactIn waits until the router's replica is exact and holds as many GPU blocks as the
// engine's cache, and returns how long that took from t0.
func exactIn(t *testing.T, r *router, sim *vllmsim.Sim, t0 time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	var n, s float64
	want := 0
	if !testkit.Until(timeout, func() bool {
		r.alive()
		want = len(simCache(t, sim))
		n, _ = r.metric("kvroute_router_index_blocks_gpu", `engine="e"`, `rank="0"`)
		s, _ = r.metric("kvroute_router_stream_state", `engine="e"`, `rank="0"`, `state="exact"`)
		return want > 0 && n == float64(want) && s == 1
	}) {
		t.Fatalf("%v of %d blocks, exact %v, after %v\n%s", n, want, s, timeout, tail(r.logs(), 3000))
	}
	return time.Since(t0)
}

// simCache is the blocks the engine holds (vllm-sim's /debug/cache).
func simCache(t *testing.T, sim *vllmsim.Sim) []uint64 {
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

// promptIDs is a token-id prompt of n ids, distinct per p.
func promptIDs(p, n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(1000 + (p*7919+i*31)%100000)
	}
	return "[" + strings.Join(ids, ",") + "]"
}
