package policies

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/score"
)

// The benchmark policies are kvbench's: registered beside the production ones in its registry,
// disjoint from them, and unknown to score.New (what kvrouter builds from).
func TestRegistryAddsTheBenchmarkPolicies(t *testing.T) {
	r := Registry()
	if want := append(slices.Clone(score.ProductionPolicies), Benchmark...); !slices.Equal(r.Names(), want) {
		t.Errorf("Registry() offers %v, want %v", r.Names(), want)
	}
	for _, n := range Benchmark {
		if slices.Contains(score.ProductionPolicies, n) {
			t.Errorf("%q is both a production and a benchmark policy", n)
		}
		if !IsBenchmark(n) {
			t.Errorf("IsBenchmark(%q) is false", n)
		}
		if p := mustNew(t, n); p.Name() != n {
			t.Errorf("New(%q).Name() = %q", n, p.Name())
		}
		if _, err := score.New(n, score.Options{}); err == nil {
			t.Errorf("score.New builds %q: the router would offer it", n)
		}
	}
	if IsBenchmark("kv") {
		t.Error("kv reads as a benchmark policy")
	}
	if err := Register(r); err == nil {
		t.Error("registering the benchmark policies twice was accepted")
	}
}

func TestNoHealthyCandidateIsAnErrorForEveryBenchmarkPolicy(t *testing.T) {
	req := &score.Request{Keys: keys(1, 2), Tokens: 32, BlockSize: 16, SessionKey: "s"}
	for _, n := range Benchmark {
		c := fleetOf(3)
		for i := range c {
			c[i].Healthy = false
		}
		if _, err := mustNew(t, n).Pick(req, c); !errors.Is(err, score.ErrNoCandidate) {
			t.Errorf("%s: err = %v, want ErrNoCandidate", n, err)
		}
		if _, err := mustNew(t, n).Pick(req, nil); !errors.Is(err, score.ErrNoCandidate) {
			t.Errorf("%s with no candidates: err = %v", n, err)
		}
	}
}

func TestUnhealthyNeverPickedByABenchmarkPolicy(t *testing.T) {
	for _, n := range Benchmark {
		p := mustNew(t, n)
		c := fleetOf(3)
		c[1].Healthy = false
		c[1].ExactBlocks = 4 // tempting, but unhealthy
		for k := 0; k < 20; k++ {
			req := &score.Request{Keys: keys(1, 2, 3, 4), Tokens: 64, BlockSize: 16, SessionKey: "s"}
			i, err := p.Pick(req, c)
			if err != nil || i == 1 {
				t.Fatalf("%s picked %d err %v", n, i, err)
			}
			p.OnRouted(req, c, i)
		}
	}
}

