package replay

import (
	"bufio"
	"context"
	"math"
	"strings"
	"testing"
)

func TestSplitPolicy(t *testing.T) {
	for _, tc := range []struct {
		label, policy string
		events        bool
	}{{"kv", "kv", true}, {"kv:no-events", "kv", false}, {"round-robin:no-events", "round-robin", false}, {"kv:no-eventsx", "kv:no-eventsx", true}} {
		p, ev := SplitPolicy(tc.label)
		if p != tc.policy || ev != tc.events {
			t.Errorf("SplitPolicy(%q) = %q, %v; want %q, %v", tc.label, p, ev, tc.policy, tc.events)
		}
	}
	if d := runDirName("kv:no-events", 3); strings.Contains(d, ":") || d != "kv_no-events-seed3" {
		t.Errorf("run dir %q", d)
	}
}

// A policy without events needs the block size (without it the router routes unkeyed, which
// is not approximate scoring); --no-events given as a router flag hides the mode from the
// results, so it is refused.
func TestNoEventsOptionErrors(t *testing.T) {
	w, err := Regime("no-reuse", RegimeOptions{Requests: 4})
	if err != nil {
		t.Fatal(err)
	}
	base := Options{SimBin: "/bin/sh", RouterBin: "/bin/sh", Replicas: 2, Policies: []string{"kv", "kv" + NoEventsSuffix}, Seeds: 1,
		Concurrency: 1, Tokens: Tokenizer{PerBlock: 16}, OutputScale: 1, LogDir: t.TempDir()}
	if _, err := Replay(context.Background(), base, w); err == nil || !strings.Contains(err.Error(), "block size") {
		t.Errorf("no block size: %v", err)
	}
	o := base
	o.Policies, o.RouterArgs = []string{"kv"}, []string{"--no-events"}
	if _, err := Replay(context.Background(), o, w); err == nil || !strings.Contains(err.Error(), "policy label") {
		t.Errorf("--no-events as a router flag: %v", err)
	}
}

func TestParseModeTokens(t *testing.T) {
	metrics := `# HELP kvroute_router_mode_prompt_tokens_total x
kvroute_router_mode_prompt_tokens_total{engine="engine-0",mode="exact"} 1000
kvroute_router_mode_prompt_tokens_total{engine="engine-1",mode="exact"} 500
kvroute_router_mode_prompt_tokens_total{engine="engine-0",mode="approximate"} 200
kvroute_router_mode_predicted_cached_tokens_total{engine="engine-0",mode="approximate"} 150
kvroute_router_mode_actual_cached_tokens_total{engine="engine-0",mode="approximate"} 50
kvroute_router_mode_actual_cached_tokens_total{engine="engine-1",mode="exact"} 400
kvroute_router_requests_total{code="200"} 9
`
	m, err := parseModeTokens(bufio.NewScanner(strings.NewReader(metrics)))
	if err != nil {
		t.Fatal(err)
	}
	if got := m["exact"]; got != (ModeTokens{Prompt: 1500, Actual: 400}) {
		t.Errorf("exact %+v", got)
	}
	if got := m["approximate"]; got != (ModeTokens{Prompt: 200, Predicted: 150, Actual: 50}) {
		t.Errorf("approximate %+v", got)
	}
	if len(m) != 2 {
		t.Errorf("modes %v", ModeNames(m))
	}
}

// EventsRatios pairs a label with its no-events twin seed by seed; a seed missing the twin is
// left out, and a label without a twin gives nothing.
func TestEventsRatios(t *testing.T) {
	run := func(label string, seed int, cached int, ttft float64) *RunResult {
		r := &RunResult{Policy: label, Seed: seed, Wall: 1, Engines: []string{"e"}}
		for i := 0; i < 10; i++ {
			r.Outcomes = append(r.Outcomes, Outcome{Engine: "e", TTFT: ttft, E2E: ttft, PromptTokens: 100, CachedTokens: cached})
		}
		return r
	}
	runs := []*RunResult{
		run("kv", 1, 80, 0.2), run("kv:no-events", 1, 40, 0.4), run("round-robin", 1, 20, 1),
		run("kv", 2, 60, 0.3), run("kv:no-events", 2, 60, 0.3), run("round-robin", 2, 20, 1),
		run("kv", 3, 90, 0.1),
	}
	rs := EventsRatios(runs)
	if len(rs) != 1 || rs[0].Policy != "kv" {
		t.Fatalf("ratios %+v", rs)
	}
	e := rs[0]
	if len(e.Seeds) != 2 || e.Cached[0] != 2 || e.Cached[1] != 1 || e.TTFTP90[0] != 0.5 {
		t.Fatalf("per seed %+v", e)
	}
	if math.Abs(e.CachedCI.Mean-1.5) > 1e-12 || e.CachedCI.N != 2 {
		t.Errorf("interval %+v", e.CachedCI)
	}
}

