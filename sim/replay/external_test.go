package replay

import (
	"context"
	"math"
	"path/filepath"
	"testing"
	"time"
)

// TestExternalRoutersMatchTheBuiltInPolicy runs kvrouter as an "external" router twice, once
// behind its OpenAI listener (External.URL) and once as an endpoint picker with the replay
// playing the gateway (External.ExtProc), on engines the replay keeps (StartEngines), beside
// the replay's own kv policy on the same workload: all three route with kvrouter's kv policy,
// so their cached shares agree within 2 points (issue 47's done-when: the picker's cached share
// equal to the proxy's within 2 %), and the picker's predicted cached tokens equal the ones the
// engines reported. 2 engines, the siblings regime, 1 seed.
func TestExternalRoutersMatchTheBuiltInPolicy(t *testing.T) {
	dir := buildBinaries(t)
	w, err := Regime("siblings", RegimeOptions{Requests: 24, Rate: 20, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{SimBin: filepath.Join(dir, "vllm-sim"), RouterBin: filepath.Join(dir, "kvrouter"), Replicas: 2,
		Policies: []string{"kv"}, Seeds: 1, Concurrency: 16, Tokens: Tokenizer{PerBlock: 16}, BlockSize: 16,
		OutputScale: 1, MaxOutputTokens: 4, Model: "vllm-sim", LogDir: t.TempDir(), Drain: 15 * time.Second,
		SimArgs: []string{"--decode-ms-per-token", "2", "--num-gpu-blocks", "512", "--block-size", "16"}}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	eng, err := StartEngines(ctx, o, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Stop()
	// The external routers: kvrouter processes configured with the kept engines, as a user
	// configures theirs from the engines file the replay prints.
	var ext []External
	for _, name := range []string{"kvrouter-proxy", "kvrouter-picker"} {
		args := []string{"--policy", "kv", "--block-size", "16", "--model", "vllm-sim", "--ext-proc-listen", "127.0.0.1:0"}
		for _, l := range eng.Lines() {
			args = append(args, "--engine", l)
		}
		r, err := startRouter(ctx, o.RouterBin, nil, name, args, filepath.Join(o.LogDir, name+".log"), 15*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer r.stop()
		if r.extProc == "" {
			t.Fatalf("%s logged no ext_proc address", name)
		}
		x := External{Name: name, Admin: "http://" + r.admin}
		if name == "kvrouter-proxy" {
			x.URL = "http://" + r.api
		} else {
			x.ExtProc = r.extProc
		}
		ext = append(ext, x)
	}
	o.External, o.Engines = ext, eng
	runs, err := Replay(ctx, o, w)
	if err != nil {
		t.Fatal(err)
	}
	sum := Summarize(runs)
	if len(sum) != 3 {
		t.Fatalf("%d summaries, want kv and the two external routers", len(sum))
	}
	for _, s := range sum {
		t.Logf("%s: cached %.3f, ttft p90 %.3fs, max share %.2f, accuracy %+v", s.Policy, s.CachedRatio.Mean, s.TTFTP90.Mean,
			s.MaxEngineShare.Mean, s.Accuracy)
		if s.Errors != 0 {
			t.Fatalf("%s: %d errors: %v", s.Policy, s.Errors, s.FirstErrors)
		}
		if math.IsNaN(s.MaxEngineShare.Mean) {
			t.Errorf("%s: the engine of some request is unknown", s.Policy)
		}
		if d := s.CachedRatio.Mean - sum[0].CachedRatio.Mean; math.Abs(d) > 0.02 {
			t.Errorf("%s cached %.3f, the built-in kv %.3f: more than 2 points apart", s.Policy, s.CachedRatio.Mean, sum[0].CachedRatio.Mean)
		}
	}
	for _, s := range sum[1:] {
		var pred, act float64
		for _, m := range s.Accuracy {
			pred, act = pred+m.Predicted, act+m.Actual
		}
		if act == 0 || pred != act {
			t.Errorf("%s: predicted %.0f cached tokens, the engines reported %.0f", s.Policy, pred, act)
		}
	}
}
