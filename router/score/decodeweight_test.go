package score_test

import (
	"testing"

	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// kv's DecodeWeight is an engine quantity, not a tuning knob: the prefill tokens that one token
// of running-sequence context is worth in step time, over the few steps a request waits for its
// first token. The step models are fits to vLLM's own forward-pass records (sim/vllmsim,
// stepmodel.go); the weight must stay within 1 to 10 steps' worth of the default model's
// exchange rate.
func TestKVDecodeWeightIsTheEnginesExchangeRate(t *testing.T) {
	model := vllmsim.DefaultStepModel
	const decodes, ctx = 32, 4000
	short, ok1 := vllmsim.StepModelMs(model, 0, decodes, ctx)
	long, ok2 := vllmsim.StepModelMs(model, 0, decodes, 2*ctx)
	tokensPerS, ok3 := vllmsim.StepModelTokensPerS(model)
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("step model %q unknown", model)
	}
	msPerContextToken := (long - short) / (decodes * ctx)
	msPerPrefillToken := 1000 / tokensPerS
	perStep := msPerContextToken / msPerPrefillToken
	steps := score.DefaultKV.DecodeWeight / perStep
	t.Logf("%s: a token of decode context costs %.5f prefill tokens a step; DecodeWeight %v is %.1f steps' worth",
		model, perStep, score.DefaultKV.DecodeWeight, steps)
	if steps < 1 || steps > 10 {
		t.Errorf("DecodeWeight %v is %.1f steps of %s's decode cost (%.5f prefill tokens per context token a step); want 1 to 10",
			score.DefaultKV.DecodeWeight, steps, model, perStep)
	}
}
