package load

import (
	"math"
	"sync"

	"github.com/kvroute/kvroute/router/score"
)

// fleetDecay is the per-observation forgetting factor of the drain fit: it remembers about its
// last 200 first tokens, so it follows the engines' batch shape as the load drifts.
const fleetDecay = 0.995

// Calibrations is the fleet's prefill drain, fitted from every replica's first tokens. The
// ledger owns the one instance; decisions read it into Candidate.Calib. Its own lock makes reads
// safe beside the ledger's writes. One fit serves every replica: a kvroute pool serves one model
// on one kind of engine, and separate per-replica fits measured as noise, not difference
// (docs/benchmarks.md: they raised no-reuse imbalance and cost the llm-d trace hit rate).
type Calibrations struct {
	mu sync.Mutex
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
// and read at one rate a replica computing a long prompt looked drained before its first token
// (measurements, and what the fit without γ cost: docs/benchmarks.md, "Long prompts and the
// drain credit").
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
// overheads.
func (c *Calibrations) ObserveDrain(tokens int, attn int64, seconds float64) {
	if tokens <= 0 || attn < 0 || !(seconds >= 0) || math.IsInf(seconds, 0) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drain.observe(float64(tokens), float64(attn), seconds)
}

// NewCalibrations returns an empty fit (drain rate and attention weight 0: the ledger's counters
// are read as they are until first tokens come).
func NewCalibrations() *Calibrations { return &Calibrations{} }

// Read is the drain every replica uses. It changes nothing.
func (c *Calibrations) Read() score.Calibration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return score.Calibration{DrainTokensPerS: c.drain.rate, DrainAttentionWeight: c.drain.weight}
}
