package score

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

// explainCheapest is the pick an explanation implies (route.Cheapest, which this package cannot
// import): the lowest cost not excluded, the first on a tie.
func explainCheapest(cands []Candidate, ex []Explanation) int {
	best := -1
	for i := range cands {
		if !cands[i].Healthy || ex[i].Excluded != "" {
			continue
		}
		if best < 0 || ex[i].Cost < ex[best].Cost {
			best = i
		}
	}
	return best
}

// windowsOf is a deep copy of the rig's windows, to compare before and after.
func windowsOf(k *kvRig) map[string]tokenWindow {
	out := map[string]tokenWindow{}
	for id, w := range k.w.m {
		c := *w
		c.at, c.tok = append([]int64(nil), w.at...), append([]float64(nil), w.tok...)
		out[id] = c
	}
	return out
}

// On random fleets and traffic (overlap, load, warm-up, unhealthy replicas, windows of every
// age), Explain's cheapest eligible candidate costs what Pick's choice costs, the terms add up
// to the cost, and Explain changes nothing: windows, clocks and the random tie-break are as
// before, so a policy asked to explain every decision picks exactly as one that is not.
func TestKVExplainAgreesWithPickAndChangesNothing(t *testing.T) {
	explained, plain := newKVRig(Options{Seed: 3}), newKVRig(Options{Seed: 3})
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 6
	excluded := map[string]int{}
	for r := 0; r < 3000; r++ {
		c := fleetOf(n)
		for i := range c {
			c[i].Healthy = rng.IntN(10) > 0
			c[i].ExactBlocks = rng.IntN(12)
			c[i].PredictedBlocks = rng.IntN(6)
			c[i].PrefillTokens = rng.IntN(4000)
			c[i].DecodeTokens = rng.IntN(20000)
			c[i].Queue = rng.IntN(3)
			if rng.IntN(8) == 0 {
				c[i].WarmupCredit = rng.Float64()
			}
		}
		if rng.IntN(4) == 0 { // a prefix cached nowhere
			for i := range c {
				c[i].ExactBlocks, c[i].PredictedBlocks = 0, 0
			}
		} else if rng.IntN(2) == 0 { // a hot prefix held whole by replica 0: full hits, the request bound's case
			c[0].ExactBlocks, c[0].PrefillTokens, c[0].DecodeTokens = 12, 0, 0
		}
		if r > 1500 { // a replica joins late: its window is younger than the others'
			c = append(c, Candidate{ID: "late", Healthy: true})
		}
		hot := uint64(rng.IntN(3))
		req := &Request{Keys: keys(hot*100+1, hot*100+2, hot*100+3, hot*100+4, hot*100+5, hot*100+6, hot*100+7, hot*100+8, hot*100+9, hot*100+10, hot*100+11, hot*100+12),
			Tokens: 192, BlockSize: 16, NowNs: int64(r) * sec / 20}
		before := windowsOf(explained)
		ex := explained.Explain(req, c)
		if !reflect.DeepEqual(before, windowsOf(explained)) {
			t.Fatalf("request %d: Explain changed the windows", r)
		}
		if _, err := json.Marshal(ex); err != nil {
			t.Fatalf("request %d: explanation does not encode: %v", r, err)
		}
		i, err := explained.Pick(req, c)
		j, err2 := plain.Pick(req, c)
		if (err == nil) != (err2 == nil) || i != j {
			t.Fatalf("request %d: the explained policy picked %d (%v), the plain one %d (%v)", r, i, err, j, err2)
		}
		if err != nil {
			continue
		}
		best := explainCheapest(c, ex)
		if best < 0 || ex[i].Excluded != "" || math.Abs(ex[best].Cost-ex[i].Cost) > 1e-9 {
			t.Fatalf("request %d: Pick chose %d (cost %v, excluded %q), Explain's cheapest is %d (cost %v): %+v",
				r, i, ex[i].Cost, ex[i].Excluded, best, ex[max(best, 0)].Cost, ex)
		}
		for k, e := range ex {
			excluded[e.Excluded]++
			if !c[k].Healthy {
				if e.Excluded != GuardUnhealthy {
					t.Fatalf("request %d: unhealthy candidate %d explained as %+v", r, k, e)
				}
				continue
			}
			sum := 0.0
			for _, term := range e.Terms[:3] { // uncached, queued prefill, decode
				sum += term.Value
			}
			if math.Abs(sum-e.Cost) > 1e-6*math.Max(1, e.Cost) {
				t.Fatalf("request %d candidate %d: terms add up to %v, cost %v", r, k, sum, e.Cost)
			}
		}
		explained.OnRouted(req, c, i)
		plain.OnRouted(req, c, i)
	}
	// Every guard fired somewhere, or the comparison above did not cover it.
	for _, g := range []string{"", GuardUnhealthy, guardRequests, guardTokens, guardStarvation} {
		if excluded[g] == 0 {
			t.Errorf("no candidate explained with %q over the run: %v", g, excluded)
		}
	}
	t.Logf("explanations by guard: %v", excluded)
}

