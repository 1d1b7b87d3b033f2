package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim/replay"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

func TestReplayFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "exactly one of --trace and --regime"},
		{[]string{"--trace", "x", "--regime", "no-reuse"}, "exactly one"},
		{[]string{"--regime", "no-reuse", "--speed", "0"}, "--speed"},
		{[]string{"--regime", "no-reuse", "--first-seed", "0"}, "--first-seed"},
		{[]string{"--regime", "no-reuse", "--routers", "0"}, "--routers"},
		{[]string{"--regime", "no-reuse", "--sim-step-model", "steep"}, "--sim-step-model"},
		{[]string{"--regime", "no-reuse", "--policies", "nope"}, "nope"},
		{[]string{"--regime", "no-reuse", "--policies", "kv,nope:no-events"}, "nope"},
		{[]string{"--regime", "no-reuse", "--bin-dir", "/nonexistent"}, "no vllm-sim binary"},
		{[]string{"--regime", "bogus", "--vllm-sim", "x", "--kvrouter", "y", "--policies", "kv"}, "unknown regime"},
		{[]string{"--trace", "/nonexistent.jsonl", "--vllm-sim", "x", "--kvrouter", "y", "--policies", "kv"}, "nonexistent"},
		{[]string{"--regime", "no-reuse", "--ratio-halfwidth", "0.03", "--seeds", "2"}, "--ratio-halfwidth"},
		{[]string{"--regime", "no-reuse", "--ratio-halfwidth", "-1"}, "--ratio-halfwidth"},
		{[]string{"--regime", "no-reuse", "--ratio-halfwidth", "0.03", "--seeds", "5", "--capacity"}, "--ratio-halfwidth"},
		{[]string{"--regime", "no-reuse", "--ratio-halfwidth", "0.03", "--seeds", "5", "--policies", "load,round-robin"}, "--under-test kv"},
		{[]string{"--regime", "no-reuse", "--ratio-halfwidth", "0.03", "--seeds", "5", "--policies", "kv"}, "another policy"},
		{[]string{"--regime", "no-reuse", "--router-url", "llmd"}, "NAME=ADDRESS"},
		{[]string{"--regime", "no-reuse", "--router-url", "llmd=localhost:80"}, "http(s)://host:port"},
		{[]string{"--regime", "no-reuse", "--ext-proc", "epp=http://x:9002"}, "HOST:PORT"},
		{[]string{"--regime", "no-reuse", "--ext-proc", "epp=127.0.0.1:9002;metrics=x"}, "unknown option"},
		{[]string{"--regime", "no-reuse", "--ext-proc", "epp=127.0.0.1:9002", "--capacity"}, "not for --capacity"},
		{[]string{"--regime", "no-reuse", "--engine-ports", "18000"}, "give one of those"},
		{[]string{"--regime", "no-reuse", "--engines-out", "f.txt"}, "give one of those"},
	} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"replay"}, tc.args...), &out, &errb); code == 0 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("replay %v: exit %d, stderr %q; want an error with %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

func fakeOutput() *replayOutput {
	runs := []*replay.RunResult{
		{Policy: "kv", Seed: 1, Wall: 2, Engines: []string{"engine-0", "engine-1"}, Outcomes: []replay.Outcome{
			{TTFT: 0.05, E2E: 0.3, PromptTokens: 100, CachedTokens: 90, Engine: "engine-0", SentAt: 0},
			{TTFT: 0.07, E2E: 0.4, PromptTokens: 100, CachedTokens: 90, Engine: "engine-1", SentAt: 1500 * time.Millisecond}}},
		{Policy: "round-robin", Seed: 1, Wall: 2, Engines: []string{"engine-0", "engine-1"}, Outcomes: []replay.Outcome{
			{TTFT: 0.2, E2E: 0.5, PromptTokens: 100, CachedTokens: 10, Engine: "engine-0", Held: 0.3},
			{Err: "HTTP 502: engine gone"}}},
	}
	return &replayOutput{Workload: "w<1>", Replicas: 2, Seeds: 1, Requests: 2, Results: replay.Summarize(runs), Runs: runs}
}

func TestReplayTableAndReport(t *testing.T) {
	out := fakeOutput()
	var b bytes.Buffer
	if err := writeReplayTable(&b, out); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	if strings.Contains(s, "kv: 1 of") || strings.Contains(s, "kv: 0 of") {
		t.Fatalf("a policy no request of which was held got the closed-loop line:\n%s", s)
	}
	for _, want := range []string{"ttft_p90_s", "kv ", "0.90", "round-robin", "HTTP 502: engine gone",
		"round-robin: 1 of 2 requests waited for --concurrency: closed-loop"} {
		if !strings.Contains(s, want) {
			t.Fatalf("table lacks %q:\n%s", want, s)
		}
	}
	dir := t.TempDir()
	if err := writeReplayReport(dir, out, "kvbench replay --regime x"); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	p := string(page)
	for _, want := range []string{"<svg", "TTFT CDF", "w&lt;1&gt;", "Requests per engine over time: kv", "engine-1"} {
		if !strings.Contains(p, want) {
			t.Fatalf("report lacks %q", want)
		}
	}
	if strings.Contains(p, "<script") || strings.Contains(p, "src=") || strings.Contains(p, "href=") {
		t.Fatal("report is not self-contained")
	}
	j, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(j, &back); err != nil || back["workload"] != "w<1>" {
		t.Fatalf("JSON round trip: %v %v", err, back["workload"])
	}
}

// With several routers the table says so and sums what their load sync cost.
func TestReplayTableRouters(t *testing.T) {
	out := fakeOutput()
	out.Routers = 2
	out.Runs[0].RouterSync = []replay.RouterSync{
		{ID: "router-0", Peers: 1, SentBytes: 300, MeanLagMs: 1},
		{ID: "router-1", Peers: 1, SentBytes: 500, MeanLagMs: 3, LostBatches: 1}}
	var b bytes.Buffer
	if err := writeReplayTable(&b, out); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	for _, want := range []string{"2 replicas, 2 routers", "kv load sync: 400 bytes published per request (all routers), mean lag 2.0 ms, fewest peers seen 1, 1 lost batches"} {
		if !strings.Contains(s, want) {
			t.Errorf("table lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "round-robin load sync") {
		t.Errorf("a policy without sync figures got a line:\n%s", s)
	}
}

// A policy run with and without events: the table names the mode that ran, prints each
// policy's accuracy per scoring mode and the per-seed with/without ratios.
func TestReplayTableEvents(t *testing.T) {
	run := func(label string, seed, cached int, ttft float64, acc map[string]replay.ModeTokens) *replay.RunResult {
		r := &replay.RunResult{Policy: label, Seed: seed, Wall: 1, Engines: []string{"engine-0"}, Accuracy: acc}
		for i := 0; i < 4; i++ {
			r.Outcomes = append(r.Outcomes, replay.Outcome{TTFT: ttft, E2E: ttft, PromptTokens: 100, CachedTokens: cached, Engine: "engine-0"})
		}
		return r
	}
	exact := map[string]replay.ModeTokens{"exact": {Prompt: 400, Predicted: 300, Actual: 300}}
	approx := map[string]replay.ModeTokens{"approximate": {Prompt: 400, Predicted: 240, Actual: 200}}
	var runs []*replay.RunResult
	for seed := 1; seed <= 3; seed++ {
		runs = append(runs, run("kv", seed, 75, 0.2, exact), run("kv:no-events", seed, 50, 0.4, approx))
	}
	out := &replayOutput{Workload: "eviction", Replicas: 1, Seeds: 3, Requests: 4, Results: replay.Summarize(runs),
		EventsRatios: replay.EventsRatios(runs), Runs: runs}
	var b bytes.Buffer
	if err := writeReplayTable(&b, out); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	for _, want := range []string{
		"kv:no-events: routers ran with --no-events: every replica scored from the approximate index",
		"kv accuracy by scoring mode: exact 100% of prompt tokens, predicted 0.750 / actual 0.750 cached (x1.00)",
		"kv:no-events accuracy by scoring mode: approximate 100% of prompt tokens, predicted 0.600 / actual 0.500 cached (x1.20)",
		"kv / kv:no-events per seed (3 seeds): cached 1.500 [1.500,1.500], ttft p50 0.500 [0.500,0.500]",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("table lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "  kv: routers ran with --no-events") {
		t.Errorf("the policy with events is said to run without:\n%s", s)
	}
}

// The engines' step flags: flat passes the rates; a calibrated model reads each token as 512/tpb
// and scales time so its compute-bound prefill rate equals the flat rate (same regime load).
// kvbench's copy of each model's rate is vllm-sim's, aliases included.
func TestSimStepArgs(t *testing.T) {
	if defaultSimStepModel != vllmsim.DefaultStepModel {
		t.Errorf("--sim-step-model defaults to %s, vllm-sim to %s", defaultSimStepModel, vllmsim.DefaultStepModel)
	}
	names := append([]string{"calibrated"}, vllmsim.StepModels()...)
	if len(stepModelTokensPerS) != len(names) {
		t.Errorf("kvbench knows %d step models, vllm-sim %v", len(stepModelTokensPerS), names)
	}
	for _, name := range names {
		want, _ := vllmsim.StepModelTokensPerS(name)
		if d := stepModelTokensPerS[name] - want; want == 0 || d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: kvbench's rate %v, vllm-sim's %v", name, stepModelTokensPerS[name], want)
		}
	}
	flat, err := simStepArgs("flat", 1250, 20, 1, 32)
	if err != nil || strings.Join(flat, " ") != "--step-model flat --prefill-tokens-per-s 1250 --decode-ms-per-token 20 --time-scale 1" {
		t.Errorf("flat: %q (%v)", flat, err)
	}
	for _, name := range names {
		cal, err := simStepArgs(name, 1250, 20, 2, 32)
		if err != nil || len(cal) != 6 || cal[1] != name || cal[3] != "16" {
			t.Fatalf("%s: %q (%v)", name, cal, err)
		}
		scale, _ := strconv.ParseFloat(cal[5], 64)
		// 1250 shrunk tokens/s = 20,000 model tokens/s; the model runs at its own rate; x2 on top.
		rate, _ := vllmsim.StepModelTokensPerS(name)
		if want := 2 * 20000 / rate; scale < want*0.999 || scale > want*1.001 {
			t.Errorf("%s time scale %v, want %v", name, scale, want)
		}
	}
	if _, err := simStepArgs("steep", 1250, 20, 1, 32); err == nil {
		t.Error("unknown step model accepted")
	}
}

// seedRuns is one seed of kv against round-robin and load, every request of a run at the TTFT
// given.
func seedRuns(seed int, kv, rr, load float64) []*replay.RunResult {
	var runs []*replay.RunResult
	for _, p := range []struct {
		name string
		ttft float64
	}{{"kv", kv}, {"round-robin", rr}, {"load", load}} {
		r := &replay.RunResult{Policy: p.name, Seed: seed, Wall: 1, Engines: []string{"engine-0"}}
		for range 5 {
			r.Outcomes = append(r.Outcomes, replay.Outcome{TTFT: p.ttft, E2E: p.ttft, PromptTokens: 100, Engine: "engine-0"})
		}
		runs = append(runs, r)
	}
	return runs
}

// The table ends with kv's per-seed ratio to the best other policy of each seed, and --json
// carries it.
func TestReplayTableBestOther(t *testing.T) {
	runs := append(append(seedRuns(1, 1.0, 0.8, 1.0), seedRuns(2, 1.0, 1.0, 0.5)...), seedRuns(3, 1.1, 1.0, 1.0)...)
	out := &replayOutput{Workload: "w", Replicas: 1, Seeds: 3, Requests: 5, Results: replay.Summarize(runs),
		BestOther: replay.PolicyRatios(runs, "kv"), Runs: runs}
	var b bytes.Buffer
	if err := writeReplayTable(&b, out); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	for _, want := range []string{
		"kv / best other (lowest), ttft_p90_s: 1.450 [0.252,2.648] over 3 seeds, relative half-width 82.6%; per seed [1.250 2.000 1.100], best other per seed [round-robin load load]",
		"kv / best other (lowest), ttft_p99_s: 1.450",
		"kv / best other (highest), cached_ratio: no seed has a ratio",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("table lacks %q:\n%s", want, s)
		}
	}
	j, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		BestOther []struct {
			Metric    string     `json:"metric"`
			PerSeed   []*float64 `json:"ratio_per_seed"`
			BestOther []string   `json:"best_other_per_seed"`
			Ratio     struct{ Mean, Hi float64 }
		} `json:"best_other_ratios"`
	}
	if err := json.Unmarshal(j, &back); err != nil || len(back.BestOther) != 3 || back.BestOther[0].Metric != "ttft_p90_s" ||
		*back.BestOther[0].PerSeed[1] != 2 || back.BestOther[1].BestOther[0] != "round-robin" || back.BestOther[0].Ratio.Mean != 1.45 ||
		back.BestOther[2].PerSeed[0] != nil {
		t.Fatalf("JSON: %v %s", err, j)
	}
}

// Adaptive seeds: one seed at a time from --first-seed, stopping once the TTFT p90 and p99
// ratios are both tight, or at the cap; off, one call runs every seed.
func TestReplayRunsAdaptiveSeeds(t *testing.T) {
	// kv / best other per seed: 1.17, 1.23, then 1.20: relative half-widths 6.2% at 3 seeds,
	// 3.2% at 4, 2.2% at 5, so it stops after the fifth seed.
	kv := map[int]float64{5: 1.17, 6: 1.23, 7: 1.20, 8: 1.20, 9: 1.20, 10: 1.20, 11: 1.20, 12: 1.20, 13: 1.20, 14: 1.20}
	var called [][2]int
	play := func(_ context.Context, o replay.Options, _ replay.Workload) ([]*replay.RunResult, error) {
		called = append(called, [2]int{o.FirstSeed, o.Seeds})
		var runs []*replay.RunResult
		for s := o.FirstSeed; s < o.FirstSeed+o.Seeds; s++ {
			runs = append(runs, seedRuns(s, kv[s], 1.0, 2.0)...)
		}
		return runs, nil
	}
	o := replay.Options{FirstSeed: 5, Seeds: 20}
	runs, err := replayRuns(context.Background(), o, replay.Workload{}, "kv", 0.03, play, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if n := seedsRun(runs); n != 5 || len(called) != 5 || called[0] != [2]int{5, 1} || called[4] != [2]int{9, 1} {
		t.Errorf("ran %d seeds, calls %v; want seeds 5..9 one at a time", n, called)
	}
	rs := replay.PolicyRatios(runs, "kv")
	if *rs[0].HalfWidth >= 0.03 || *rs[1].HalfWidth >= 0.03 {
		t.Errorf("stopped at half-widths %v %v", *rs[0].HalfWidth, *rs[1].HalfWidth)
	}
	// Never tight: stops at 10 seeds whatever --seeds says.
	for s := 5; s <= 14; s++ {
		kv[s] = []float64{1.3, 1.0}[s%2]
	}
	called = nil
	if runs, _ = replayRuns(context.Background(), o, replay.Workload{}, "kv", 0.03, play, io.Discard); seedsRun(runs) != 10 {
		t.Errorf("a wide ratio ran %d seeds, want the cap of 10", seedsRun(runs))
	}
	// Off: one call with every seed.
	called = nil
	o.Seeds = 3
	if runs, _ = replayRuns(context.Background(), o, replay.Workload{}, "kv", 0, play, io.Discard); len(called) != 1 || seedsRun(runs) != 3 {
		t.Errorf("without a target: calls %v, %d seeds", called, seedsRun(runs))
	}
}

// --outcomes writes each request of each run as one JSON line carrying its run's policy and
// seed, so a percentile in the table can be traced to the requests behind it.
func TestReplayOutcomesFile(t *testing.T) {
	out := fakeOutput()
	path := filepath.Join(t.TempDir(), "outcomes.jsonl")
	if err := writeOutcomes(path, out.Runs); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	want := 0
	for _, r := range out.Runs {
		want += len(r.Outcomes)
	}
	if want == 0 || len(lines) != want {
		t.Fatalf("%d lines, want one per request (%d)", len(lines), want)
	}
	k := 0
	for _, r := range out.Runs {
		for _, o := range r.Outcomes {
			var got outcomeLine
			if err := json.Unmarshal([]byte(lines[k]), &got); err != nil {
				t.Fatalf("line %d: %v", k, err)
			}
			if got.Policy != r.Policy || got.Seed != r.Seed || got.Index != o.Index || got.TTFT != o.TTFT || got.Err != o.Err || got.Engine != o.Engine {
				t.Fatalf("line %d: %+v, want %s seed %d %+v", k, got, r.Policy, r.Seed, o)
			}
			k++
		}
	}
}

// A capacity is the engines' limit: unless told otherwise, the replay's concurrency cap sits well
// above the engines' running slots, a regime's probe is a sustained load (duration x rate, no
// count cap), and a trace's probe replays its whole slice whatever the speed.
func TestCapacityDefaultsLeaveTheEnginesTheBottleneck(t *testing.T) {
	d := capacityDefaults(map[string]bool{}, false, 8, 32, 1)
	if d.Concurrency != 1024 || !d.SetMaxRequests || d.MaxRequests != 0 || d.SetDuration {
		t.Fatalf("regime defaults = %+v; want concurrency 1024 (4 x 8 x 32), max-requests 0, duration kept", d)
	}
	if d := capacityDefaults(map[string]bool{}, true, 4, 32, 2); d.Concurrency != 1024 || d.SetMaxRequests || !d.SetDuration || d.Duration != 0 {
		t.Fatalf("trace defaults = %+v; want concurrency 1024 (4 x 4 x 32 x 2 ranks), max-requests kept, duration 0", d)
	}
	given := map[string]bool{"concurrency": true, "max-requests": true, "duration": true}
	if d := capacityDefaults(given, false, 8, 32, 1); d != (capacityFlagDefaults{}) {
		t.Fatalf("flags given on the command line were overridden: %+v", d)
	}
	if d := capacityDefaults(given, true, 8, 32, 1); d != (capacityFlagDefaults{}) {
		t.Fatalf("flags given on the command line were overridden: %+v", d)
	}
	if d := capacityDefaults(map[string]bool{}, false, 1, 4, 1); d.Concurrency != 64 {
		t.Fatalf("a small fleet's cap = %d; want the replay's 64 at least", d.Concurrency)
	}
}

func TestCapacityRequestsSustainTheProbedRate(t *testing.T) {
	for _, c := range []struct {
		rate     float64
		duration time.Duration
		maxReq   int
		want     int
	}{
		{400, 8 * time.Second, 0, 3200}, // 8 s at 400/s, not a 200-request burst
		{25, 8 * time.Second, 0, 200},
		{400, 8 * time.Second, 500, 500}, // an explicit cap still holds
		{0.01, 8 * time.Second, 0, 1},
		{25, 0, 0, 160},
		{25, 0, 90, 90},
	} {
		if got := capacityRequests(c.rate, c.duration, c.maxReq); got != c.want {
			t.Errorf("capacityRequests(%g, %v, %d) = %d; want %d", c.rate, c.duration, c.maxReq, got, c.want)
		}
	}
}

func TestParseExternal(t *testing.T) {
	x, err := parseExternal("kvr=http://127.0.0.1:8080;admin=http://127.0.0.1:8081", false)
	if err != nil || x.Name != "kvr" || x.URL != "http://127.0.0.1:8080" || x.Admin != "http://127.0.0.1:8081" || x.ExtProc != "" {
		t.Fatalf("router-url: %+v, %v", x, err)
	}
	x, err = parseExternal("llm-d=10.0.0.7:9002", true)
	if err != nil || x.Name != "llm-d" || x.ExtProc != "10.0.0.7:9002" || x.URL != "" {
		t.Fatalf("ext-proc: %+v, %v", x, err)
	}
}

// An external router's rows read like a policy's, and the table says what ran behind the name
// and why its spread may be unknown.
func TestReplayTableExternal(t *testing.T) {
	runs := []*replay.RunResult{
		{Policy: "kv", Seed: 1, Wall: 2, Engines: []string{"engine-0", "engine-1"}, Outcomes: []replay.Outcome{
			{TTFT: 0.05, E2E: 0.3, PromptTokens: 100, CachedTokens: 90, Engine: "engine-0"}}},
		{Policy: "llmd", Seed: 1, Wall: 2, Engines: []string{"engine-0", "engine-1"}, External: "router-url http://gw:80", Outcomes: []replay.Outcome{
			{TTFT: 0.06, E2E: 0.3, PromptTokens: 100, CachedTokens: 80}}},
	}
	var b bytes.Buffer
	if err := writeReplayTable(&b, &replayOutput{Workload: "w", Replicas: 2, Seeds: 1, Requests: 1, Results: replay.Summarize(runs), Runs: runs}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"llmd ", "0.80", "llmd: external router-url http://gw:80", "which engine served"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