func TestRandomIsSeededAndSpreads(t *testing.T) {
	seq := func(seed int64) []int {
		p, _ := Registry().New("random", score.Options{Seed: seed})
		var out []int
		for k := 0; k < 50; k++ {
			i, _ := p.Pick(&score.Request{}, fleetOf(4))
			out = append(out, i)
		}
		return out
	}
	a, b := seq(1), seq(1)
	seen := map[int]bool{}
	for k := range a {
		if a[k] != b[k] {
			t.Fatal("same seed, different choices")
		}
		seen[a[k]] = true
	}
	if len(seen) != 4 {
		t.Errorf("random used only %d of 4 replicas", len(seen))
	}
}
func TestSGLangImbalanceSwitchAndSmallestTree(t *testing.T) {
	p := mustNew(t, "sglang-cache-aware")
	req := &score.Request{Keys: keys(1, 2, 3, 4), Tokens: 64, BlockSize: 16}
	c := fleetOf(3)
	p.OnRouted(req, c, 0) // replica 0's tree holds the prompt
	if i, _ := p.Pick(req, c); i != 0 {
		t.Errorf("balanced fleet: picked %d, want best match 0", i)
	}
	// (max - min) > 64 and max > 1.5 x min: shortest queue wins regardless of cache.
	c[0].Running, c[1].Running, c[2].Running = 100, 20, 30
	if i, _ := p.Pick(req, c); i != 1 {
		t.Errorf("imbalanced fleet: picked %d, want shortest queue 1", i)
	}
	// Imbalance that misses the absolute threshold keeps the cache choice.
	c[0].Running, c[1].Running, c[2].Running = 60, 0, 1
	if i, _ := p.Pick(req, c); i != 0 {
		t.Errorf("abs diff 60 <= 64: picked %d, want 0", i)
	}
	// Low match rate (<= 0.3): the smallest tree.
	c = fleetOf(3)
	p.OnRouted(&score.Request{Keys: keys(50, 51), Tokens: 32, BlockSize: 16}, c, 1)
	cold := &score.Request{Keys: keys(90, 91, 92, 93), Tokens: 64, BlockSize: 16}
	if i, _ := p.Pick(cold, c); i != 2 {
		t.Errorf("miss: picked %d, want the empty tree 2", i)
	}
}
func TestLLMDWeights(t *testing.T) {
	p := mustNew(t, "llmd-default")
	req := &score.Request{Keys: keys(1, 2), Tokens: 128, BlockSize: 64}
	c := fleetOf(2)
	p.OnRouted(req, c, 0)
	// Full prefix match (3) beats the best queue score (2) of an empty replica.
	c[0].Queue, c[1].Queue = 10, 0
	if i, _ := p.Pick(req, c); i != 0 {
		t.Errorf("picked %d, want the prefix holder", i)
	}
	// Full KV (kv 0 vs 2) and longest queue (0 vs 2) together outweigh prefix 3.
	c[0].KVUtil = 1
	if i, _ := p.Pick(req, c); i != 1 {
		t.Errorf("picked %d, want the empty replica", i)
	}
}
func TestDynamoCost(t *testing.T) {
	p := mustNew(t, "dynamo-kv")
	req := &score.Request{Keys: keys(1, 2, 3, 4), Tokens: 64, BlockSize: 16}
	c := fleetOf(2)
	// a: overlap 4 but 3 blocks of decode; b: idle. cost a = max(0+4-4,0)+3+4 = 7, b = 4+0+4 = 8.
	c[0].ExactBlocks, c[0].DecodeTokens = 4, 48
	if i, _ := p.Pick(req, c); i != 0 {
		t.Errorf("picked %d, want 0 (cost 7 < 8)", i)
	}
	// With 5 blocks of decode a costs 9 > 8.
	c[0].DecodeTokens = 80
	if i, _ := p.Pick(req, c); i != 1 {
		t.Errorf("picked %d, want 1 (cost 9 > 8)", i)
	}
}

// prefix-char follows the longest chain of 128-character chunks it sent a replica (at 16-token
// blocks and 4 characters a token, a block key is one chunk), whatever that replica's load.
func TestPrefixCharFollowsLongestMatchWithoutLoad(t *testing.T) {
	p := mustNew(t, "prefix-char")
	c := fleetOf(3)
	req := &score.Request{Keys: keys(1, 2, 3, 4, 5), Tokens: 80, BlockSize: 16}
	i, _ := p.Pick(req, c)
	p.OnRouted(req, c, i)
	c[i].Queue, c[i].PrefillTokens = 1000, 1<<20 // no load term: it must not care
	req2 := &score.Request{Keys: keys(1, 2, 3, 4, 9), Tokens: 80, BlockSize: 16}
	if j, _ := p.Pick(req2, c); j != i {
		t.Errorf("prefix-char picked %d, want the replica with the shared chunks %d", j, i)
	}
	// A prompt that shares nothing: random tie-break.
	seen := map[int]bool{}
	for k := 0; k < 40; k++ {
		j, _ := p.Pick(&score.Request{Keys: keys(uint64(100 + k)), Tokens: 16, BlockSize: 16}, c)
		seen[j] = true
	}
	if len(seen) < 2 {
		t.Error("prefix-char tie-break is not random")
	}
}

