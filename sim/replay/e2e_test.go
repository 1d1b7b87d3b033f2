package replay

import (
	"context"
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
