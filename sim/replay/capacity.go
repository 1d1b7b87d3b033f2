package replay

import (
	"context"
	"fmt"
	"math"
)

// RateSearch finds the highest arrival rate at which a policy meets its SLO, one probe at a
// time, so the caller can interleave the searches of several policies (drifting machine load
// then hits all of them alike). It ramps by doubling from the start rate until a probe fails (or
// halves until one passes), then bisects geometrically between the highest passing and the lowest
// failing rate until they are within Precision of each other. It assumes that meeting the SLO is
// monotone in the rate; a noisy probe that breaks that only narrows the bracket wrongly, never
// loops.
type RateSearch struct {
	// Precision is the relative width at which the bracket is accepted (0.05: within 5%).
	Precision float64
	// MaxProbes bounds the probes; Floor is the lowest rate tried (below it the capacity is 0).
	MaxProbes int
	Floor     float64

	next   float64
	pass   float64 // highest rate that met the SLO (0: none yet)
	fail   float64 // lowest rate that did not (0: none yet)
	probes int
}

// NewRateSearch starts a search at start (> 0).
func NewRateSearch(start, precision float64, maxProbes int) *RateSearch {
	return &RateSearch{Precision: precision, MaxProbes: maxProbes, Floor: start / 64, next: start}
}

// Next returns the rate to probe, or false when the search is done.
func (s *RateSearch) Next() (float64, bool) {
	if s.done() {
		return 0, false
	}
	return s.next, true
}

func (s *RateSearch) done() bool {
	switch {
	case s.probes >= s.MaxProbes:
		return true
	case s.fail > 0 && s.pass > 0:
		return s.fail <= s.pass*(1+s.Precision)
	case s.pass == 0 && s.fail > 0:
		return s.fail <= s.Floor
	}
	return false
}

// Observe records whether the rate Next returned met the SLO.
func (s *RateSearch) Observe(ok bool) {
	r := s.next
	s.probes++
	if ok {
		s.pass = math.Max(s.pass, r)
		if s.fail > 0 && s.fail <= s.pass { // a noisy probe: forget the lower failure
			s.fail = 0
		}
	} else if s.fail == 0 || r < s.fail {
		s.fail = r
		if s.pass >= s.fail { // a noisy probe: the failure wins, it is the newer evidence
			s.pass = 0
		}
	}
	switch {
	case s.fail == 0:
		s.next = 2 * s.pass
	case s.pass == 0:
		s.next = s.fail / 2
	default:
		s.next = math.Sqrt(s.pass * s.fail)
	}
}

// Capacity is the highest rate that met the SLO (0 if none did) and the probes it took.
func (s *RateSearch) Capacity() (float64, int) { return s.pass, s.probes }

// MeetsSLO is the capacity criterion: no failed request and TTFT p99 at most slo (same unit as
// the TTFTs). An empty run does not meet it.
func MeetsSLO(ttfts []float64, failed int, slo float64) bool {
	if failed > 0 || len(ttfts) == 0 {
		return false
	}
	return Percentile(ttfts, 0.99) <= slo
}

// CapacityRatios gives, for each seed, the policy's capacity over the best other policy's, and
// which policy that was. caps[p][i] is policy p's capacity in seed i; a seed where the best other
// policy has capacity 0 gives NaN (no ratio), left out of the interval by TInterval.
func CapacityRatios(caps map[string][]float64, policy string) (ratios []float64, best []string) {
	return BestOtherRatios(caps, policy, true)
}

// RelativeHalfWidth is the interval's half-width over its mean (+Inf when it cannot be told:
// fewer than 3 values, a Range, or a zero or NaN mean).
func RelativeHalfWidth(iv Interval) float64 {
	if iv.N < 3 || iv.Range || !(iv.Mean > 0) {
		return math.Inf(1)
	}
	return (iv.Hi - iv.Mean) / iv.Mean
}

// EnoughSeeds is the stopping rule: at least 3 seeds and a relative half-width under target, or
// maxSeeds reached.
func EnoughSeeds(ratios []float64, maxSeeds int, target float64) bool {
	return len(ratios) >= maxSeeds || RelativeHalfWidth(TInterval(ratios)) < target
}

// CapacityOptions shape a capacity search (kvbench replay --capacity).
type CapacityOptions struct {
	Policy    string  // the policy whose ratio to the best other is reported (kv)
	Start     float64 // first rate probed (regimes: req/s; traces: replay speed)
	SLO       float64 // TTFT p99 bound, seconds of trace time
	TimeScale float64 // the engines' --time-scale: wall seconds x TimeScale = trace seconds
	MaxSeeds  int     // at most 10
	Target    float64 // stop once the ratio's relative half-width is under this (0.03)
	Precision float64 // the rate search's bracket (0.05)
	MaxProbes int     // per policy and seed
}

