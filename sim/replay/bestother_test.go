package replay

import (
	"math"
	"slices"
	"testing"
)

// handRun is a hand-made run: every request of it has the same TTFT (so its p90 and p99 are that
// TTFT) and cached share; failed is the number of failed requests added.
func handRun(policy string, seed int, ttft, cached float64, failed int) *RunResult {
	r := &RunResult{Policy: policy, Seed: seed, Wall: 1, Engines: []string{"e0"}}
	for range 10 {
		r.Outcomes = append(r.Outcomes, Outcome{TTFT: ttft, E2E: ttft, PromptTokens: 100, CachedTokens: int(100 * cached), Engine: "e0"})
	}
	for range failed {
		r.Outcomes = append(r.Outcomes, Outcome{Err: "HTTP 502"})
	}
	if ttft < 0 { // every request failed
		r.Outcomes = []Outcome{{Err: "HTTP 502"}}
	}
	return r
}

func TestBestOtherRatiosLowerIsBetter(t *testing.T) {
	vals := map[string][]float64{
		"kv":          {1.0, 1.0, 1.0, 2.0},
		"round-robin": {0.8, 1.2, 0.5, math.NaN()},
		"load":        {0.9, 0.5, 0.5, math.NaN()},
		"prefix-char": {3.0, 3.0},
	}
	r, best := BestOtherRatios(vals, "kv", false)
	want := []float64{1.25, 2, 2}
	for i, w := range want {
		if math.Abs(r[i]-w) > 1e-12 {
			t.Errorf("seed %d: ratio %v, want %v", i+1, r[i], w)
		}
	}
	if !math.IsNaN(r[3]) {
		t.Errorf("seed 4 (no other policy measured): ratio %v, want NaN", r[3])
	}
	// The best other changes from seed 1 to 2; seed 3 is a tie, won by the first name.
	if !slices.Equal(best, []string{"round-robin", "load", "load", ""}) {
		t.Errorf("best others %v", best)
	}
	// Higher is better: the other way round.
	r, best = BestOtherRatios(vals, "kv", true)
	if r[0] != 1.0/3 || best[0] != "prefix-char" || r[2] != 2 || best[2] != "load" {
		t.Errorf("higher is better: %v %v", r, best)
	}
}

// PolicyRatios takes each seed's figures from that seed's runs alone: the best other policy is
// chosen per seed, not from the means over seeds.
func TestPolicyRatiosPerSeed(t *testing.T) {
	runs := []*RunResult{
		handRun("kv", 1, 1.0, 0.5, 0), handRun("load", 1, 0.9, 0.4, 0), handRun("round-robin", 1, 0.8, 0.25, 0), handRun("prefix-char", 1, 5, 0.6, 0),
		handRun("kv", 2, 1.0, 0.5, 0), handRun("load", 2, 0.5, 0.4, 0), handRun("round-robin", 2, 1.2, 0.25, 0), handRun("prefix-char", 2, 5, 0.6, 0),
		handRun("kv", 3, 1.1, 0.5, 0), handRun("load", 3, 1.0, 0.4, 0), handRun("round-robin", 3, 1.0, 0.25, 0), handRun("prefix-char", 3, -1, 0, 0),
	}
	rs := PolicyRatios(runs, "kv")
	if len(rs) != 3 || rs[0].Metric != "ttft_p90_s" || rs[1].Metric != "ttft_p99_s" || rs[2].Metric != "cached_ratio" {
		t.Fatalf("metrics %+v", rs)
	}
	for _, b := range rs[:2] {
		// Per seed the best other is round-robin (1.25), then load (2), then a tie of load and
		// round-robin (1.1), mean 1.45; means over seeds would give kv 1.033 / load 0.8 = 1.29.
		want := []float64{1.25, 2, 1.1}
		for i, w := range want {
			if b.PerSeed[i] == nil || math.Abs(*b.PerSeed[i]-w) > 1e-9 {
				t.Errorf("%s seed %d: %v, want %v", b.Metric, i+1, b.PerSeed[i], w)
			}
		}
		if !slices.Equal(b.BestOther, []string{"round-robin", "load", "load"}) || !slices.Equal(b.Seeds, []int{1, 2, 3}) {
			t.Errorf("%s: best others %v seeds %v", b.Metric, b.BestOther, b.Seeds)
		}
		if iv := TInterval(want); b.Ratio != iv || b.HalfWidth == nil || *b.HalfWidth != RelativeHalfWidth(iv) {
			t.Errorf("%s: interval %+v half-width %v, want %+v", b.Metric, b.Ratio, b.HalfWidth, iv)
		}
	}
	// Cached: higher is best; prefix-char, with no successful request in seed 3, is not a
	// candidate there.
	c := rs[2]
	if !slices.Equal(c.BestOther, []string{"prefix-char", "prefix-char", "load"}) || math.Abs(*c.PerSeed[2]-0.5/0.4) > 1e-9 {
		t.Errorf("cached: best others %v, seed 3 ratio %v", c.BestOther, *c.PerSeed[2])
	}
	if PolicyRatios(runs, "nope") != nil || PolicyRatios(runs[:1], "kv") != nil {
		t.Error("ratios without the policy under test, or without another policy")
	}
}

// The adaptive-seed rule: both TTFT ratios under the target from 3 seeds on, or the cap.
func TestTTFTRatiosSettled(t *testing.T) {
	mk := func(p90, p99 []float64) []BestOtherRatio {
		return []BestOtherRatio{{Metric: "ttft_p90_s", ratios: p90}, {Metric: "ttft_p99_s", ratios: p99},
			{Metric: "cached_ratio", ratios: []float64{1, 5, 9}}}
	}
	tight := []float64{1.20, 1.21, 1.19} // 2.1% relative half-width
	wide := []float64{1.0, 1.3, 1.1}
	for _, c := range []struct {
		name     string
		p90, p99 []float64
		max      int
		want     bool
	}{
		{"both tight", tight, tight, 10, true},
		{"p99 wide", tight, wide, 10, false},
		{"p90 wide", wide, tight, 10, false},
		{"two seeds", tight[:2], tight[:2], 10, false},
		{"wide at the cap", wide, wide, 3, true},
		{"a NaN seed leaves two ratios", []float64{1.2, math.NaN(), 1.2}, tight, 10, false},
	} {
		if got := TTFTRatiosSettled(mk(c.p90, c.p99), c.max, 0.03); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if TTFTRatiosSettled(nil, 10, 0.03) {
		t.Error("settled with no ratios")
	}
}
