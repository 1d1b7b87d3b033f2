package policies

import (
	"math"
	"sync"
	"time"

	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/score"
)

// Timing is the engines' first-token time as kv-ttft's fit has measured it: the expected time to
// first token of a request routed to a replica is
//
//	LatencyS + SecondsPerToken x (prefill tokens queued ahead + its own uncached tokens)
//	         + SecondsPerDecodeToken x context tokens (Candidate.ContextTokens)
//
// The prefill ahead is score.PrefillAhead: the ledger's counter less the drain it measured.
type Timing struct {
	LatencyS              float64
	SecondsPerToken       float64
	SecondsPerDecodeToken float64
	// Observations is the (decayed) weight of first-token times behind the fit; 0 when the
	// values are the prior.
	Observations float64
}

// DefaultTiming is the prior before anything is measured in the fleet: a vLLM engine's order of
// magnitude (10k prefill tokens/s, a 50 ms step and transfer, 0.1 ms of step time per 1k tokens
// of decode context). Only its proportions matter while every replica uses it; the first
// observations replace it.
var DefaultTiming = Timing{
	LatencyS:              0.05,
	SecondsPerToken:       1e-4,
	SecondsPerDecodeToken: 1e-7,
}

// TTFT is the expected time to first token at nowNs of a request whose own uncached prefill is
// uncached tokens on a replica with candidate c's load, under this timing.
func (c Timing) TTFT(cand *score.Candidate, uncached float64, nowNs int64) float64 {
	return c.LatencyS + c.SecondsPerToken*(score.PrefillAhead(cand, nowNs)+uncached) +
		c.SecondsPerDecodeToken*float64(cand.ContextTokens())
}

// The fit: every first token the ledger sees is one observation of the engines' timing,
//
//	ttft = L + s·x + c·d
//
// x: prefill tokens queued ahead at routing plus the request's own uncached tokens; d:
// tokens held by running sequences at routing. The fit is exponentially weighted least squares
// with a Huber weight (a residual beyond hubK robust scales counts with weight hubK·scale/|r|,
// so one stalled request moves the fit by a bounded step), pulled toward the prior
// (DefaultTiming unless given) by priorWeight pseudo-observations. Its state is fixed: a 3x3
// matrix, a 3-vector, the solution and two scalars.
const (
	nFeat = 3
	// fleetDecay is the per-observation forgetting factor: the fit remembers about its last 200
	// first tokens, so it follows the engines' batch shape as the load drifts.
	fleetDecay = 0.995
	// Feature units: the fit is solved on x/xUnit and d/dUnit so every coordinate is of order 1
	// and the prior's weight means the same in each.
	xUnit       = 1000.0
	dUnit       = 10000.0
	priorWeight = 2.0
	hubK        = 3.0
	// minSecondsPerToken keeps the fitted rate finite: no engine prefills faster than 10M
	// tokens/s, and a fit that says it does has seen no spread in x yet.
	minSecondsPerToken = 1e-7
)

// linFit is one weighted least-squares state.
type linFit struct {
	a     [nFeat][nFeat]float64
	b     [nFeat]float64
	theta [nFeat]float64 // solved, in feature units
	scale float64        // robust residual scale (seconds)
	w     float64        // decayed observation weight
}

func features(x, d float64) [nFeat]float64 { return [nFeat]float64{1, x / xUnit, d / dUnit} }

func thetaOf(c Timing) [nFeat]float64 {
	return [nFeat]float64{c.LatencyS, c.SecondsPerToken * xUnit, c.SecondsPerDecodeToken * dUnit}
}

func (f *linFit) timing() Timing {
	return Timing{LatencyS: f.theta[0], SecondsPerToken: f.theta[1] / xUnit,
		SecondsPerDecodeToken: f.theta[2] / dUnit, Observations: f.w}
}

// observe adds one observation y at features phi, decayed by decay, and re-solves toward prior.
func (f *linFit) observe(phi [nFeat]float64, y, decay float64, prior [nFeat]float64) {
	pred := 0.0
	for j := range phi {
		pred += f.theta[j] * phi[j]
	}
	r := math.Abs(y - pred)
	wt := 1.0
	if f.w == 0 {
		// No scale yet: start it at half the first observation (or 10 ms), so the first
		// outliers are judged against the size of what is being measured.
		f.scale = math.Max(y/2, 0.01)
	} else if r > hubK*f.scale {
		wt = hubK * f.scale / r
	}
	// The scale follows the clipped residual, so a run of outliers widens it slowly.
	f.scale = 0.9*f.scale + 0.1*math.Max(math.Min(r, hubK*f.scale), 1e-3)
	for j := range phi {
		for k := range phi {
			f.a[j][k] = decay*f.a[j][k] + wt*phi[j]*phi[k]
		}
		f.b[j] = decay*f.b[j] + wt*phi[j]*y
	}
	f.w = decay*f.w + wt
	f.solve(prior)
}

