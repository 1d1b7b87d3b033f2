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
