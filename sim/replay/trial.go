package replay

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/kvroute/kvroute/sim/fleet"
)

// LoadCapture reads the files kvrouter --capture-dir wrote as one trace (fleet.LoadTrace on
// the directory).
func LoadCapture(dir string) (*fleet.Trace, error) { return fleet.LoadTrace(dir) }

// TrialAgreement compares the hit rates a trial predicted (kvbench cache on a captured trace)
// with those a live run of every policy measured on the same traffic.
type TrialAgreement struct {
	// LiveTop and TrialTop are the policies with the highest hit rate; ties (within TieBand of
	// the best) are all listed.
	LiveTop, TrialTop []string
	// Ratio is, per policy, trial / live hit rate (1 = exact); NaN where both are below Floor.
	Ratio map[string]float64
	// SameTop: the trial's best policy is among the live best, and the other way round.
	SameTop bool
	// WorstRatio is the ratio furthest from 1 (1 when every policy is below Floor).
	WorstRatio float64
}

// TieBand is how close (absolute hit rate) two policies must be to count as tied for the top;
// Floor is the hit rate below which a ratio says nothing (both runs found almost no reuse).
const (
	TieBand = 0.02
	Floor   = 0.05
)

// CompareTrial computes the agreement of trial and live hit rates, by policy.
func CompareTrial(live, trial map[string]float64) TrialAgreement {
	a := TrialAgreement{Ratio: map[string]float64{}, WorstRatio: 1}
	a.LiveTop, a.TrialTop = top(live), top(trial)
	a.SameTop = contains(a.LiveTop, a.TrialTop[0]) && contains(a.TrialTop, a.LiveTop[0])
	for p, l := range live {
		t, ok := trial[p]
		if !ok {
			continue
		}
		if l < Floor && t < Floor {
			a.Ratio[p] = math.NaN()
			continue
		}
		r := t / l
		a.Ratio[p] = r
		if math.Abs(r-1) > math.Abs(a.WorstRatio-1) || math.IsInf(r, 0) {
			a.WorstRatio = r
		}
	}
	return a
}

// top lists the policies within TieBand of the best, best first (name order among equals).
func top(m map[string]float64) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		if m[names[i]] != m[names[j]] {
			return m[names[i]] > m[names[j]]
		}
		return names[i] < names[j]
	})
	var out []string
	for _, n := range names {
		if m[n] >= m[names[0]]-TieBand {
			out = append(out, n)
		}
	}
	return out
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// String is one line per agreement, for logs and reports.
func (a TrialAgreement) String() string {
	var ps []string
	for p := range a.Ratio {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	var b strings.Builder
	fmt.Fprintf(&b, "live top %v, trial top %v, same top %v; trial/live:", a.LiveTop, a.TrialTop, a.SameTop)
	for _, p := range ps {
		fmt.Fprintf(&b, " %s %.3f", p, a.Ratio[p])
	}
	return b.String()
}
