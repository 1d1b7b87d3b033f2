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
// on one kind of engine, so replicas differ in their load, not their speed, and a fit per
// replica, from a few first tokens each, would read noise as difference.
type Calibrations struct {
	mu    sync.Mutex
	prior score.Calibration
	fleet linFit
	// drain is the decayed sums behind the drain rate and its attention weight (drainFit).
	drain drainFit
}

// drainFit is the fit behind the drain credit: each first token is one observation that a
// replica whose routed prefill was pending without a break for t seconds finished a request of
// u uncached tokens whose prefill attends over a token pairs (score.AttentionPairs).
//
// The fit separates what attention adds to the time,
//
//	t = γ + α·u + β·a
//
// by least squares weighted 1/u (each token, not each request, one unit of evidence, so a run
// of short requests does not outvote the long ones whose time the attention term explains).
// The drain rate is then Σu / (Σt − β·Σa), exponentially decayed: the engines' tokens per
// second of pending prefill, attention aside, with γ folded in as the rate always held it; the
// attention weight is β at that rate. With β = 0 that is Σu / Σt, the rate before attention was
// a term. γ is the time a request costs whatever its size (the steps it takes at the least):
// without it a cache hit's few uncached tokens over a long cached prefix, slower per token than
// a miss only by that overhead, read as attention. Why attention at all: vLLM's prefill
// attention is quadratic in the context (sim/vllmsim/stepmodel.go, PerMAttn: fitted to vLLM
// 0.20.1's forward-pass records), so a long prompt drains slower per token than a short one,
// and read at one rate a replica computing a long prompt would look drained before its first
// token.
type drainFit struct {
	// Decayed sums (fleetDecay): su = Σu, st = Σt (the rate), and the weighted normal
	// equations' entries: n = Σ1, iu = Σ1/u, au = Σa/u, sa = Σa, aa = Σa²/u; tu = Σt/u,
	// at = Σa·t/u.
	su, st, n, iu, au, sa, aa, tu, at float64
	// rate and weight are solve's answer for the sums above, re-solved at each observation:
	// every decision reads them, once per candidate, and they change only here.
	rate, weight float64
}

// minDrainConditioning is the least determinant of the normal equations' matrix scaled to a
// unit diagonal (1 for independent terms, 0 for dependent ones) at which β is taken: where the
// requests seen come in two shapes (a hot prefix's hits and misses, the llm-d trace's groups),
// three terms fit two points and β is whatever the noise says, so it stays 0.
const minDrainConditioning = 0.01

func (d *drainFit) observe(u, a, t float64) {
	f := fleetDecay
	d.su, d.st, d.n = d.su*f+u, d.st*f+t, d.n*f+1
	d.iu, d.au, d.sa, d.aa = d.iu*f+1/u, d.au*f+a/u, d.sa*f+a, d.aa*f+a*a/u
	d.tu, d.at = d.tu*f+t/u, d.at*f+a*t/u
	d.rate, d.weight = d.solve()
}

// solve returns the drain rate Σu / (Σt − β·Σa) (tokens per second) and the attention weight β x
// that rate (tokens of prefill a token pair costs, score.Calibration.DrainAttentionWeight); 0, 0
// before any observation. β is 0 when the system is ill-conditioned or its solution is not an
// engine's (γ < 0, α <= 0, β < 0, or attention taking all the time).
func (d *drainFit) solve() (rate, attnWeight float64) {
	if d.st <= 0 || d.su <= 0 {
		return 0, 0
	}
	rate = d.su / d.st
	m := [3][3]float64{{d.iu, d.n, d.au}, {d.n, d.su, d.sa}, {d.au, d.sa, d.aa}}
	rhs := [3]float64{d.tu, d.st, d.at}
	det := det3(m)
	if !(det > minDrainConditioning*m[0][0]*m[1][1]*m[2][2]) {
		return rate, 0
	}
	var sol [3]float64
	for k := range 3 { // Cramer's rule: three unknowns, solved once per observation
		mk := m
		for r := range 3 {
			mk[r][k] = rhs[r]
		}
		sol[k] = det3(mk) / det
	}
	gamma, alpha, beta := sol[0], sol[1], sol[2]
	rest := d.st - beta*d.sa
	if !(gamma >= 0 && alpha > 0 && beta >= 0 && rest > 0) || math.IsInf(beta, 0) {
		return rate, 0
	}
	rate = d.su / rest
	return rate, beta * rate
}

func det3(m [3][3]float64) float64 {
	return m[0][0]*(m[1][1]*m[2][2]-m[1][2]*m[2][1]) - m[0][1]*(m[1][0]*m[2][2]-m[1][2]*m[2][0]) +
		m[0][2]*(m[1][0]*m[2][1]-m[1][1]*m[2][0])
}

// ObserveDrain records that a replica whose routed prefill was pending without a break for
// seconds finished tokens of it, whose prefill attends over attn token pairs (one first token:
// the request's uncached tokens and score.AttentionPairs, the time since the replica's previous
// first token or since its prefill went from none to some). The drain rate and its attention
// weight (score.Calibration.DrainTokensPerS, DrainAttentionWeight; drainFit) are measured from
// what the engines finished, so they hold the scheduler's decode interference and step
// overheads, which the TTFT fit's slope need not.
func (c *Calibrations) ObserveDrain(tokens int, attn int64, seconds float64) {
	if tokens <= 0 || attn < 0 || !(seconds >= 0) || math.IsInf(seconds, 0) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drain.observe(float64(tokens), float64(attn), seconds)
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
	out.DrainTokensPerS, out.DrainAttentionWeight = c.drain.rate, c.drain.weight
	return out
}
