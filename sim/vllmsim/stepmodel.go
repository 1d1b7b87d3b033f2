package vllmsim

import (
	"fmt"
	"math"
)

// The step-time model: how long one scheduler step (one forward pass of vLLM v1's
// continuous batching, prefill chunks and decodes together) takes, as a function of the batch's
// shape. One formula, two calibrations (README.md, "Timing model", has both and plots):
//
//   - "vllm-0.20.1-b300", the default: per-forward-pass records of vLLM 0.20.1 serving Qwen3-32B
//     at TP1 on one NVIDIA B300 (Dynamo ForwardPassMetrics committed in ai-dynamo/aiconfigurator;
//     testdata/vllmsim/step-time-vllm-0.20.1-b300.json): the one source that names the vLLM
//     version, so it is what the simulator runs unless told otherwise;
//   - "splitwise-h100" (alias "calibrated", its name while it was the default): the Splitwise
//     paper's DGX-H100 Llama2-70B TP2 measurements (ISCA 2024; testdata/vllmsim/step-time.json),
//     which name no serving engine or version.
//
// TestStepModelMatchesSource reproduces every point of each file within 15 %;
// TestStepFitReproducesCoefficients refits the coefficients from the file (stepfit_test.go).
//
//	ms = Base + PerSeq·S + PerKCtx·C/1000
//	   + [P > 0]·Prefill + PerToken·max(0, P + D − Knee) + PerMAttn·A/10⁶
//
// S: sequences in the step; D: decoding sequences; C: their total context (tokens whose KV the
// decodes read); P: prefill tokens (uncached prompt tokens, chunked under the token budget);
// A: Σ over prefill chunks [s, e) of e² − s² (attention of each new token over its context).
// Base and PerSeq/PerKCtx are the memory-bound cost (weights and KV read each step); Knee is
// where the linear layers turn compute-bound; PerMAttn is prefill attention's quadratic cost.

// stepCoeffs are the model's coefficients, in milliseconds.
type stepCoeffs struct {
	Base, PerSeq, PerKCtx, Prefill, PerToken, Knee, PerMAttn float64
}

// splitwiseH100Step is the least-squares fit (relative error) to the 24 points of
// testdata/vllmsim/step-time.json; largest error 4.7 %.
var splitwiseH100Step = stepCoeffs{
	Base:     36.874,  // ms per step: a decode step of one short sequence
	PerSeq:   0.404,   // ms per sequence in the step
	PerKCtx:  0.0634,  // ms per 1000 tokens of decode context
	Prefill:  13.542,  // ms once when the step carries prefill
	PerToken: 0.14356, // ms per token above the knee (about 6,970 tokens/s)
	Knee:     304,     // tokens a step processes at no extra cost (memory-bound)
	PerMAttn: 2.4143,  // ms per 10⁶ (token × context) of prefill attention
}

// vllm0201B300Step is the fit (stepfit_test.go: relative least squares, knee by grid, negative
// terms dropped) to the 25 points of testdata/vllmsim/step-time-vllm-0.20.1-b300.json; largest
// error 7.1 %. The per-sequence term fits to zero (CUDA graphs) and the prefill constant to
// almost zero; the decode-context term is fitted from 1 to 32 decodes over 4k to 127k tokens.
var vllm0201B300Step = stepCoeffs{
	Base:     12.742,   // ms per step
	PerSeq:   0,        // ms per sequence in the step
	PerKCtx:  0.068448, // ms per 1000 tokens of decode context
	Prefill:  0.092463, // ms once when the step carries prefill
	PerToken: 0.044371, // ms per token above the knee (about 22,540 tokens/s)
	Knee:     69,       // tokens a step processes at no extra cost
	PerMAttn: 0.61133,  // ms per 10⁶ (token × context) of prefill attention
}

// Names of the calibrated step models.
const (
	StepModelVLLM0201B300  = "vllm-0.20.1-b300"
	StepModelSplitwiseH100 = "splitwise-h100"
	// DefaultStepModel is what an empty Config.StepModel (and vllm-sim without --step-model)
	// runs: the calibration that names its vLLM version.
	DefaultStepModel = StepModelVLLM0201B300
)

