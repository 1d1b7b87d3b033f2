package load

import (
	"math"
	"sync"

	"github.com/kvroute/kvroute/router/score"
)

// The calibration: every first token the ledger sees is one observation of the engines' timing,
//
//	ttft = L + s·x + c·d
//
// x: prefill tokens queued ahead at routing plus the request's own uncached tokens; d:
// tokens held by running sequences at routing. The fit is exponentially weighted least squares
// with a Huber weight (a residual beyond hubK robust scales counts with weight hubK·scale/|r|,
// so one stalled request moves the fit by a bounded step), pulled toward
// score.DefaultCalibration by priorWeight pseudo-observations. Its state is fixed: a 3x3
// matrix, a 3-vector, the solution and two scalars.
const (
	nFeat = 3
	// Feature units: the fit is solved on x/xUnit and d/dUnit so every coordinate is of order 1
	// and the prior's weight means the same in each.
	xUnit = 1000.0
	dUnit = 10000.0
	// fleetDecay is the per-observation forgetting factor: the fit remembers about its last 200
	// first tokens, so it follows the engines' batch shape as the load drifts.
	fleetDecay  = 0.995
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

func thetaOf(c score.Calibration) [nFeat]float64 {
	return [nFeat]float64{c.LatencyS, c.SecondsPerToken * xUnit, c.SecondsPerDecodeToken * dUnit}
}

func (f *linFit) calibration() score.Calibration {
	return score.Calibration{LatencyS: f.theta[0], SecondsPerToken: f.theta[1] / xUnit,
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

// Calibrations is the fleet's engine timing, fitted from every replica's first tokens. The
// ledger owns the one instance; decisions read it into Candidate.Calib. Its own lock makes reads
// safe beside the ledger's writes. One fit serves every replica: a kvroute pool serves one model
// on one kind of engine, and separate per-replica fits measured as noise, not difference
// (docs/benchmarks.md: they raised no-reuse imbalance and cost the llm-d trace hit rate).
type Calibrations struct {
	mu    sync.Mutex
	prior score.Calibration
	fleet linFit
	// drainTok and drainSec are the decayed sums of ObserveDrain: prefill tokens that reached
	// their first token, and the seconds the replicas spent with prefill pending for them.
	drainTok, drainSec float64
}

// ObserveDrain records that a replica whose routed prefill was pending without a break for
// seconds finished tokens of it (one first token: the request's uncached tokens, the time since
// the replica's previous first token or since its prefill went from none to some). The ratio of
// the decayed sums is the drain rate (score.Calibration.DrainTokensPerS): measured from what
// the engines finished, so it holds the scheduler's decode interference and step overheads,
// which the TTFT fit's slope need not.
func (c *Calibrations) ObserveDrain(tokens int, seconds float64) {
	if tokens <= 0 || !(seconds >= 0) || math.IsInf(seconds, 0) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drainTok = c.drainTok*fleetDecay + float64(tokens)
	c.drainSec = c.drainSec*fleetDecay + seconds
}

// NewCalibrations returns an empty fit that starts from prior (score.DefaultCalibration when
// zero).
func NewCalibrations(prior score.Calibration) *Calibrations {
	prior = prior.Or(score.DefaultCalibration)
	c := &Calibrations{prior: prior}
	c.fleet.theta = thetaOf(prior)
	return c
}

// Observe records one first token: ttft seconds after routing, with ahead tokens of prefill
// queued before it, uncached of its own and decode tokens
// held at routing. A negative or non-finite time is ignored.
func (c *Calibrations) Observe(ahead, uncached, decode int, ttft float64) {
	if !(ttft >= 0) || math.IsInf(ttft, 0) {
		return
	}
	phi := features(float64(ahead+uncached), float64(decode))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fleet.observe(phi, ttft, fleetDecay, thetaOf(c.prior))
}

// Read is the calibration every replica uses: the fit, or the prior before any observation. It
// changes nothing.
func (c *Calibrations) Read() score.Calibration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.prior
	if c.fleet.w > 0 {
		out = c.fleet.calibration()
	}
	if c.drainSec > 0 {
		out.DrainTokensPerS = c.drainTok / c.drainSec
	}
	return out
}
