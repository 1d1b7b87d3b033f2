package replay

import (
	"math"
	"testing"
)

func TestCompareTrial(t *testing.T) {
	a := CompareTrial(map[string]float64{"kv": 0.6, "rr": 0.4, "load": 0.01},
		map[string]float64{"kv": 0.55, "rr": 0.42, "load": 0.02})
	if !a.SameTop || a.LiveTop[0] != "kv" || math.Abs(a.WorstRatio-0.55/0.6) > 1e-9 || !math.IsNaN(a.Ratio["load"]) {
		t.Fatalf("%+v", a)
	}
	// A tie at the top live: the trial's best must be one of the tied, and the live best within
	// the trial's band.
	b := CompareTrial(map[string]float64{"kv": 0.7, "rr": 0.69}, map[string]float64{"kv": 0.6, "rr": 0.7})
	if b.SameTop {
		t.Fatalf("trial top rr alone, live top kv: %+v", b)
	}
	c := CompareTrial(map[string]float64{"kv": 0.7, "rr": 0.69}, map[string]float64{"kv": 0.695, "rr": 0.7})
	if !c.SameTop {
		t.Fatalf("%+v", c)
	}
}
