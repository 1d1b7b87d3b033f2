package assess

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The closed form for blind placement agrees with placing requests at random.
func TestBlindHitShareMatchesSimulation(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ n, k int }{{4, 2}, {4, 3}, {8, 5}, {3, 12}, {16, 4}} {
		const prefixes = 20000
		hits := 0
		for range prefixes {
			seen := make([]bool, c.n)
			for range c.k {
				r := rng.IntN(c.n)
				if seen[r] {
					hits++
				}
				seen[r] = true
			}
		}
		got := float64(hits) / float64(prefixes*c.k)
		want := blindHitShare(float64(c.n), float64(c.k))
		if math.Abs(got-want) > 0.01 {
			t.Errorf("n=%d k=%d: simulated %.4f, closed form %.4f", c.n, c.k, got, want)
		}
	}
	if blindHitShare(1, 5) != sharedHitShare(5) || blindHitShare(4, 1) != 0 {
		t.Error("one replica must equal one shared cache; a unique token never hits")
	}
}

func TestCeilingShape(t *testing.T) {
	for _, n := range []int{2, 4, 8, 16} {
		// Below the k=2 point the best mix is unique tokens plus prefixes shared by two
		// requests: the shared cache hits N times the blind rate.
		h := 0.5 / (2 * float64(n))
		c := SharedCacheCeiling(h, n)
		if math.Abs(c.HitRate-float64(n)*h) > 1e-9 || c.RecurLow != 2 || math.Abs(c.ReusedShare-2*float64(n)*h) > 1e-9 {
			t.Errorf("n=%d h=%v: %+v, want hit %v from k=2 pairs", n, h, c, float64(n)*h)
		}
		prev := 0.0
		for h := 0.0; h <= 1; h += 0.01 {
			c := SharedCacheCeiling(h, n)
			if c.HitRate < h-1e-12 || c.HitRate > 1 || c.HitRate < prev-1e-12 {
				t.Fatalf("n=%d h=%.2f: ceiling %v (previous %v) must be in [h, 1] and grow with h", n, h, c.HitRate, prev)
			}
			prev = c.HitRate
			if more := SharedCacheCeiling(h, 2*n); more.HitRate < c.HitRate-1e-12 {
				t.Fatalf("h=%.2f: %d replicas ceiling %v below %d replicas' %v", h, 2*n, more.HitRate, n, c.HitRate)
			}
		}
	}
	if c := SharedCacheCeiling(0.4, 1); c.HitRate != 0.4 {
		t.Errorf("one replica: %+v", c)
	}
	if c := SharedCacheCeiling(0, 8); c.HitRate != 0 || c.ReusedShare != 0 {
		t.Errorf("no hits: %+v", c)
	}
}

// No mix of reuse classes that explains a blind hit rate lets one shared cache beat the ceiling.
func TestCeilingBoundsRandomMixes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		n := 2 + rng.IntN(15)
		var blind, shared, mass float64
		for range 1 + rng.IntN(4) {
			s := rng.Float64() * (1 - mass)
			k := float64(1 + rng.IntN(60))
			mass += s
			blind += s * blindHitShare(float64(n), k)
			shared += s * sharedHitShare(k)
		}
		if c := SharedCacheCeiling(blind, n); shared > c.HitRate+1e-9 {
			t.Fatalf("n=%d: a mix with blind %.4f reaches %.4f, above the ceiling %.4f", n, blind, shared, c.HitRate)
		}
	}
}

func TestCoverageAndRecurFloor(t *testing.T) {
	if got := Coverage(4, 1); got != 0.25 {
		t.Errorf("one lookup over 4 replicas covers %v", got)
	}
	k := recurFloor(0.5, 4)
	if blindHitShare(4, float64(k)) < 0.5 || blindHitShare(4, float64(k-1)) >= 0.5 {
		t.Errorf("recurFloor(0.5, 4) = %d is not the smallest k reaching 0.5", k)
	}
}
