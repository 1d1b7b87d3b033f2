package score

import (
	"math"
	"testing"
)

// The routed prefill ahead drains at the measured rate since the replica's prefill last moved,
// never below zero; without a measured rate (or a start) it is the ledger's counter.
func TestPrefillAheadDrains(t *testing.T) {
	c := Candidate{PrefillTokens: 10000, PrefillSince: 10 * sec, Calib: Calibration{DrainTokensPerS: 10000}}
	for _, tc := range []struct {
		now  int64
		want float64
	}{{10 * sec, 10000}, {10*sec + sec/2, 5000}, {11 * sec, 0}, {20 * sec, 0}} {
		if got := PrefillAhead(&c, tc.now); math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("at %d ns ahead = %v, want %v", tc.now, got, tc.want)
		}
	}
	noRate := c
	noRate.Calib.DrainTokensPerS = 0
	noStart := c
	noStart.PrefillSince = 0
	for _, x := range []Candidate{noRate, noStart} {
		if got := PrefillAhead(&x, 20*sec); got != 10000 {
			t.Errorf("%+v: ahead = %v, want the counter 10000", x, got)
		}
	}
}

// Two replicas each with one 7,680-token prompt pending (the ledger's counters are equal): the
// one whose prefill started 0.35 s ago is nearly done, the other just began. kv picks the first
// although it runs more sequences; read raw, the counters tie and the decode term picked the
// replica that had just begun (the no-reuse loss to round-robin, docs/benchmarks.md "Prefill
// drain").
func TestKVPicksTheReplicaNearerTheEndOfItsPrefill(t *testing.T) {
	now := 100 * sec
	cands := nearTheEnd(now, Calibration{DrainTokensPerS: 20000})
	req := &Request{Tokens: 7680, BlockSize: 512, NowNs: now}
	k := newKVForTest()
	got, err := k.Pick(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	if got != 0 {
		ex := k.Explain(req, cands)
		t.Fatalf("picked %s, want old (costs: old %v, new %v)", cands[got].ID, ex[0], ex[1])
	}
}

func newKVForTest() *kvPolicy { return newKV(Options{Seed: 1}) }

// nearTheEnd is two replicas with one 7,680-token prompt pending each at now: "old" began 0.35 s
// ago and runs 9 sequences, "new" began 10 ms ago and runs 3.
func nearTheEnd(now int64, cal Calibration) []Candidate {
	return []Candidate{
		{ID: "old", Healthy: true, PrefillTokens: 7680, PrefillSince: now - 35*sec/100,
			DecodeTokens: 8 * 7880, Running: 9, Calib: cal, Window: Window{Seen: true}},
		{ID: "new", Healthy: true, PrefillTokens: 7680, PrefillSince: now - sec/100,
			DecodeTokens: 2 * 7880, Running: 3, Calib: cal, Window: Window{Seen: true}},
	}
}

// Hot-prefix, after the drain credit: "a" was sent a 2,048-token prompt (1,536 of it cached)
// 0.2 s ago and the measured drain says its 512 uncached tokens are done, but its first token has
// not come; "b" has nothing pending and decodes 1,500 tokens of context. Their prefill ahead ties
// at zero, so the decode term decides. a's request holds its whole prompt from its next steps on
// (vLLM decodes it every step once its prefill ends), so a carries 2,048 + 1,000 tokens of
// context against b's 1,500: kv picks b (so does kvbench's kv-ttft, sim/policies). Counting
// decoding sequences alone, a
// (1,000) looked the less busy and took the request (kv / best other TTFT p90 1.16 -> 1.03,
// docs/benchmarks.md "Requests still in prefill").
func TestKVCountsTheContextOfARequestStillInPrefill(t *testing.T) {
	now := 100 * sec
	cal := Calibration{DrainTokensPerS: 20000}
	cands := []Candidate{
		{ID: "a", Healthy: true, ExactBlocks: 3, PrefillTokens: 512, PrefillSince: now - sec/5,
			PrefillHeldTokens: 2048, DecodeTokens: 1000, Calib: cal},
		{ID: "b", Healthy: true, ExactBlocks: 3, DecodeTokens: 1500, Calib: cal},
	}
	req := &Request{Keys: keys(seq(4)...), Tokens: 2048, BlockSize: 512, NowNs: now}
	if got := PrefillAhead(&cands[0], now); got != 0 {
		t.Fatalf("a's prefill ahead %v, want 0 (the case is a drained counter)", got)
	}
	p := newKVForTest()
	got, err := p.Pick(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	if got != 1 {
		ex := p.Explain(req, cands)
		t.Errorf("picked %s, want b (a: %v; b: %v)", cands[got].ID, ex[0], ex[1])
	}
}

// The prefill ahead counts a pending prompt's attention at the measured weight: an 80,000-token
// prompt pending with 3.2G pairs of attention at 1/40,000 a pair is 160,000 tokens of work, so
// at 40,000 tokens/s it is 4 s from its first token, not 2.
func TestPrefillAheadCountsAttention(t *testing.T) {
	cal := Calibration{DrainTokensPerS: 40000, DrainAttentionWeight: 1.0 / 40000}
	c := Candidate{PrefillTokens: 80000, PrefillAttention: AttentionPairs(80000, 0), PrefillSince: 10 * sec, Calib: cal}
	for _, tc := range []struct {
		now  int64
		want float64
	}{{10 * sec, 159999}, {12 * sec, 79999}, {13 * sec, 39999}, {14 * sec, 0}} {
		if got := PrefillAhead(&c, tc.now); math.Abs(got-tc.want) > 1 {
			t.Errorf("at %d s ahead = %v, want %v", tc.now/sec, got, tc.want)
		}
	}
	if got, want := AttentionPairs(3, 2), int64(2+3+4); got != want {
		t.Errorf("AttentionPairs(3, 2) = %d, want %d (the new tokens at positions 2, 3, 4)", got, want)
	}
	if AttentionPairs(0, 100) != 0 || AttentionPairs(-1, 5) != 0 {
		t.Error("no uncached tokens, no attention")
	}
}

// The conversation slice's pile-up (docs/benchmarks.md, "Long prompts and the drain credit"):
// "long" has a 5,400-token prompt pending for 4.5 s, "short" two 400-token prompts since 0.1 s.
// At the measured 1,250 tokens/s read per token, long's prompt drained 0.2 s ago and kv sent
// the next request behind it; with the prompt's attention counted (at 1/3,400 a pair, what the
// trace-scaled simulator's rates by prompt length imply: 5,500 tokens at 0.56 x the rate of
// 500) it has about 4,000 tokens of work to go, and kv picks short.
func TestKVDoesNotQueueBehindALongPromptItThinksDone(t *testing.T) {
	now := 100 * sec
	pending := func(weight float64) []Candidate {
		cal := Calibration{DrainTokensPerS: 1250, DrainAttentionWeight: weight}
		return []Candidate{
			{ID: "long", Healthy: true, PrefillTokens: 5400, PrefillAttention: AttentionPairs(5400, 0),
				PrefillSince: now - 45*sec/10, PrefillHeldTokens: 5400, Running: 1, Calib: cal, Window: Window{Seen: true}},
			{ID: "short", Healthy: true, PrefillTokens: 800, PrefillAttention: 2 * AttentionPairs(400, 0),
				PrefillSince: now - sec/10, PrefillHeldTokens: 800, Running: 2, Calib: cal, Window: Window{Seen: true}},
		}
	}
	req := &Request{Tokens: 300, BlockSize: 16, NowNs: now}
	for _, tc := range []struct {
		weight float64
		want   string
	}{{0, "long"}, {1.0 / 3400, "short"}} {
		cands := pending(tc.weight)
		k := newKVForTest()
		got, err := k.Pick(req, cands)
		if err != nil {
			t.Fatal(err)
		}
		if cands[got].ID != tc.want {
			t.Errorf("attention weight %v: picked %s, want %s (ahead: long %.0f, short %.0f tokens)", tc.weight, cands[got].ID, tc.want,
				PrefillAhead(&cands[0], now), PrefillAhead(&cands[1], now))
		}
	}
}
