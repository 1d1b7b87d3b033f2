package score

import "math/rand/v2"

// newRNG returns the seeded generator every random choice uses, so runs are reproducible.
func newRNG(seed int64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed), 0x6b76726f757465)) // "kvroute"
}

// pickMin returns the healthy index with the smallest value, breaking exact ties uniformly at
// random with rng (or by lowest index when rng is nil).
func pickMin(cands []Candidate, value func(i int) float64, rng *rand.Rand) int {
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
