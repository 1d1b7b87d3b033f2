package load

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute/router/score"
)

// Synthetic first tokens from a known engine: 20,000 prefill tokens/s, 30 ms fixed, 2e-7 s per
// decode token held, 10% noise. The fit finds the rate within 5%.
func TestCalibrationConvergesToTheEnginesRate(t *testing.T) {
	c := NewCalibrations(score.Calibration{})
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
	prior := score.Calibration{LatencyS: 0.1, SecondsPerToken: 1e-3}
	c := NewCalibrations(prior)
	if got := c.Read(); got != prior {
		t.Fatalf("no observation: read %+v, want the prior %+v", got, prior)
	}
	if got := NewCalibrations(score.Calibration{}).Read(); got != score.DefaultCalibration {
		t.Fatalf("zero prior: read %+v, want score.DefaultCalibration", got)
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
	// The ledger reads it into every replica's candidate.
	l := New(Options{Policy: mustPolicy(t), Calibration: prior})
	if l.Calibration("never-seen") != prior {
		t.Errorf("ledger's calibration before any first token is not its prior")
	}
}

// A few stalled requests (100x their time) move the fit by little: the Huber weight bounds each
// outlier's pull.
func TestCalibrationOutliersDoNotWreckIt(t *testing.T) {
	clean, dirty := NewCalibrations(score.Calibration{}), NewCalibrations(score.Calibration{})
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
		plain.solve(thetaOf(score.DefaultCalibration))
	}
	if r := plain.calibration().SecondsPerToken / c.SecondsPerToken; r < 2 {
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
	c := NewCalibrations(score.Calibration{})
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

// The ledger observes each first token with what the policy saw at routing: prefill still
// ahead, the request's uncached tokens and decode tokens held; the time is the ledger's clock.
func TestLedgerFitsFromFirstTokens(t *testing.T) {
	now := int64(1e12)
	l := New(Options{Policy: mustPolicy(t), Now: func() time.Time { return time.Unix(0, now) }})
	rep := l.NewReplica(0, "a")
	for i := 0; i < 400; i++ {
		unc := 1000 + 37*(i%100)
		req := &score.Request{NowNs: now}
		cands := []score.Candidate{{ID: "a", Healthy: true}}
		id, _ := l.Routed(Routing{Replica: rep, Uncached: unc, Req: req, Cands: cands, Chosen: 0})
		now += int64(float64(unc) / 8000 * 1e9) // alone on the engine: its own prefill at 8,000 tokens/s
		if err := l.FirstToken(id); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Done(id, nil); err != nil {
			t.Fatal(err)
		}
		now += int64(time.Second)
	}
	if rate := 1 / l.Calibration("a").SecondsPerToken; math.Abs(rate-8000)/8000 > 0.05 {
		t.Errorf("ledger's fitted rate %.0f tokens/s, want 8000", rate)
	}
}

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
	c := NewCalibrations(score.Calibration{})
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

	one := NewCalibrations(score.Calibration{})
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
	c := NewCalibrations(score.Calibration{})
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
		c := NewCalibrations(score.Calibration{})
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