// stepModels are the calibrated models by their Config.StepModel name ("flat" is not one).
var stepModels = map[string]stepCoeffs{
	StepModelVLLM0201B300:  vllm0201B300Step,
	StepModelSplitwiseH100: splitwiseH100Step,
}

// stepModelAliases are older names still accepted: "calibrated" named the Splitwise fit while
// it was the only calibration and the default, and commands written then keep working.
var stepModelAliases = map[string]string{"calibrated": StepModelSplitwiseH100}

// CanonicalStepModel resolves an alias to the model's name; other names are returned as given.
func CanonicalStepModel(name string) string {
	if c, ok := stepModelAliases[name]; ok {
		return c
	}
	return name
}

func isStepModel(name string) bool { _, ok := stepModels[CanonicalStepModel(name)]; return ok }

// StepModels are the names of the calibrated step models, default first (aliases not listed).
func StepModels() []string { return []string{StepModelVLLM0201B300, StepModelSplitwiseH100} }

// stepShape is what the model reads from one step.
type stepShape struct {
	seqs, decodes int
	prefill       int     // P
	decodeCtx     int     // C
	attn          float64 // A
}

func (s stepShape) String() string {
	return fmt.Sprintf("S=%d D=%d P=%d C=%d A=%.0f", s.seqs, s.decodes, s.prefill, s.decodeCtx, s.attn)
}

// scaled reads every token of s as k model tokens (Config.StepTokenScale): prefill and decode
// context grow k-fold, attention (token × context) k²-fold; sequence counts stay.
func (s stepShape) scaled(k float64) stepShape {
	if k == 1 {
		return s
	}
	s.prefill = int(math.Round(float64(s.prefill) * k))
	s.decodeCtx = int(math.Round(float64(s.decodeCtx) * k))
	s.attn *= k * k
	return s
}

// ms is the modelled step time; an empty step costs nothing.
func (c stepCoeffs) ms(s stepShape) float64 {
	if s.seqs == 0 {
		return 0
	}
	t := c.Base + c.PerSeq*float64(s.seqs) + c.PerKCtx*float64(s.decodeCtx)/1000 + c.PerMAttn*s.attn/1e6
	if s.prefill > 0 {
		t += c.Prefill
	}
	return t + c.PerToken*max(0, float64(s.prefill+s.decodes)-c.Knee)
}

// shapeOf reads a scheduled step: schedule() has already advanced numComputed, so a chunk of n
// tokens covers [numComputed−n, numComputed) and a decode reads numComputed−1 earlier tokens.
func shapeOf(step []scheduled) stepShape {
	var sh stepShape
	for _, s := range step {
		sh.seqs++
		end := s.r.numComputed
		if s.decode {
			sh.decodes++
			sh.decodeCtx += end - 1
			continue
		}
		start := end - s.tokens
		sh.prefill += s.tokens
		sh.attn += float64(end)*float64(end) - float64(start)*float64(start)
	}
	return sh
}

// StepModelTokensPerS is a calibrated model's compute-bound rate: prompt tokens per second of a
// large prefill, above the knee and before attention (vllm-0.20.1-b300 about 22,537,
// splitwise-h100 about 6,966); false for a name that is not a calibrated model.
func StepModelTokensPerS(model string) (float64, bool) {
	c, ok := stepModels[CanonicalStepModel(model)]
	if !ok {
		return 0, false
	}
	return 1000 / c.PerToken, true
}

// StepModelMs is the named calibrated model's time in milliseconds of one step holding one
// fresh prompt chunk of prefill tokens (0 for none) and decodes sequences of decodeContext
// tokens each, before any time scale (hack/stepplot draws them); false for a name that is not
// a calibrated model.
func StepModelMs(model string, prefill, decodes, decodeContext int) (float64, bool) {
	c, ok := stepModels[CanonicalStepModel(model)]
	sh := stepShape{seqs: decodes, decodes: decodes, prefill: prefill, decodeCtx: decodes * decodeContext,
		attn: float64(prefill) * float64(prefill)}
	if prefill > 0 {
		sh.seqs++
	}
	return c.ms(sh), ok
}