// kv-ttft reads the same drain: of two replicas with equal prefill counters, the one whose
// prefill started 0.35 s ago is expected to reach this request's turn 0.34 s sooner, more than
// its extra running sequences cost (read raw, the counters tie and the decode term picks the
// replica that just began).
func TestKVTTFTPicksTheReplicaNearerTheEndOfItsPrefill(t *testing.T) {
	now := 100 * sec
	cands := nearTheEnd(now, score.Calibration{DrainTokensPerS: 20000})
	req := &score.Request{Tokens: 7680, BlockSize: 512, NowNs: now}
	k := newTTFTWith(score.Options{Seed: 1}, Timing{LatencyS: 0.05, SecondsPerToken: 5e-5, SecondsPerDecodeToken: 1e-7, Observations: 50})
	got, err := k.Pick(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	ex := k.Explain(req, cands)
	if got != 0 {
		t.Fatalf("picked %s, want old (costs: old %v, new %v)", cands[got].ID, ex[0], ex[1])
	}
	for i, want := range []float64{5e-5 * 680, 5e-5 * 7480} {
		for _, tm := range ex[i].Terms {
			if tm.Name == "queued_prefill_s" && math.Abs(tm.Value-want) > 1e-9 {
				t.Errorf("%s: queued_prefill_s %v, want %v (the counter less the drain)", cands[i].ID, tm.Value, want)
			}
		}
	}
}

// nearTheEnd is two replicas with one 7,680-token prompt pending each at now: "old" began 0.35 s
// ago and runs 9 sequences, "new" began 10 ms ago and runs 3.
func nearTheEnd(now int64, cal score.Calibration) []score.Candidate {
	return []score.Candidate{
		{ID: "old", Healthy: true, PrefillTokens: 7680, PrefillSince: now - 35*sec/100,
			DecodeTokens: 8 * 7880, Running: 9, Calib: cal, Window: score.Window{Seen: true}},
		{ID: "new", Healthy: true, PrefillTokens: 7680, PrefillSince: now - sec/100,
			DecodeTokens: 2 * 7880, Running: 3, Calib: cal, Window: score.Window{Seen: true}},
	}
}

// A request still in prefill counts by the context it will hold (score.Candidate.ContextTokens):
// "a"'s drained 512-token prefill holds 2,048 tokens beside 1,000 decoding, "b" decodes 1,500, so
// kv-ttft picks b, as kv does.
func TestKVTTFTCountsTheContextOfARequestStillInPrefill(t *testing.T) {
	now := 100 * sec
	cal := score.Calibration{DrainTokensPerS: 20000}
	cands := []score.Candidate{
		{ID: "a", Healthy: true, ExactBlocks: 3, PrefillTokens: 512, PrefillSince: now - sec/5,
			PrefillHeldTokens: 2048, DecodeTokens: 1000, Calib: cal},
		{ID: "b", Healthy: true, ExactBlocks: 3, DecodeTokens: 1500, Calib: cal},
	}
	req := &score.Request{Keys: keys(seq(4)...), Tokens: 2048, BlockSize: 512, NowNs: now}
	k := newTTFTWith(score.Options{Seed: 1}, Timing{LatencyS: 0.05, SecondsPerToken: 5e-5, SecondsPerDecodeToken: 1e-7, Observations: 50})
	if got, err := k.Pick(req, cands); err != nil || got != 1 {
		ex := k.Explain(req, cands)
		t.Errorf("picked %d (%v), want b (a: %v; b: %v)", got, err, ex[0], ex[1])
	}
}

// Synthetic first tokens from a known engine: 20,000 prefill tokens/s, 30 ms fixed, 2e-7 s per
// decode token held, 10% noise. The fit finds the rate within 5%.
func TestCalibrationConvergesToTheEnginesRate(t *testing.T) {
	c := NewTTFTFit(Timing{})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		ahead, unc, dec := rng.IntN(20000), 500+rng.IntN(8000), rng.IntN(200000)
		y := 0.03 + float64(ahead+unc)/20000 + 2e-7*float64(dec)
		c.Observe(ahead, unc, dec, y*(1+0.1*(rng.Float64()-0.5)))
	}
	got := c.Read()
	if rate := 1 / got.SecondsPerToken; math.Abs(rate-20000)/20000 > 0.05 {
		t.Errorf("fitted rate %.0f tokens/s, want 20000 within 5%% (%+v)", rate, got)
	}
	if math.Abs(got.LatencyS-0.03) > 0.02 {
		t.Errorf("fitted latency %.3f s, want 0.03 within 20 ms", got.LatencyS)
	}
	if math.Abs(got.SecondsPerDecodeToken-2e-7)/2e-7 > 0.25 {
		t.Errorf("fitted decode cost %.3g s/token, want 2e-7 within 25%%", got.SecondsPerDecodeToken)
	}
}

// Before any first token the prior applies; a replica the fleet has just seen reads the fleet's
// fit (one fit for all).
func TestCalibrationPriorThenFleetFit(t *testing.T) {
	prior := Timing{LatencyS: 0.1, SecondsPerToken: 1e-3}
	c := NewTTFTFit(prior)
	if got := c.Read(); got != prior {
		t.Fatalf("no observation: read %+v, want the prior %+v", got, prior)
	}
	if got := NewTTFTFit(Timing{}).Read(); got != DefaultTiming {
		t.Fatalf("zero prior: read %+v, want DefaultTiming", got)
	}
	for i := 0; i < 300; i++ {
		x := 500 + 200*(i%50)
		c.Observe(0, x, 0, float64(x)/50000)
	}
	got := c.Read()
	if rate := 1 / got.SecondsPerToken; math.Abs(rate-50000)/50000 > 0.05 {
		t.Errorf("after 300 first tokens at 50k tokens/s the fit says %.0f", rate)
	}
	if got.Observations < 100 {
		t.Errorf("observation weight %.1f, want the decayed count of 300 (>100)", got.Observations)
	}
}

