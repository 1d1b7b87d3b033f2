package replay

import (
	"math"
	"sort"
)

// BestOtherRatios gives, for each seed i, vals[policy][i] over the best other policy's value in
// the same seed, and which policy that was. higherIsBetter says which way is best (capacity: up,
// a latency: down). Only positive values compete (a capacity of 0, or a NaN figure of a seed with
// no successful request, is no best); a seed with none gives NaN and the name "", which TInterval
// leaves out. Ties go to the first name in name order, so the result does not depend on map order.
func BestOtherRatios(vals map[string][]float64, policy string, higherIsBetter bool) (ratios []float64, best []string) {
	others := make([]string, 0, len(vals))
	for p := range vals {
		if p != policy {
			others = append(others, p)
		}
	}
	sort.Strings(others)
	for i, own := range vals[policy] {
		b, name := math.NaN(), ""
		for _, p := range others {
			if i >= len(vals[p]) || !(vals[p][i] > 0) {
				continue
			}
			v := vals[p][i]
			if name == "" || (higherIsBetter && v > b) || (!higherIsBetter && v < b) {
				b, name = v, p
			}
		}
		ratios, best = append(ratios, own/b), append(best, name)
	}
	return ratios, best
}

// BestOtherRatio is one figure's per-seed ratio of a policy to the best other policy of the same
// seed (all policies of a seed run interleaved, so drifting machine load hits them alike), with
// the mean and 95% t-interval over the seeds: a ratio within one seed cancels the machine's
// load, which moves every policy's figures alike.
type BestOtherRatio struct {
	Metric    string     `json:"metric"` // ttft_p90_s, ttft_p99_s (lower is best), cached_ratio (higher is best)
	Policy    string     `json:"policy"` // the policy under test
	Seeds     []int      `json:"seeds"`
	PerSeed   []*float64 `json:"ratio_per_seed"` // null where no other policy had a value
	BestOther []string   `json:"best_other_per_seed"`
	Ratio     Interval   `json:"ratio"`
	// HalfWidth is the interval's half-width over its mean (RelativeHalfWidth); nil under 3 seeds.
	HalfWidth *float64 `json:"ratio_relative_half_width,omitempty"`
	ratios    []float64
}

// bestOtherMetrics are the figures PolicyRatios compares, with their per-seed Summary field and
// whether higher is better.
var bestOtherMetrics = []struct {
	name   string
	of     func(Summary) Interval
	higher bool
}{
	{"ttft_p90_s", func(s Summary) Interval { return s.TTFTP90 }, false},
	{"ttft_p99_s", func(s Summary) Interval { return s.TTFTP99 }, false},
	{"cached_ratio", func(s Summary) Interval { return s.CachedRatio }, true},
}

// PolicyRatios computes, for TTFT p90, TTFT p99 and the cached-token ratio, policy's per-seed
// ratio to the best other policy in that seed (BestOtherRatios on each run's own figures). nil
// when the policy did not run or no other policy did.
func PolicyRatios(runs []*RunResult, policy string) []BestOtherRatio {
	type key struct {
		label string
		seed  int
	}
	by := map[key]Summary{}
	var seeds []int
	labels := map[string]bool{}
	for _, r := range runs {
		by[key{r.Policy, r.Seed}] = summarize([]*RunResult{r})
		labels[r.Policy] = true
		if r.Policy == policy {
			seeds = append(seeds, r.Seed)
		}
	}
	if len(seeds) == 0 || len(labels) < 2 {
		return nil
	}
	var out []BestOtherRatio
	for _, m := range bestOtherMetrics {
		vals := map[string][]float64{}
		for l := range labels {
			for _, s := range seeds {
				v := math.NaN()
				if sum, ok := by[key{l, s}]; ok {
					v = m.of(sum).Mean
				}
				vals[l] = append(vals[l], v)
			}
		}
		b := BestOtherRatio{Metric: m.name, Policy: policy, Seeds: seeds}
		b.ratios, b.BestOther = BestOtherRatios(vals, policy, m.higher)
		for _, r := range b.ratios {
			if math.IsNaN(r) || math.IsInf(r, 0) {
				b.PerSeed = append(b.PerSeed, nil)
			} else {
				b.PerSeed = append(b.PerSeed, &r)
			}
		}
		b.Ratio = TInterval(b.ratios)
		if hw := RelativeHalfWidth(b.Ratio); !math.IsInf(hw, 0) && !math.IsNaN(hw) {
			b.HalfWidth = &hw
		}
		out = append(out, b)
	}
	return out
}

// TTFTRatiosSettled is the adaptive-seed stopping rule of a replay: the TTFT p90 and p99 ratios'
// intervals both have a relative half-width under target (which needs at least 3 seeds with a
// ratio), or maxSeeds seeds have run (EnoughSeeds on each).
func TTFTRatiosSettled(rs []BestOtherRatio, maxSeeds int, target float64) bool {
	found := 0
	for _, b := range rs {
		if b.Metric != "ttft_p90_s" && b.Metric != "ttft_p99_s" {
			continue
		}
		found++
		if !EnoughSeeds(b.ratios, maxSeeds, target) {
			return false
		}
	}
	return found == 2
}
