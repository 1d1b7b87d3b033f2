package score

import (
	"math"
	"math/rand/v2"
)

// NewRNG returns the seeded generator every random choice uses (every policy, production and
// benchmark alike), so runs are reproducible.
func NewRNG(seed int64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed), 0x6b76726f757465)) // "kvroute"
}

// PickMin returns the healthy index with the smallest value, breaking exact ties uniformly at
// random with rng (or by lowest index when rng is nil).
func PickMin(cands []Candidate, value func(i int) float64, rng *rand.Rand) int {
	best, ties := -1, 0
	var bv float64
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		v := value(i)
		switch {
		case best < 0 || v < bv:
			best, bv, ties = i, v, 1
		case v == bv:
			ties++
			// Reservoir sampling keeps each tied index with equal probability.
			if rng != nil && rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// SampleNearTies draws a healthy candidate with a finite cost from a softmax over cost: weight
// exp(-(cost - least) / scale), scale = temperature x the mean finite cost, that mean at least
// minMean (kv's costs are prefill tokens, so 1 keeps an all-hit decision from dividing by 0;
// kvbench's kv-ttft's are seconds and pass 0). A scale of 0 or less takes the cheapest.
func SampleNearTies(cands []Candidate, value func(int) float64, temperature, minMean float64, rng *rand.Rand) int {
	best := PickMin(cands, value, nil)
	lo := value(best)
	mean, m := 0.0, 0
	for i := range cands {
		if v := value(i); cands[i].Healthy && !math.IsInf(v, 1) {
			mean += v
			m++
		}
	}
	scale := math.Max(mean/float64(m), minMean) * temperature
	if scale <= 0 {
		return best
	}
	total := 0.0
	for i := range cands {
		if v := value(i); cands[i].Healthy && !math.IsInf(v, 1) {
			total += math.Exp(-(v - lo) / scale)
		}
	}
	r := rng.Float64() * total
	for i := range cands {
		if v := value(i); cands[i].Healthy && !math.IsInf(v, 1) {
			w := math.Exp(-(v - lo) / scale)
			if r < w {
				return i
			}
			r -= w
		}
	}
	return best
}
