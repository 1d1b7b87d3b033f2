package assess

import "math"

// The reuse model behind the estimate.
//
// Counters give one number per replica: the share of looked-up prompt tokens that were cached.
// They do not say how the reuse is spread over prefixes, and that is what decides how much
// routing can add. The model makes the spread explicit:
//
//   - Placement today is blind to the prompt (random, round-robin, least-loaded): each request
//     lands on any of N replicas with equal chance, independently of its prefix.
//   - A prompt token either belongs to a prefix that k requests of the fleet look up within a
//     cache lifetime, or is unique (k = 1). Caches keep what they stored for that long (no
//     eviction inside the lifetime).
//
// With one shared cache, which is what perfect prefix routing approximates, only the first of
// the k lookups misses: hit share (k-1)/k. With blind placement every replica the prefix reaches
// misses once, and k requests reach N(1-(1-1/N)^k) distinct replicas on average, so the hit
// share is 1 - N(1-(1-1/N)^k)/k. For a hot prefix (k >> N) the two meet; for a prefix shared by
// a few requests (k ~ N) blind placement loses most of it.
//
// The observed blind hit rate h fixes a weighted mix of such classes but not which mix. The
// ceiling is the most favourable mix that still explains h (the upper concave hull of the
// (blind, shared) points at h): the most routing could add if the reuse were as scattered as h
// allows. The least is nothing (all reuse in prefixes hot enough to be on every replica
// already). When caches do evict, routing also pools their capacity, which the model leaves out,
// so on cache-bound fleets the real gain can exceed the ceiling; on fleets whose prompts carry
// long unique tails it is below it.

// blindHitShare is the expected hit share of a prefix looked up k times under blind placement
// over n replicas.
func blindHitShare(n, k float64) float64 {
	if k <= 1 {
		return 0
	}
	reached := n * (1 - math.Pow(1-1/n, k)) // distinct replicas the k lookups land on
	return 1 - reached/k
}

// sharedHitShare is the hit share of the same prefix with one shared cache: all but the first.
func sharedHitShare(k float64) float64 {
	if k <= 1 {
		return 0
	}
	return (k - 1) / k
}

// Coverage is the expected share of n replicas that already hold a prefix after k blind
// lookups.
func Coverage(n int, k float64) float64 {
	if n <= 0 || k <= 0 {
		return 0
	}
	return 1 - math.Pow(1-1/float64(n), k)
}

// Ceiling is the favourable reading of an observed blind hit rate.
type Ceiling struct {
	// HitRate is what one shared cache would hit in that reading (>= the blind rate).
	HitRate float64 `json:"shared_hit_rate"`
	// ReusedShare is the share of prompt tokens in reused prefixes (k >= 2) in that reading.
	ReusedShare float64 `json:"reused_share"`
	// RecurLow..RecurHigh is how many lookups each reused prefix gets across the fleet in that
	// reading (the two classes the hull mixes; equal when one class suffices).
	RecurLow  int `json:"recur_low"`
	RecurHigh int `json:"recur_high"`
}

// kInfinity stands for "looked up so often that every replica holds it": blind = shared = 1.
const kInfinity = math.MaxInt32

// modelKs are the reuse classes the hull is built from: every k up to 256, then a geometric
// ladder; past that both shares are within 1e-5 of 1.
var modelKs = func() []int {
	var ks []int
	for k := 1; k <= 256; k++ {
		ks = append(ks, k)
	}
	for k := 256.0; k < 1e6; k *= 1.1 {
		ks = append(ks, int(k))
	}
	return append(ks, kInfinity)
}()

// SharedCacheCeiling returns the favourable reading of blind hit rate h over n replicas.
// One replica (or none) has nothing to gain: the ceiling is h itself.
func SharedCacheCeiling(h float64, n int) Ceiling {
	h = math.Max(0, math.Min(1, h))
	if n <= 1 || h == 0 || h == 1 {
		c := Ceiling{HitRate: h}
		if h > 0 {
			c.ReusedShare, c.RecurLow, c.RecurHigh = 1, kInfinity, kInfinity
		}
		return c
	}
	type pt struct {
		k    int
		b, a float64
	}
	pts := make([]pt, 0, len(modelKs))
	for _, k := range modelKs {
		if k == kInfinity {
			pts = append(pts, pt{k, 1, 1})
			continue
		}
		pts = append(pts, pt{k, blindHitShare(float64(n), float64(k)), sharedHitShare(float64(k))})
	}
	// The blind share grows with k, so pts is sorted by b; the best mix at h is a chord between
	// one point left of h and one right of it.
	best := Ceiling{HitRate: h}
	for i := range pts {
		if pts[i].b > h {
			break
		}
		for j := len(pts) - 1; j >= i && pts[j].b >= h; j-- {
			p, q := pts[i], pts[j]
			w := 1.0 // weight on q
			if q.b > p.b {
				w = (h - p.b) / (q.b - p.b)
			}
			a := (1-w)*p.a + w*q.a
			if a <= best.HitRate {
				continue
			}
			c := Ceiling{HitRate: a, RecurLow: q.k, RecurHigh: q.k}
			if w >= 1 || p.k == q.k {
				c.ReusedShare = 1
			} else if p.k == 1 {
				c.ReusedShare = w // the rest is unique tokens
			} else {
				c.ReusedShare, c.RecurLow = 1, p.k
			}
			best = c
		}
	}
	return best
}
