package replay

import (
	"encoding/json"
	"math"
	"sort"
	"strconv"
)

// Percentile is the p-quantile (0..1) of xs by linear interpolation between order statistics
// (NumPy's default); NaN for no samples. xs is not modified.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []float64, p float64) float64 {
	if p <= 0 {
		return s[0]
	}
	if p >= 1 {
		return s[len(s)-1]
	}
	pos := p * float64(len(s)-1)
	lo := int(math.Floor(pos))
	if lo+1 >= len(s) {
		return s[lo]
	}
	f := pos - float64(lo)
	return s[lo]*(1-f) + s[lo+1]*f
}

// Interval is a mean over seeds with its two-sided 95% Student-t interval, from 3 seeds on. With
// one seed the interval is the value itself (no spread can be estimated), with two it is their
// min..max (Range): a t-interval on one degree of freedom (t = 12.7) is too wide to say
// anything and runs below zero. N says how many seeds it rests on.
type Interval struct {
	Mean  float64 `json:"mean"`
	Lo    float64 `json:"lo"`
	Hi    float64 `json:"hi"`
	N     int     `json:"n"`
	Range bool    `json:"range,omitempty"`
}

// TInterval is the 95% t-interval of the mean of per-seed values. A t-interval rather than a
// bootstrap: with 3..5 seeds a bootstrap's resamples are too few to mean anything. NaN values
// (a seed with no successful request) are left out. Two values give their min..max instead.
// The quantities measured here (times, rates, shares) are never negative, so neither is the
// interval of non-negative values: its lower end is cut at 0.
func TInterval(vals []float64) Interval {
	var v []float64
	for _, x := range vals {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	n := len(v)
	if n == 0 {
		return Interval{Mean: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	}
	mean := 0.0
	for _, x := range v {
		mean += x
	}
	mean /= float64(n)
	if n == 1 {
		return Interval{Mean: mean, Lo: mean, Hi: mean, N: 1}
	}
	if n == 2 {
		return Interval{Mean: mean, Lo: math.Min(v[0], v[1]), Hi: math.Max(v[0], v[1]), N: 2, Range: true}
	}
	ss, nonNeg := 0.0, true
	for _, x := range v {
		ss += (x - mean) * (x - mean)
		nonNeg = nonNeg && x >= 0
	}
	half := tCrit95(n-1) * math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	lo := mean - half
	if nonNeg && lo < 0 {
		lo = 0
	}
	return Interval{Mean: mean, Lo: lo, Hi: mean + half, N: n}
}

// t975 holds the 0.975 quantiles of Student's t for 1..30 degrees of freedom.
var t975 = [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}

// tCrit95 is Student's t 0.975 quantile: the table up to 30 degrees of freedom, past it the
// Cornish-Fisher expansion around the normal quantile (within 0.001 of the exact value from 30
// on), so an interval over many seeds is not the normal one, a little too narrow.
func tCrit95(df int) float64 {
	if df >= 1 && df <= len(t975) {
		return t975[df-1]
	}
	if df < 1 {
		return math.NaN()
	}
	const z = 1.959963984540054
	n := float64(df)
	z3, z5, z7 := z*z*z, z*z*z*z*z, z*z*z*z*z*z*z
	return z + (z3+z)/(4*n) + (5*z5+16*z3+3*z)/(96*n*n) + (3*z7+19*z5+17*z3-15*z)/(384*n*n*n)
}

// MarshalJSON writes NaN (no successful request in any seed) as null: JSON has no NaN.
func (iv Interval) MarshalJSON() ([]byte, error) {
	f := func(x float64) string {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return "null"
		}
		return strconv.FormatFloat(math.Round(x*1e4)/1e4, 'f', -1, 64)
	}
	rng := ""
	if iv.Range {
		rng = `,"range":true`
	}
	return []byte(`{"mean":` + f(iv.Mean) + `,"lo":` + f(iv.Lo) + `,"hi":` + f(iv.Hi) + `,"n":` + strconv.Itoa(iv.N) + rng + `}`), nil
}

// finite is x, or nil (JSON null) when x is NaN or infinite: encoding/json refuses those, and a
// figure that could not be measured (no request in a window, no successful seed) is one.
func finite(x float64) *float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return nil
	}
	return &x
}

// MarshalJSON writes an unmeasured (NaN) figure as null.
func (r ScaleUpResult) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		NewShareOfFair *float64 `json:"new_share_of_fair"`
		HitBefore      *float64 `json:"hit_before"`
		HitDuring      *float64 `json:"hit_during"`
		HitDrop        *float64 `json:"hit_drop"`
	}{finite(r.NewShareOfFair), finite(r.HitBefore), finite(r.HitDuring), finite(r.HitDrop)})
}