// Each guard is named where it applies: the request bound on a hot prefix's holder, the token
// bound on a replica whose recent work is far over the mean, the floor on everyone but a
// starved replica.
func TestKVExplainNamesTheGuard(t *testing.T) {
	// The request bound: replica 0 has taken every request of the window.
	p := newKVRig(Options{Seed: 1})
	for r := 0; r < 40; r++ {
		c := fleetOf(4)
		for i := range c {
			c[i].Running = 1 // nobody starved by in-flight share
		}
		c[0].ExactBlocks = 10
		req := &Request{Keys: keys(seq(10)...), Tokens: 160, BlockSize: 16, NowNs: int64(r) * sec / 10}
		p.OnRouted(req, c, 0)
	}
	c := fleetOf(4)
	c[0].ExactBlocks = 10
	req := &Request{Keys: keys(seq(10)...), Tokens: 160, BlockSize: 16, NowNs: 4 * sec}
	if ex := p.Explain(req, c); ex[0].Excluded != guardRequests {
		t.Errorf("hot holder explained %+v, want %s", ex[0], guardRequests)
	}
	// The token bound: replica 0 did 10x the others' uncached work and this request is a miss.
	p = newKVRig(Options{Seed: 1})
	for r := 0; r < 8; r++ {
		c := fleetOf(2)
		tok := 160
		i := r % 2
		if i == 0 {
			tok = 1600
		}
		req := &Request{Keys: keys(seq(tok / 16)...), Tokens: tok, BlockSize: 16, NowNs: int64(r) * sec / 10}
		p.OnRouted(req, c, i)
	}
	c = fleetOf(2)
	req = &Request{Keys: keys(seq(20)...), Tokens: 320, BlockSize: 16, NowNs: sec}
	if ex := p.Explain(req, c); ex[0].Excluded != guardTokens || ex[1].Excluded != "" {
		t.Errorf("explanations %+v, want replica 0 over the %s", ex, guardTokens)
	}
	// The floor: three replicas took 30 requests in the window, the fourth none and runs none.
	p = newKVRig(Options{Seed: 1})
	for r := 0; r < 30; r++ {
		c := fleetOf(4)
		req := &Request{Keys: keys(seq(2)...), Tokens: 32, BlockSize: 16, NowNs: int64(r) * sec / 10}
		p.OnRouted(req, c, r%3)
	}
	c = fleetOf(4)
	for i := 0; i < 3; i++ {
		c[i].Running = 2
	}
	req = &Request{Keys: keys(seq(2)...), Tokens: 32, BlockSize: 16, NowNs: 3 * sec}
	ex := p.Explain(req, c)
	for i := 0; i < 3; i++ {
		if ex[i].Excluded != guardStarvation {
			t.Errorf("replica %d explained %+v, want %s", i, ex[i], guardStarvation)
		}
	}
	if ex[3].Excluded != "" {
		t.Errorf("the starved replica explained %+v, want eligible", ex[3])
	}
	if i, _ := p.Pick(req, c); i != 3 {
		t.Errorf("Pick chose %d, want the starved replica 3", i)
	}
}

// kv's cost is the one-screen formula of docs/router.md, "How kv decides": in seconds, at any
// engine speed s, cost x s/w is the request's time to first token there (s x (prefill ahead +
// its own uncached tokens + d x context tokens), with no fixed latency) plus a
// miss price of (1/w − 1) x the compute of its uncached tokens. So among the replicas the
// constraints leave, kv picks the least TTFT + miss price.
func TestKVCostIsTimeToFirstTokenPlusMissPrice(t *testing.T) {
	k := newKVRig(Options{Seed: 5})
	w, d := DefaultKV.QueuedPrefillWeight, DefaultKV.DecodeWeight
	rng := rand.New(rand.NewPCG(7, 8))
	for r := 0; r < 500; r++ {
		s := []float64{1e-5, 5e-5, 2e-4}[r%3]
		engine := Calibration{DrainTokensPerS: 1 / s}
		c := fleetOf(5)
		for i := range c {
			c[i].ExactBlocks = rng.IntN(12)
			c[i].PredictedBlocks = rng.IntN(6)
			c[i].PrefillTokens = rng.IntN(4000)
			c[i].PrefillHeldTokens = c[i].PrefillTokens + rng.IntN(2000)
			c[i].DecodeTokens = rng.IntN(20000)
			if rng.IntN(3) == 0 {
				c[i].PrefillSince = int64(r)*sec/10 - int64(rng.IntN(int(sec)))
			}
			c[i].Calib = engine
		}
		req := &Request{Keys: keys(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), Tokens: 200, BlockSize: 16, NowNs: int64(r) * sec / 10}
		ex := k.Explain(req, c)
		for i := range c {
			u := UncachedTokens(req, &c[i], DefaultKV.TierWeights)
			ttft := s*(PrefillAhead(&c[i], req.NowNs)+u) + d*s*float64(c[i].ContextTokens())
			seconds := ttft + (1/w-1)*s*u
			if got := ex[i].Cost * s / w; math.Abs(got-seconds) > 1e-9*math.Max(1, seconds) {
				t.Fatalf("request %d, replica %d: cost x s/w = %.9f s, TTFT + miss price = %.9f s", r, i, got, seconds)
			}
		}
		i, err := k.Pick(req, c)
		if err != nil {
			t.Fatal(err)
		}
		k.OnRouted(req, c, i)
	}
}
