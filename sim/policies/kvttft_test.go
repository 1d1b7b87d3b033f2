package policies

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/router/score"
)

func term(e score.Explanation, name string) float64 {
	for _, t := range e.Terms {
		if t.Name == name {
			return t.Value
		}
	}
	return math.NaN()
}

// kv-ttft's terms add up as docs/router.md writes them, and Pick takes the cheapest
// explained candidate.
func TestKVTTFTTermsAndPick(t *testing.T) {
	cal := Timing{LatencyS: 0.03, SecondsPerToken: 5e-5, SecondsPerDecodeToken: 2e-7, Observations: 50}
	k := newTTFTWith(score.Options{Seed: 1}, cal)
	rng := rand.New(rand.NewPCG(5, 6))
	for r := 0; r < 500; r++ {
		now := 100*sec + int64(r)*sec/10
		req := &score.Request{Keys: keys(seq(20)...), Tokens: 330, BlockSize: 16, NowNs: now}
		c := fleetOf(4)
		for i := range c {
			c[i].ExactBlocks = rng.IntN(21)
			c[i].PrefillTokens = rng.IntN(4000)
			c[i].DecodeTokens = rng.IntN(100000)
			c[i].Window = score.Window{Tokens: float64(rng.IntN(200000)), Requests: rng.IntN(300), Seen: true, Since: 0}
		}
		if r%7 == 0 {
			c[rng.IntN(4)].Healthy = false
		}
		ex := k.Explain(req, c)
		best, lo := -1, math.Inf(1)
		for i, e := range ex {
			if !c[i].Healthy {
				if e.Excluded != score.GuardUnhealthy {
					t.Fatalf("unhealthy candidate explained %+v", e)
				}
				continue
			}
			ttft := term(e, "latency_s") + term(e, "queued_prefill_s") + term(e, "own_prefill_s") + term(e, "decode_s")
			if math.Abs(ttft-term(e, "ttft_s")) > 1e-9 || math.Abs(term(e, "ttft_s")+term(e, "miss_s")-e.Cost) > 1e-9 {
				t.Fatalf("terms %+v do not add up to cost %v", e.Terms, e.Cost)
			}
			// The miss price as derived: λ·Δ·(B + Δ/2)/(1 − ρ).
			d := cal.SecondsPerToken * term(e, "extra_uncached_tokens")
			b := term(e, "queued_prefill_s") + term(e, "decode_s")
			want := term(e, "requests_per_s") * d * (b + d/2) / (1 - term(e, "rho"))
			if math.Abs(want-term(e, "miss_s")) > 1e-9*math.Max(1, want) {
				t.Fatalf("miss_s %v, want %v", term(e, "miss_s"), want)
			}
			if e.Cost < lo {
				best, lo = i, e.Cost
			}
		}
		if i, _ := k.Pick(req, c); i != best {
			t.Fatalf("request %d: Pick %d, Explain's cheapest %d", r, i, best)
		}
	}
}

// The best-cached replica and an idle replica (no window) pay no miss price; a busier one pays
// more for the same extra prefill.
func TestKVTTFTMissPrice(t *testing.T) {
	k := newTTFT(score.Options{Seed: 1})
	req := &score.Request{Keys: keys(seq(100)...), Tokens: 1600, BlockSize: 16, NowNs: 60 * sec}
	c := fleetOf(3)
	c[0].ExactBlocks = 100
	c[1].Window = score.Window{Tokens: 30000, Requests: 30, Seen: true}
	c[2].Window = score.Window{Tokens: 30000, Requests: 30, Seen: true}
	c[2].PrefillTokens = 5000
	ex := k.Explain(req, c)
	if term(ex[0], "miss_s") != 0 {
		t.Errorf("the holder pays a miss price %v", term(ex[0], "miss_s"))
	}
	if !(term(ex[1], "miss_s") > 0 && term(ex[2], "miss_s") > term(ex[1], "miss_s")) {
		t.Errorf("miss prices %v, %v: want positive, and higher behind more queued prefill", term(ex[1], "miss_s"), term(ex[2], "miss_s"))
	}
	c[1].Window = score.Window{}
	if m := term(k.Explain(req, c)[1], "miss_s"); m != 0 {
		t.Errorf("a replica with nothing routed in the window pays %v", m)
	}
}

// A hot prefix held by one replica spills once its queue ahead costs more than a miss, and
// then stays balanced, when load accumulates as the ledger counts it (each pick adds its
// uncached prefill; the engine drains at the calibrated rate).
func TestKVTTFTHotPrefixSpillsWhenItsQueueCostsMoreThanAMiss(t *testing.T) {
	const n = 4
	cal := Timing{LatencyS: 0.02, SecondsPerToken: 1e-4}
	k := newTTFTWith(score.Options{Seed: 1}, cal)
	c := fleetOf(n)
	got := make([]int, n)
	held := [n]bool{true}
	now := int64(0)
	for r := 0; r < 400; r++ {
		now += sec / 40 // 40 req/s of a 992-token prefix + 508-token questions: 2x one replica's rate
		drained := int(float64(sec/40) / 1e9 / cal.SecondsPerToken)
		for i := range c {
			c[i].PrefillTokens = max(c[i].PrefillTokens-drained, 0)
			c[i].ExactBlocks = 0
			if held[i] {
				c[i].ExactBlocks = 62 // the 992-token prefix
			}
		}
		req := &score.Request{Keys: keys(seq(93)...), Tokens: 1500, BlockSize: 16, NowNs: now}
		i, err := k.Pick(req, c)
		if err != nil {
			t.Fatal(err)
		}
		c[i].PrefillTokens += int(k.uncached(req, &c[i]))
		held[i] = true
		got[i]++
	}
	// One replica prefills at most half the offered work: 200 of 400 (plus the queue a miss is
	// worth). At least three replicas are needed; a fourth may stay idle (it would pay a miss for
	// nothing: kv's starvation floor, which feeds it anyway, is not in the objective).
	used := 0
	for i := range got {
		if got[i] > 210 {
			t.Errorf("replica %d took %d of 400 (%v), more than its prefill rate serves", i, got[i], got)
		}
		if got[i] > 0 {
			used++
		}
	}
	if used < 3 {
		t.Errorf("the hot prefix spilled to %d replicas (%v), want at least the 3 its load needs", used, got)
	}
}

func TestKVTTFTPickDoesNotAllocate(t *testing.T) {
	k := newTTFT(score.Options{Seed: 1})
	req := &score.Request{Keys: keys(seq(20)...), Tokens: 320, BlockSize: 16, NowNs: 5 * sec}
	c := fleetOf(16)
	for i := range c {
		c[i].ExactBlocks, c[i].PrefillTokens = i, 100*i
		c[i].Window = score.Window{Tokens: 1000, Requests: 3, Seen: true}
	}
	k.Pick(req, c)
	if a := testing.AllocsPerRun(100, func() { k.Pick(req, c) }); a != 0 {
		t.Errorf("kv-ttft Pick allocates %v times per decision", a)
	}
}