// A label ending in :pd or :pd=N runs disaggregated, the threshold given to the routers; the
// rest of the label is the policy and its events mode. Without a prefill pool of 1 .. replicas-1
// or with a threshold the router refuses, Replay says what to give.
func TestSplitPD(t *testing.T) {
	for _, tc := range []struct {
		label, rest, min string
		pd               bool
	}{{"kv", "kv", "", false}, {"kv:pd", "kv", "", true}, {"kv:pd=-1", "kv", "-1", true}, {"kv:no-events:pd=500", "kv:no-events", "500", true},
		{"kv:pd=", "kv:pd=", "", false}, {"kv:pdx", "kv:pdx", "", false}} {
		rest, pd, min := SplitPD(tc.label)
		if rest != tc.rest || pd != tc.pd || min != tc.min {
			t.Errorf("SplitPD(%q) = %q, %v, %q; want %q, %v, %q", tc.label, rest, pd, min, tc.rest, tc.pd, tc.min)
		}
	}
	if p, ev := SplitPolicy("kv:no-events:pd=500"); p != "kv" || ev {
		t.Errorf("SplitPolicy of a P/D label: %q, %v", p, ev)
	}
	if args := routerArgs(Options{}, "e.txt", "kv:pd=500"); !strings.Contains(strings.Join(args, " "), "--policy kv --disagg-min-uncached-tokens 500") {
		t.Errorf("router args %v", args)
	}
	w, err := Regime("no-reuse", RegimeOptions{Requests: 4})
	if err != nil {
		t.Fatal(err)
	}
	base := Options{SimBin: "/bin/sh", RouterBin: "/bin/sh", Replicas: 2, Policies: []string{"kv:pd"}, Seeds: 1, BlockSize: 16,
		Concurrency: 1, Tokens: Tokenizer{PerBlock: 16}, OutputScale: 1, LogDir: t.TempDir()}
	for _, c := range []struct {
		prefill int
		label   string
		want    string
	}{{0, "kv:pd", "give the prefill pool 1 to 1 of the 2 replicas"}, {2, "kv:pd", "not 2"}, {1, "kv:pd=0", "is -1 (split every request) or a number of tokens >= 1"}} {
		o := base
		o.Prefill, o.Policies = c.prefill, []string{c.label}
		if _, err := Replay(context.Background(), o, w); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("prefill %d, %s: %v, want %q", c.prefill, c.label, err, c.want)
		}
	}
}

// The per-engine accuracy series sum by pool (the replay's engine names), the split counter by
// path and reason.
func TestParsePoolFigures(t *testing.T) {
	metrics := `kvroute_router_prompt_tokens_total{engine="prefill-0"} 1000
kvroute_router_prompt_tokens_total{engine="prefill-1"} 500
kvroute_router_predicted_cached_tokens_total{engine="prefill-0"} 700
kvroute_router_actual_cached_tokens_total{engine="prefill-0"} 700
kvroute_router_prompt_tokens_total{engine="decode-0"} 1500
kvroute_router_actual_cached_tokens_total{engine="decode-0"} 1498
kvroute_router_prompt_tokens_total{engine="engine-3"} 10
kvroute_router_disagg_requests_total{path="split",reason=""} 2
kvroute_router_disagg_requests_total{path="decode_only",reason="cached_prefix"} 1
`
	pools, disagg, err := parsePoolFigures(bufio.NewScanner(strings.NewReader(metrics)))
	if err != nil {
		t.Fatal(err)
	}
	if pools["prefill"] != (ModeTokens{Prompt: 1500, Predicted: 700, Actual: 700}) || pools["decode"] != (ModeTokens{Prompt: 1500, Actual: 1498}) ||
		pools["aggregated"] != (ModeTokens{Prompt: 10}) {
		t.Errorf("pools %+v", pools)
	}
	if disagg["split/"] != 2 || disagg["decode_only/cached_prefix"] != 1 || len(disagg) != 2 {
		t.Errorf("disagg %v", disagg)
	}
}
