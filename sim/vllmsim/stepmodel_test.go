package vllmsim

import (
	"encoding/json"
	"math"
	"os"
	"testing"
	"time"
)

// The calibrated step model reproduces every published point (testdata/vllmsim/step-time.json)
// within 15 %.
func TestStepModelMatchesSource(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/vllmsim/step-time.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Source map[string]string `json:"source"`
		Points []struct {
			Phase  string  `json:"phase"`
			Batch  int     `json:"batch_size"`
			Prompt int     `json:"prompt_size"`
			Ms     float64 `json:"ms"`
		} `json:"points"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Points) < 20 || doc.Source["file"] == "" {
		t.Fatalf("%d points, source %v", len(doc.Points), doc.Source)
	}
	worst := 0.0
	for _, p := range doc.Points {
		b, l := p.Batch, p.Prompt
		var sh stepShape
		switch p.Phase {
		case "prefill": // b whole prompts in one step
			sh = stepShape{seqs: b, prefill: b * l, attn: float64(b) * float64(l) * float64(l)}
		case "decode": // b sequences, mean context over 128 generated tokens: prompt + 64
			sh = stepShape{seqs: b, decodes: b, decodeCtx: b * (l + 64)}
		default:
			t.Fatalf("phase %q", p.Phase)
		}
		got := calibratedStep.ms(sh)
		rel := (got - p.Ms) / p.Ms
		worst = max(worst, math.Abs(rel))
		if math.Abs(rel) > 0.15 {
			t.Errorf("%s batch %d prompt %d: model %.1f ms, source %.1f ms (%+.1f %%)", p.Phase, b, l, got, p.Ms, 100*rel)
		}
	}
	t.Logf("%d points, largest error %.1f %%", len(doc.Points), 100*worst)
}

// shapeOf reads chunks after a cached prefix and decodes from the scheduler's state.
func TestStepShapeOfChunksAndDecodes(t *testing.T) {
	chunk := &engineRequest{numComputed: 1024 + 512} // 1024 cached or earlier, 512 new
	dec := &engineRequest{numComputed: 300}
	sh := shapeOf([]scheduled{{r: chunk, tokens: 512}, {r: dec, tokens: 1, decode: true}})
	want := stepShape{seqs: 2, decodes: 1, prefill: 512, decodeCtx: 299, attn: 1536*1536 - 1024*1024}
	if sh != want {
		t.Errorf("shape %v, want %v", sh, want)
	}
	if calibratedStep.ms(stepShape{}) != 0 {
		t.Error("an empty step costs time")
	}
	// More prefill, more decodes and more context each cost more.
	base := calibratedStep.ms(sh)
	for _, more := range []stepShape{
		{seqs: 2, decodes: 1, prefill: 1024, decodeCtx: 299, attn: sh.attn},
		{seqs: 3, decodes: 2, prefill: 512, decodeCtx: 299, attn: sh.attn},
		{seqs: 2, decodes: 1, prefill: 512, decodeCtx: 99999, attn: sh.attn},
	} {
		if calibratedStep.ms(more) <= base {
			t.Errorf("%v costs %.2f ms, not more than %v's %.2f", more, calibratedStep.ms(more), sh, base)
		}
	}
}

// --time-scale divides the modelled time, and the flat model stays available.
func TestStepTimeUnderTimeScale(t *testing.T) {
	step := []scheduled{{r: &engineRequest{numComputed: 4096}, tokens: 4096}}
	ms := calibratedStep.ms(shapeOf(step))
	for _, scale := range []float64{1, 10} {
		cfg := Config{TimeScale: scale}.Defaults()
		rk := &rank{cfg: &cfg}
		want := time.Duration(ms / scale * float64(time.Millisecond))
		if got := rk.stepTime(step); cfg.StepModel != "calibrated" || got < want-time.Microsecond || got > want+time.Microsecond {
			t.Errorf("scale %v (%s): step %v, want %v", scale, cfg.StepModel, got, want)
		}
	}
	cfg := Config{PrefillTokensPerS: 4096, TimeScale: 2}.Defaults()
	rk := &rank{cfg: &cfg}
	if got := rk.stepTime(step); cfg.StepModel != "flat" || got != 500*time.Millisecond {
		t.Errorf("flat model (%s): %v, want 1 s / scale 2", cfg.StepModel, got)
	}
}

// A sim with default settings runs the calibrated model: a 4096-token uncached prompt's first
// token comes after about one modelled prefill step (generous bounds: the machine may be busy).
func TestDefaultSimUsesCalibratedModel(t *testing.T) {
	cfg := Config{Host: "127.0.0.1", Model: "m", TimeScale: 4}
	s := startSim(t, cfg)
	if s.Config().StepModel != "calibrated" {
		t.Fatalf("default step model %q", s.Config().StepModel)
	}
	step := []scheduled{{r: &engineRequest{numComputed: 4096}, tokens: 4096}}
	want := time.Duration(calibratedStep.ms(shapeOf(step)) / 4 * float64(time.Millisecond))
	got := ttft(t, s, seqTokens(0, 4096))
	if got < want*9/10 || got > want*3 {
		t.Errorf("TTFT %v, want about %v (one modelled 4096-token prefill step at time scale 4)", got, want)
	}
}

// --step-token-scale K: a prompt of n tokens costs what one of n·K tokens costs at scale 1, with
// its cached prefix and its decodes' context scaled alike; the sequence count is not scaled.
func TestStepTokenScaleReadsShrunkPrompts(t *testing.T) {
	shrunk := []scheduled{
		{r: &engineRequest{numComputed: 96 + 384}, tokens: 384}, // 96 cached, 384 new
		{r: &engineRequest{numComputed: 501}, tokens: 1, decode: true},
	}
	full := []scheduled{
		{r: &engineRequest{numComputed: (96 + 384) * 16}, tokens: 384 * 16},
		{r: &engineRequest{numComputed: 500*16 + 1}, tokens: 1, decode: true},
	}
	cfg := Config{StepTokenScale: 16}.Defaults()
	got := (&rank{cfg: &cfg}).stepTime(shrunk)
	one := Config{}.Defaults()
	want := (&rank{cfg: &one}).stepTime(full)
	if d := got - want; d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("shrunk step at scale 16: %v, full-size step: %v", got, want)
	}
	if unscaled := (&rank{cfg: &one}).stepTime(shrunk); unscaled*3 > got {
		t.Errorf("scale 16 step %v is not much dearer than the unscaled %v", got, unscaled)
	}
	for _, bad := range []float64{0.5, -1, 1 << 17} {
		if err := (Config{StepTokenScale: bad}).Defaults().Validate(); err == nil {
			t.Errorf("step token scale %v accepted", bad)
		}
	}
}

// CalibratedTokensPerS is the rate a large prefill runs at: doubling a prompt above the knee
// adds its extra tokens at that rate (attention aside).
func TestCalibratedTokensPerS(t *testing.T) {
	a := calibratedStep.ms(stepShape{seqs: 1, prefill: 2000})
	b := calibratedStep.ms(stepShape{seqs: 1, prefill: 4000})
	if rate := 2000 / ((b - a) / 1000); math.Abs(rate-CalibratedTokensPerS()) > 1e-6*rate {
		t.Errorf("rate %.1f tokens/s, CalibratedTokensPerS %.1f", rate, CalibratedTokensPerS())
	}
}
