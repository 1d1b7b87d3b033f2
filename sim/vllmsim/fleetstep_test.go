package vllmsim

import (
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"testing"

	"github.com/kvroute/kvroute/sim/fleet"
)

// The fleet model's step engine (sim/fleet/step.go) follows this scheduler's rules in virtual
// time instead of running it. This test holds the two together: the same requests, stepped
// here by hand (schedule, the flat step time, update) and run through the fleet model on one
// replica, must give the same TTFT for every request and the same prefix hits. Blocks are 512
// tokens on both sides (the fleet model's trace blocks); prompts share prefixes, chunk under a
// small token budget and queue behind max-num-seqs, and arrivals (30/s, more than one replica
// serves) fall inside steps, so decodes share steps with prefill chunks (with a flat step time a
// chunked prompt alone costs what it costs whole: run with a 4096 budget on the fleet side,
// this test fails). No prompt
// is a full hit (vLLM recomputes a fully cached prompt's last block, the fleet model its last
// token: 16-token engine blocks make the two the same to within a block).
func TestStepEngineMatchesFleetModel(t *testing.T) {
	const bs = fleet.TraceBlockTokens
	rk := newTestRank(t, func(c *Config) {
		c.BlockSize, c.NumGPUBlocks = bs, 400
		c.PrefillTokensPerS, c.DecodeMsPerToken, c.StepModel, c.TimeScale = 20000, 20, "flat", 1
		c.MaxNumSeqs, c.MaxBatchedTokens = 4, 2048
	})
	rng := rand.New(rand.NewPCG(7, 11))
	var trace []fleet.Request
	next := uint64(1000)
	at := 0.0
	for i := 0; i < 40; i++ {
		var ids []uint64
		group := uint64(rng.IntN(3))
		for j := 0; j < rng.IntN(5); j++ { // a shared prefix of 0..4 blocks
			ids = append(ids, group*100+uint64(j))
		}
		for j := 0; j < 1+rng.IntN(3); j++ { // and 1..3 blocks of its own
			ids = append(ids, next)
			next++
		}
		input := len(ids)*bs - rng.IntN(bs) // the last block partial
		trace = append(trace, fleet.Request{TimestampMs: int64(at * 1000), InputLength: input,
			OutputLength: 1 + rng.IntN(12), HashIDs: ids})
		at += rng.ExpFloat64() / 30
	}

	// vllm-sim, stepped in virtual time: arrivals up to a step's start join it.
	reqs := make([]*engineRequest, len(trace))
	for i, q := range trace {
		var prompt []uint32
		for _, id := range q.HashIDs {
			prompt = append(prompt, seqTokens(int(id)*bs, bs)...)
		}
		reqs[i] = testRequest(t, rk, "r"+strconv.Itoa(i), prompt[:q.InputLength], q.OutputLength)
	}
	sim := make([]float64, len(trace))
	now, arrived := 0.0, 0
	for done := 0; done < len(trace); {
		if len(rk.waiting) == 0 && len(rk.running) == 0 {
			now = math.Max(now, float64(trace[arrived].TimestampMs)/1000)
		}
		for ; arrived < len(trace) && float64(trace[arrived].TimestampMs)/1000 <= now; arrived++ {
			rk.submit(reqs[arrived])
		}
		step := rk.schedule()
		now += rk.stepTime(step).Seconds()
		rk.update(step)
		for _, s := range step {
			if len(s.r.output) == 1 && s.r.numComputed == len(s.r.prompt) {
				i, _ := strconv.Atoi(s.r.id[1:])
				sim[i] = now - float64(trace[i].TimestampMs)/1000
			}
			if s.r.state == stateDone {
				done++
			}
		}
	}

	res, err := fleet.Run(fleet.NewTrace("t", trace), fleet.Config{Replicas: 1, CapacityBlocks: 399,
		PrefillTokensPerS: 20000, DecodeMsPerToken: 20, MaxNumSeqs: 4, MaxBatchedTokens: 2048,
		Engine: fleet.EngineStep}, "round-robin")
	if err != nil {
		t.Fatal(err)
	}
	sort.Float64s(sim)
	for i := range sim {
		// Step times are whole nanoseconds here (time.Duration).
		if math.Abs(sim[i]-res.TTFTs[i]) > 1e-6 {
			t.Fatalf("TTFT %d (sorted): vllm-sim %.6f s, fleet model %.6f s", i, sim[i], res.TTFTs[i])
		}
	}
	total := 0
	for _, q := range trace {
		total += q.InputLength
	}
	if got := int(math.Round(res.HitRateTokens * float64(total))); uint64(got) != rk.stats.prefixHits || got == 0 {
		t.Errorf("prefix hits: fleet model %d tokens, vllm-sim %d", got, rk.stats.prefixHits)
	}
	t.Logf("%d requests, TTFT p50 %.3f s, hits %d tokens of %d", len(trace), res.TTFTP50, rk.stats.prefixHits, total)
}