// solve sets theta to the ridge solution (A + λI)θ = b + λ·prior, then clamps it to an engine's
// range: no negative latency or interference, a positive cost per token.
func (f *linFit) solve(prior [nFeat]float64) {
	var m [nFeat][nFeat + 1]float64
	for j := 0; j < nFeat; j++ {
		for k := 0; k < nFeat; k++ {
			m[j][k] = f.a[j][k]
		}
		m[j][j] += priorWeight
		m[j][nFeat] = f.b[j] + priorWeight*prior[j]
	}
	// Gaussian elimination with partial pivoting; the ridge keeps the matrix positive definite.
	for col := 0; col < nFeat; col++ {
		p := col
		for r := col + 1; r < nFeat; r++ {
			if math.Abs(m[r][col]) > math.Abs(m[p][col]) {
				p = r
			}
		}
		m[col], m[p] = m[p], m[col]
		for r := col + 1; r < nFeat; r++ {
			k := m[r][col] / m[col][col]
			for c := col; c <= nFeat; c++ {
				m[r][c] -= k * m[col][c]
			}
		}
	}
	var th [nFeat]float64
	for r := nFeat - 1; r >= 0; r-- {
		v := m[r][nFeat]
		for c := r + 1; c < nFeat; c++ {
			v -= m[r][c] * th[c]
		}
		th[r] = v / m[r][r]
	}
	th[0] = math.Max(th[0], 0)
	th[1] = math.Max(th[1], minSecondsPerToken*xUnit)
	th[2] = math.Max(th[2], 0)
	if !finite(th) {
		return // keep the last good fit
	}
	f.theta = th
}

func finite(th [nFeat]float64) bool {
	for _, v := range th {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return false
		}
	}
	return true
}

// TTFTFit is kv-ttft's engine timing, fitted from every first token (one fit for the fleet, as
// the ledger's drain: a pool serves one model on one kind of engine). It is a load.Observer: the
// ledger tells it of each first token with what the replica carried when the request was routed
// (load.Record's Ahead, Decoding). Its own lock makes reads safe beside the observer's writes.
type TTFTFit struct {
	mu    sync.Mutex
	prior Timing
	fleet linFit
}

// NewTTFTFit returns an empty fit that starts from prior (DefaultTiming when its
// SecondsPerToken is 0).
func NewTTFTFit(prior Timing) *TTFTFit {
	if prior.SecondsPerToken <= 0 {
		prior = DefaultTiming
	}
	f := &TTFTFit{prior: prior}
	f.fleet.theta = thetaOf(prior)
	return f
}

// Observe records one first token: ttft seconds after routing, with ahead tokens of prefill
// queued before it, uncached of its own and decode tokens held at routing. A negative or
// non-finite time is ignored.
func (f *TTFTFit) Observe(ahead, uncached, decode int, ttft float64) {
	if !(ttft >= 0) || math.IsInf(ttft, 0) {
		return
	}
	phi := features(float64(ahead+uncached), float64(decode))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fleet.observe(phi, ttft, fleetDecay, thetaOf(f.prior))
}

// Read is the timing every replica uses: the fit, or the prior before any observation. It
// changes nothing.
func (f *TTFTFit) Read() Timing {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fleet.w > 0 {
		return f.fleet.timing()
	}
	return f.prior
}

// FirstToken observes the request's first token (load.Observer).
func (f *TTFTFit) FirstToken(_ load.ID, r *load.Record, at time.Time) {
	f.Observe(r.Ahead, r.Uncached, r.Decoding, at.Sub(r.At).Seconds())
}

// Routed, Failed and Done change nothing (load.Observer).
func (f *TTFTFit) Routed(load.ID, *load.Record)            {}
func (f *TTFTFit) Failed(load.ID, *load.Record)            {}
func (f *TTFTFit) Done(load.ID, *load.Record, *load.Usage) {}