// A few stalled requests (100x their time) move the fit by little: the Huber weight bounds each
// outlier's pull.
func TestCalibrationOutliersDoNotWreckIt(t *testing.T) {
	clean, dirty := NewTTFTFit(Timing{}), NewTTFTFit(Timing{})
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 1000; i++ {
		ahead, unc := rng.IntN(10000), 1000+rng.IntN(4000)
		y := 0.02 + float64(ahead+unc)/10000
		clean.Observe(ahead, unc, 0, y)
		if i%20 == 7 {
			y *= 100 // 5% of requests stall
		}
		dirty.Observe(ahead, unc, 0, y)
	}
	c, d := clean.Read(), dirty.Read()
	if r := d.SecondsPerToken / c.SecondsPerToken; r > 1.3 || r < 0.8 {
		t.Errorf("5%% of 100x outliers moved the per-token cost %.2fx (clean %+v, dirty %+v)", r, c, d)
	}
	// Without the Huber weight (plain least squares) the same data is off by far more: the
	// test can fail.
	var plain linFit
	rng = rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 1000; i++ {
		ahead, unc := rng.IntN(10000), 1000+rng.IntN(4000)
		y := 0.02 + float64(ahead+unc)/10000
		if i%20 == 7 {
			y *= 100
		}
		phi := features(float64(ahead+unc), 0)
		for j := range phi {
			for k := range phi {
				plain.a[j][k] = fleetDecay*plain.a[j][k] + phi[j]*phi[k]
			}
			plain.b[j] = fleetDecay*plain.b[j] + phi[j]*y
		}
		plain.solve(thetaOf(DefaultTiming))
	}
	if r := plain.timing().SecondsPerToken / c.SecondsPerToken; r < 2 {
		t.Errorf("plain least squares moved only %.2fx: the outliers are too mild to test anything", r)
	}
	// Garbage is refused outright.
	before := dirty.Read()
	dirty.Observe(0, 100, 0, math.NaN())
	dirty.Observe(0, 100, 0, -1)
	dirty.Observe(0, 100, 0, math.Inf(1))
	if dirty.Read() != before {
		t.Error("a NaN, negative or infinite time changed the fit")
	}
}

// The state is fixed-size whatever the number of observations or replicas.
func TestCalibrationStateIsBounded(t *testing.T) {
	c := NewTTFTFit(Timing{})
	size := unsafe.Sizeof(*c)
	for i := 0; i < 10000; i++ {
		c.Observe(i%997, 100, i%13, 0.01)
	}
	if unsafe.Sizeof(*c) != size || size > 512 {
		t.Errorf("calibration state %d bytes", unsafe.Sizeof(*c))
	}
	if got := c.Read(); got.Observations > 1/(1-fleetDecay)+1 {
		t.Errorf("observation weight %.1f exceeds the decay's bound %.1f", got.Observations, 1/(1-fleetDecay))
	}
}

// kv-ttft is told of each first token by the ledger that serialises it (a policy that is a
// load.Observer), with what the replica carried at routing: prefill still ahead, the request's
// uncached tokens and decode tokens held; the time is the ledger's clock.
func TestLedgerFitsKVTTFTFromFirstTokens(t *testing.T) {
	now := int64(1e12)
	k := newTTFT(score.Options{Seed: 1})
	l := load.New(load.Options{Policy: k, Now: func() time.Time { return time.Unix(0, now) }})
	rep := l.NewReplica(0, "a")
	for i := 0; i < 400; i++ {
		unc := 1000 + 37*(i%100)
		req := &score.Request{NowNs: now}
		cands := []score.Candidate{{ID: "a", Healthy: true}}
		id, _ := l.Routed(load.Routing{Replica: rep, Uncached: unc, Req: req, Cands: cands, Chosen: 0})
		now += int64(float64(unc) / 8000 * 1e9) // alone on the engine: its own prefill at 8,000 tokens/s
		if err := l.FirstToken(id); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Done(id, nil); err != nil {
			t.Fatal(err)
		}
		now += int64(time.Second)
	}
	if rate := 1 / k.Read().SecondsPerToken; math.Abs(rate-8000)/8000 > 0.05 {
		t.Errorf("ledger's fitted rate %.0f tokens/s, want 8000", rate)
	}
}
