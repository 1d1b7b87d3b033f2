package replay

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// TestReplayEndToEnd replays a tiny siblings slice through real vllm-sim and kvrouter processes:
// 2 engines, 2 policies, 1 seed, 24 requests, bounded to about 20 s.
func TestReplayEndToEnd(t *testing.T) {
	dir := buildBinaries(t)
	w, err := Regime("siblings", RegimeOptions{Requests: 24, Rate: 20, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{SimBin: filepath.Join(dir, "vllm-sim"), RouterBin: filepath.Join(dir, "kvrouter"), Replicas: 2,
		Policies: []string{"kv", "round-robin"}, Seeds: 1, FirstSeed: 3, Concurrency: 16, Tokens: Tokenizer{PerBlock: 16},
		OutputScale: 1, MaxOutputTokens: 4, Model: "vllm-sim", LogDir: t.TempDir(), Drain: 15 * time.Second,
		SimArgs: []string{"--decode-ms-per-token", "2", "--num-gpu-blocks", "512"}}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	runs, err := Replay(ctx, o, w)
	if err != nil {
		t.Fatal(err)
	}
	if runs[0].Seed != 3 || runs[1].Seed != 3 {
		t.Fatalf("seeds %d, %d; want FirstSeed 3", runs[0].Seed, runs[1].Seed)
	}
	sum := Summarize(runs)
	if len(sum) != 2 {
		t.Fatalf("%d summaries, want 2", len(sum))
	}
	for _, s := range sum {
		if s.Errors != 0 {
			t.Fatalf("%s: %d errors: %v", s.Policy, s.Errors, s.FirstErrors)
		}
		if !(s.TTFTP90.Mean > 0) || s.CachedRatio.Mean <= 0 {
			t.Fatalf("%s: ttft p90 %v, cached %v", s.Policy, s.TTFTP90.Mean, s.CachedRatio.Mean)
		}
	}
	engines := map[string]bool{}
	for _, oc := range runs[1].Outcomes {
		engines[oc.Engine] = true
	}
	if len(engines) != 2 {
		t.Fatalf("round-robin used engines %v, want both", engines)
	}
	// Siblings share 12 of 15 blocks: kv co-locates a burst, so it caches at least as much.
	if sum[0].CachedRatio.Mean+0.02 < sum[1].CachedRatio.Mean {
		t.Fatalf("kv cached %.2f < round-robin %.2f", sum[0].CachedRatio.Mean, sum[1].CachedRatio.Mean)
	}
}

// TestCapacityEndToEnd runs a tiny capacity search through real processes: 2 engines, 2
// policies, 1 seed, 2 probes each (an SLO every probe meets, so the search ramps up), and checks
// that the policies' probes alternate, each run reports the machine's CPU, and a ratio comes out.
func TestCapacityEndToEnd(t *testing.T) {
	dir := buildBinaries(t)
	o := Options{SimBin: filepath.Join(dir, "vllm-sim"), RouterBin: filepath.Join(dir, "kvrouter"), Replicas: 2,
		Policies: []string{"kv", "round-robin"}, Seeds: 1, Concurrency: 16, Tokens: Tokenizer{PerBlock: 16},
		OutputScale: 1, MaxOutputTokens: 4, Model: "vllm-sim", LogDir: t.TempDir(), Drain: 15 * time.Second,
		SimArgs: []string{"--decode-ms-per-token", "2", "--num-gpu-blocks", "512"}}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := CapacityOptions{Policy: "kv", Start: 10, SLO: 60, TimeScale: 1, MaxSeeds: 1, Target: 0.03, Precision: 0.05, MaxProbes: 2}
	res, err := Capacity(ctx, o, c, func(rate float64, seed int) (Workload, error) {
		return Regime("siblings", RegimeOptions{Requests: 16, Rate: rate, Seed: uint64(seed)})
	})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, p := range res.Probes {
		order = append(order, p.Policy)
		if !p.Met || p.CPU.Host <= 0 || p.CPU.Host > 1 || p.CPU.Replay <= 0 {
			t.Errorf("probe %+v: want the SLO met and CPU shares in (0, 1]", p)
		}
	}
	if want := []string{"kv", "round-robin", "kv", "round-robin"}; fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("probe order %v, want %v (interleaved)", order, want)
	}
	// Both passed at 10 and 20 req/s: capacity 20 each (the search stopped at its probe bound).
	if res.Capacity["kv"][0] != 20 || res.Capacity["round-robin"][0] != 20 || res.Ratio[0] != 1 {
		t.Errorf("capacities %v, ratio %v", res.Capacity, res.Ratio)
	}
}

// TestWarmUpServesTheFleetBeforeTheMeasuredRequests: a run with Workload.Warm sends the warm-up
// through the routers first and measures only Requests, so a measured request that repeats a
// warm-up prompt finds it cached from the first one on, where the same run from cold engines
// computes it. Real vllm-sim and kvrouter processes, 2 engines, kv.
func TestWarmUpServesTheFleetBeforeTheMeasuredRequests(t *testing.T) {
	dir := buildBinaries(t)
	doc := func(id uint64) []uint64 { return []uint64{id, id + 1, id + 2, id + 3} }
	var w Workload
	for i := range 4 {
		r := Request{At: time.Duration(i) * 50 * time.Millisecond, HashIDs: doc(uint64(100 * (i + 1))), InputLength: 2048, OutputLength: 4}
		w.Warm = append(w.Warm, r)
		w.Requests = append(w.Requests, r)
	}
	o := Options{SimBin: filepath.Join(dir, "vllm-sim"), RouterBin: filepath.Join(dir, "kvrouter"), Replicas: 2,
		Policies: []string{"kv"}, Seeds: 1, Concurrency: 8, Tokens: Tokenizer{PerBlock: 16}, BlockSize: 16,
		OutputScale: 1, MaxOutputTokens: 2, Model: "vllm-sim", LogDir: t.TempDir(), Drain: 15 * time.Second,
		SimArgs: []string{"--decode-ms-per-token", "2", "--num-gpu-blocks", "512", "--block-size", "16"}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cached := func(w Workload) []int {
		t.Helper()
		runs, err := Replay(ctx, o, w)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(runs[0].Outcomes); got != len(w.Requests) {
			t.Fatalf("%d outcomes, want the %d measured requests only", got, len(w.Requests))
		}
		var c []int
		for _, oc := range runs[0].Outcomes {
			if oc.Err != "" {
				t.Fatalf("request %d: %s", oc.Index, oc.Err)
			}
			c = append(c, oc.CachedTokens)
		}
		return c
	}
	warm := cached(w)
	w.Warm = nil
	cold := cached(w)
	for i := range warm {
		// 64 prompt tokens in 16-token blocks: the engine reuses every full block but the last
		// (vLLM recomputes a fully cached prompt's last token), so 48.
		if warm[i] < 48 {
			t.Errorf("warm fleet: request %d cached %d tokens, want >= 48 (its prompt was served in the warm-up)", i, warm[i])
		}
		if cold[i] != 0 {
			t.Errorf("cold fleet: request %d cached %d tokens, want 0 (every prompt is new)", i, cold[i])
		}
	}
}