// CapacityProbe is one (policy, seed, rate) run of a search.
type CapacityProbe struct {
	Policy string  `json:"policy"`
	Seed   int     `json:"seed"`
	Rate   float64 `json:"rate"`
	// Requests and Span are what the probe replayed: its requests and the wall seconds from the
	// first arrival to the last (a trace at speed 2 arrives in half its own time).
	Requests int     `json:"requests"`
	Span     float64 `json:"span_s"`
	P99      float64 `json:"ttft_p99_trace_s"`
	Failed   int     `json:"failed"`
	Met      bool    `json:"met_slo"`
	CPU      CPUUse  `json:"cpu"`
}

// CapacityResult is a capacity run's outcome: each policy's capacity per seed, the policy's ratio
// to the best other per seed with its interval, and every probe.
type CapacityResult struct {
	Capacity     map[string][]float64 `json:"capacity"`
	CapacityMean map[string]Interval  `json:"capacity_interval"`
	Ratio        []float64            `json:"-"`
	RatioPerSeed []*float64           `json:"ratio_per_seed"` // null where the best other had no capacity
	BestOther    []string             `json:"best_other_per_seed"`
	RatioCI      Interval             `json:"ratio"`
	HalfWidth    *float64             `json:"ratio_relative_half_width,omitempty"` // nil under 3 seeds
	InvalidRuns  int                  `json:"invalid_runs"`
	Probes       []CapacityProbe      `json:"probes"`
}

// Capacity searches every policy's capacity at the SLO, seed after seed, the policies' probes
// interleaved, adding seeds until the ratio's interval is tight enough or MaxSeeds. workload
// makes the workload of a rate and seed.
func Capacity(ctx context.Context, o Options, c CapacityOptions, workload func(rate float64, seed int) (Workload, error)) (*CapacityResult, error) {
	c.MaxSeeds = min(max(c.MaxSeeds, 1), 10)
	res := &CapacityResult{Capacity: map[string][]float64{}, CapacityMean: map[string]Interval{}}
	// Seeds run from o.FirstSeed, as a plain replay's do, so a search can be extended by the
	// seeds it did not run.
	first := max(o.FirstSeed, 1)
	for seed := first; seed < first+c.MaxSeeds; seed++ {
		searches := make([]*RateSearch, len(o.Policies))
		for i := range searches {
			searches[i] = NewRateSearch(c.Start, c.Precision, c.MaxProbes)
		}
		for active := true; active; {
			active = false
			for i, pol := range o.Policies {
				rate, ok := searches[i].Next()
				if !ok {
					continue
				}
				active = true
				w, err := workload(rate, seed)
				if err != nil {
					return res, err
				}
				if err := o.check(w); err != nil {
					return res, err
				}
				r, err := runOne(ctx, o, w.Jittered(uint64(seed), o.Jitter), pol, seed)
				if err != nil {
					return res, fmt.Errorf("policy %s seed %d rate %g: %w", pol, seed, rate, err)
				}
				p := probeOf(r, rate, c)
				p.Requests, p.Span = len(w.Requests), w.Span().Seconds()
				res.Probes = append(res.Probes, p)
				if p.CPU.Invalid {
					res.InvalidRuns++
				}
				searches[i].Observe(p.Met)
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "capacity: %-20s seed %d rate %-8.3g p99 %.2fs failed %d met %v host cpu %.0f%% replay cpu %.0f%%\n",
						pol, seed, rate, p.P99, p.Failed, p.Met, 100*p.CPU.Host, 100*p.CPU.Replay)
				}
			}
		}
		for i, pol := range o.Policies {
			cp, _ := searches[i].Capacity()
			res.Capacity[pol] = append(res.Capacity[pol], cp)
		}
		res.Ratio, res.BestOther = CapacityRatios(res.Capacity, c.Policy)
		if seed-first+1 >= 3 && EnoughSeeds(res.Ratio, c.MaxSeeds, c.Target) {
			break
		}
	}
	for pol, v := range res.Capacity {
		res.CapacityMean[pol] = TInterval(v)
	}
	res.RatioCI = TInterval(res.Ratio)
	for _, r := range res.Ratio {
		if math.IsNaN(r) {
			res.RatioPerSeed = append(res.RatioPerSeed, nil)
		} else {
			res.RatioPerSeed = append(res.RatioPerSeed, &r)
		}
	}
	if hw := RelativeHalfWidth(res.RatioCI); !math.IsInf(hw, 0) && !math.IsNaN(hw) {
		res.HalfWidth = &hw
	}
	return res, nil
}

// probeOf judges one run against the SLO in trace time, each request's TTFT counted from its
// arrival (Outcome.Held included).
func probeOf(r *RunResult, rate float64, c CapacityOptions) CapacityProbe {
	p := CapacityProbe{Policy: r.Policy, Seed: r.Seed, Rate: rate, CPU: r.CPU}
	var ttfts []float64
	for _, o := range r.Outcomes {
		if o.Err != "" {
			p.Failed++
			continue
		}
		// From the trace's arrival: a request the concurrency cap held waited that long too,
		// and a user would have (TTFT alone starts when the replay sent it).
		ttfts = append(ttfts, (o.Held+o.TTFT)*c.TimeScale)
	}
	if len(ttfts) > 0 {
		p.P99 = Percentile(ttfts, 0.99)
	}
	p.Met = MeetsSLO(ttfts, p.Failed, c.SLO)
	return p
}
