package load

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/router/score"
)

func mustPolicy(t *testing.T) score.Policy {
	t.Helper()
	p, err := score.New("kv", score.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The drain fit separates a prompt's attention from its tokens when the prompts seen differ in
// length: first tokens timed as an engine whose attention costs 1/40,000 of a token per pair
// (near vLLM 0.20.1's 1/36,000 on Qwen3-32B: sim/vllmsim/stepmodel.go) at 2,000 tokens/s give back
// both, and an 80,000-token prompt reads 2 x its tokens; first tokens of one prompt length
// cannot tell the two apart, and the fit keeps the attention weight at 0 and the rate at the
// ratio of sums.
func TestDrainFitSeparatesAttentionFromTokens(t *testing.T) {
	const rate, weight = 2000.0, 1.0 / 40000
	c := NewCalibrations()
	sizes := []int{500, 2000, 8000, 20000, 40000, 80000}
	for i := range 300 {
		u, cached := sizes[i%len(sizes)], (i%3)*4000
		a := score.AttentionPairs(u, cached)
		c.ObserveDrain(u, a, (float64(u)+weight*float64(a))/rate)
	}
	got := c.Read()
	if math.Abs(got.DrainTokensPerS/rate-1) > 1e-3 || math.Abs(got.DrainAttentionWeight/weight-1) > 1e-3 {
		t.Fatalf("drain %v tokens/s, attention weight %v; want %v and %v", got.DrainTokensPerS, got.DrainAttentionWeight, rate, weight)
	}
	if cost := 80000 + got.DrainAttentionWeight*float64(score.AttentionPairs(80000, 0)); math.Abs(cost/80000-2) > 0.01 {
		t.Fatalf("an 80,000-token prompt costs %v tokens, want 2 x (its 3.2G pairs of attention / 40,000)", cost)
	}

	one := NewCalibrations()
	a := score.AttentionPairs(8000, 0)
	for range 300 {
		one.ObserveDrain(8000, a, (8000+weight*float64(a))/rate)
	}
	if got := one.Read(); got.DrainAttentionWeight != 0 || math.Abs(got.DrainTokensPerS-8000/((8000+weight*float64(a))/rate)) > 1e-6 {
		t.Fatalf("one prompt length: drain %v tokens/s, attention weight %v; want the ratio of sums and 0", got.DrainTokensPerS, got.DrainAttentionWeight)
	}
}

// An engine whose prefill is linear in tokens (the fleet model's) reads an attention weight of 0
// or near it, whatever the prompt lengths, and noise in the timings does not make it negative
// or the rate wrong by more than the noise.
func TestDrainFitOnALinearEngine(t *testing.T) {
	c := NewCalibrations()
	sizes := []int{500, 2000, 8000, 20000, 40000, 80000}
	for i := range 400 {
		u := sizes[i%len(sizes)]
		noise := 1 + 0.1*float64((i*7919)%21-10)/10 // +-10 %, deterministic
		c.ObserveDrain(u, score.AttentionPairs(u, 0), float64(u)/2000*noise)
	}
	got := c.Read()
	extra := got.DrainAttentionWeight * float64(score.AttentionPairs(80000, 0))
	if got.DrainAttentionWeight < 0 || extra > 0.1*80000 {
		t.Fatalf("attention weight %v on a linear engine: an 80,000-token prompt reads %v tokens of attention", got.DrainAttentionWeight, extra)
	}
	if math.Abs(got.DrainTokensPerS/2000-1) > 0.05 {
		t.Fatalf("drain %v tokens/s, want 2,000 within the noise", got.DrainTokensPerS)
	}
}

// A request's fixed cost is not attention: first tokens timed as an engine that spends 50 ms on
// every request plus 1/2,000 s a token, with no attention cost, read an attention weight of 0,
// whether the requests come in the llm-d trace's two shapes (hits of 75 new tokens after 375
// cached, misses of 450) or in many lengths. A fit without the fixed term read the hits' longer
// time per token as attention, 30-60 x vLLM's on the live llm-d trace, and kv lost cache hits
// there (0.71 -> 0.63 of prompt tokens).
func TestDrainFitDoesNotReadAFixedCostAsAttention(t *testing.T) {
	const rate, fixed = 2000.0, 0.05
	for name, shapes := range map[string][][2]int{
		"hits and misses": {{75, 375}, {450, 0}},
		"many lengths":    {{75, 375}, {450, 0}, {1200, 0}, {3000, 1000}, {300, 2000}, {6000, 0}},
	} {
		c := NewCalibrations()
		for i := range 300 {
			sh := shapes[i%len(shapes)]
			c.ObserveDrain(sh[0], score.AttentionPairs(sh[0], sh[1]), fixed+float64(sh[0])/rate)
		}
		if got := c.Read(); got.DrainAttentionWeight*float64(score.AttentionPairs(450, 0)) > 1 {
			t.Errorf("%s: attention weight %v reads a 450-token miss as %v tokens of attention; want none", name,
				got.DrainAttentionWeight, got.DrainAttentionWeight*float64(score.AttentionPairs(450, 0)))
		}
	}
}
