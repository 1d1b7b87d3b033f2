package vllmsim

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
)

// The fit behind the step models' coefficients, kept as test code so that anyone can rerun it
// (go test ./sim/vllmsim/ -run TestStepFit -v prints the coefficients) and so that a source file
// and the coefficients in stepmodel.go cannot drift apart unnoticed.

// stepSource is one calibration file of testdata/vllmsim and the coefficients fitted to it.
type stepSource struct {
	file   string
	coeffs stepCoeffs
}

var stepSources = []stepSource{
	{"../../testdata/vllmsim/step-time.json", splitwiseH100Step},
	{"../../testdata/vllmsim/step-time-vllm-0.20.1-b300.json", vllm0201B300Step},
}

// fitPoint is one measured step: its shape as the model reads it and its time.
type fitPoint struct {
	name  string
	shape stepShape
	ms    float64
}

// loadStepPoints reads a calibration file. Two layouts: the Splitwise one (phase, batch_size,
// prompt_size: b whole prompts of l tokens, or b decodes at mean context l + 64 over 128
// generated tokens) and the per-step one (prefill chunks [computed, new], decodes and their
// total context, as a forward-pass record gives them).
func loadStepPoints(path string) (map[string]string, []fitPoint, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var doc struct {
		Source map[string]string `json:"source"`
		Points []struct {
			Phase     string   `json:"phase"`
			Batch     int      `json:"batch_size"`
			Prompt    int      `json:"prompt_size"`
			Name      string   `json:"name"`
			Prefill   [][2]int `json:"prefill"`
			Decodes   int      `json:"decodes"`
			DecodeCtx int      `json:"decode_context"`
			Ms        float64  `json:"ms"`
		} `json:"points"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, nil, err
	}
	var pts []fitPoint
	for _, p := range doc.Points {
		var sh stepShape
		name := p.Name
		switch p.Phase {
		case "prefill": // b whole prompts in one step
			b, l := p.Batch, p.Prompt
			sh = stepShape{seqs: b, prefill: b * l, attn: float64(b) * float64(l) * float64(l)}
			name = fmt.Sprintf("prefill batch %d prompt %d", b, l)
		case "decode": // b sequences, mean context over 128 generated tokens: prompt + 64
			b, l := p.Batch, p.Prompt
			sh = stepShape{seqs: b, decodes: b, decodeCtx: b * (l + 64)}
			name = fmt.Sprintf("decode batch %d prompt %d", b, l)
		case "":
			sh = stepShape{seqs: p.Decodes, decodes: p.Decodes, decodeCtx: p.DecodeCtx}
			for _, c := range p.Prefill {
				k, n := float64(c[0]), float64(c[1])
				sh.seqs++
				sh.prefill += c[1]
				sh.attn += (k+n)*(k+n) - k*k
			}
		default:
			return nil, nil, fmt.Errorf("%s: phase %q", path, p.Phase)
		}
		if p.Ms <= 0 || sh.seqs == 0 {
			return nil, nil, fmt.Errorf("%s: point %q has no time or no sequences", path, name)
		}
		pts = append(pts, fitPoint{name, sh, p.Ms})
	}
	return doc.Source, pts, nil
}

// fitStep fits the model to the points by least squares on the relative error: for every
// integer knee in 0..4096 the six other coefficients are linear, solved by weighted least
// squares; a coefficient that comes out negative is dropped (set to 0) and the rest refitted.
// The knee with the smallest sum of squared relative errors wins (the lowest on a tie).
func fitStep(pts []fitPoint) (stepCoeffs, float64) {
	best, bestSS := stepCoeffs{}, math.Inf(1)
	for knee := 0; knee <= 4096; knee++ {
		c, ss := fitAtKnee(pts, float64(knee))
		if ss < bestSS-1e-12 {
			best, bestSS = c, ss
		}
	}
	return best, bestSS
}

// features are the model's terms for one shape at one knee, in the order Base, PerSeq,
// PerKCtx, Prefill, PerToken, PerMAttn.
func features(s stepShape, knee float64) [6]float64 {
	pre := 0.0
	if s.prefill > 0 {
		pre = 1
	}
	return [6]float64{1, float64(s.seqs), float64(s.decodeCtx) / 1000, pre,
		max(0, float64(s.prefill+s.decodes)-knee), s.attn / 1e6}
}

func fitAtKnee(pts []fitPoint, knee float64) (stepCoeffs, float64) {
	active := []int{0, 1, 2, 3, 4, 5}
	var x [6]float64
	for {
		sol, ok := weightedLS(pts, knee, active)
		if !ok {
			return stepCoeffs{}, math.Inf(1)
		}
		worst, at := 0.0, -1
		for i, v := range sol {
			if v < worst {
				worst, at = v, i
			}
		}
		if at < 0 {
			x = [6]float64{}
			for i, j := range active {
				x[j] = sol[i]
			}
			break
		}
		active = append(active[:at:at], active[at+1:]...)
	}
	c := stepCoeffs{Base: x[0], PerSeq: x[1], PerKCtx: x[2], Prefill: x[3], PerToken: x[4], Knee: knee, PerMAttn: x[5]}
	ss := 0.0
	for _, p := range pts {
		r := (c.ms(p.shape) - p.ms) / p.ms
		ss += r * r
	}
	return c, ss
}

// weightedLS solves min Σ ((f·x − y)/y)² over the active features by the normal equations
// (columns scaled to unit norm first) and Gaussian elimination with partial pivoting.
func weightedLS(pts []fitPoint, knee float64, active []int) ([]float64, bool) {
	n := len(active)
	rows := make([][]float64, len(pts))
	scale := make([]float64, n)
	for i, p := range pts {
		f := features(p.shape, knee)
		rows[i] = make([]float64, n)
		for j, a := range active {
			rows[i][j] = f[a] / p.ms
			scale[j] += rows[i][j] * rows[i][j]
		}
	}
	for j := range scale {
		if scale[j] == 0 {
			return nil, false
		}
		scale[j] = math.Sqrt(scale[j])
	}
	m := make([][]float64, n)
	for j := range m {
		m[j] = make([]float64, n+1)
	}
	for _, r := range rows {
		for j := 0; j < n; j++ {
			for k := 0; k < n; k++ {
				m[j][k] += r[j] / scale[j] * r[k] / scale[k]
			}
			m[j][n] += r[j] / scale[j] // target 1 after dividing by y
		}
	}
	for col := 0; col < n; col++ {
		piv := col
		for r := col + 1; r < n; r++ {
			if math.Abs(m[r][col]) > math.Abs(m[piv][col]) {
				piv = r
			}
		}
		if math.Abs(m[piv][col]) < 1e-12 {
			return nil, false
		}
		m[col], m[piv] = m[piv], m[col]
		for r := 0; r < n; r++ {
			if r != col {
				f := m[r][col] / m[col][col]
				for k := col; k <= n; k++ {
					m[r][k] -= f * m[col][k]
				}
			}
		}
	}
	x := make([]float64, n)
	for j := range x {
		x[j] = m[j][n] / m[j][j] / scale[j]
	}
	return x, true
}

// worstError is the largest relative error of c over the points, and where.
func worstError(c stepCoeffs, pts []fitPoint) (float64, string) {
	worst, at := 0.0, ""
	for _, p := range pts {
		if r := math.Abs(c.ms(p.shape)-p.ms) / p.ms; r > worst {
			worst, at = r, p.name
		}
	}
	return worst, at
}

func sortedNames(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
