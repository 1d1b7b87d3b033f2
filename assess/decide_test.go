package assess

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// fleet builds a snapshot of replicas with the given hit rates, 100k query tokens and 100
// finished requests each, over 60 s.
func fleet(rates ...float64) Snapshot {
	s := Snapshot{Source: "test", Model: "m", WindowSeconds: 60}
	for i, h := range rates {
		s.Replicas = append(s.Replicas, Replica{Pod: fmt.Sprintf("pod-%d", i), Engine: "0", Model: "m",
			QueryTokens: 100000, HitTokens: 100000 * h, Requests: ptr(100), Preemptions: ptr(0),
			KVUsageMean: ptr(0.3), KVUsageMax: ptr(0.5)})
	}
	return s
}

func TestDecideVerdicts(t *testing.T) {
	for _, c := range []struct {
		name  string
		snap  Snapshot
		th    func(*Thresholds)
		want  Verdict
		words []string // in the headline or reasons
	}{
		{name: "one replica", snap: fleet(0.3), want: VerdictSingleReplica, words: []string{"nothing to route", "pod-0/0"}},
		{name: "one idle replica", snap: func() Snapshot { s := fleet(0); s.Replicas[0].QueryTokens = 0; return s }(),
			want: VerdictSingleReplica},
		{name: "hot shared prefix everywhere", snap: fleet(0.82, 0.85, 0.8, 0.84), want: VerdictAlreadyHigh,
			words: []string{"already high on every replica", "lowest 80.0%", "session_affinity"}},
		{name: "unique prompts", snap: fleet(0, 0, 0), want: VerdictNotWorthIt, words: []string{"not worth it", "+0.0 points"}},
		{name: "a trickle of reuse", snap: fleet(0.01, 0.0, 0.02, 0.01), want: VerdictNotWorthIt},
		{name: "scattered shared prefixes", snap: fleet(0.2, 0.22, 0.18, 0.2), want: VerdictWorthRouting,
			words: []string{"Worth routing", "N(1-(1-1/N)^k)"}},
		{name: "one replica low keeps it out of already-high", snap: fleet(0.9, 0.9, 0.9, 0.1), want: VerdictWorthRouting},
		{name: "stricter high threshold", snap: fleet(0.82, 0.85, 0.8, 0.84), want: VerdictWorthRouting,
			th: func(t *Thresholds) { t.HighHitRate = 0.9 }},
		{name: "stricter min gain", snap: fleet(0.2, 0.22, 0.18, 0.2), want: VerdictNotWorthIt,
			th: func(t *Thresholds) { t.MinGain = 0.5 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			th := DefaultThresholds()
			if c.th != nil {
				c.th(&th)
			}
			a, err := Decide(c.snap, th)
			if err != nil {
				t.Fatal(err)
			}
			if a.Verdict != c.want {
				t.Fatalf("verdict %s, want %s: %s %q", a.Verdict, c.want, a.Headline, a.Reasons)
			}
			text := a.Headline + " " + strings.Join(a.Reasons, " ")
			for _, w := range c.words {
				if !strings.Contains(text, w) {
					t.Errorf("%q missing from %s", w, text)
				}
			}
			if len(a.Counters) == 0 || !strings.Contains(strings.Join(a.Counters, " "), "preempted") {
				t.Error("the output must say what vLLM's counters include after a preemption")
			}
		})
	}
}

func TestDecideNumbers(t *testing.T) {
	s := fleet(0.1, 0.3) // 2 replicas, 200k tokens, 40k hits over 60 s
	s.Replicas[0].Requests = ptr(50)
	s.Replicas[1].Requests = ptr(150)
	s.Replicas[1].Preemptions = ptr(4)
	s.Replicas[0].RunningMean, s.Replicas[0].WaitingMean = ptr(2), ptr(1)
	a, err := Decide(s, DefaultThresholds())
	if err != nil {
		t.Fatal(err)
	}
	f := a.Fleet
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("hit rate", f.HitRate, 0.2)
	near("hit min", *f.HitRateMin, 0.1)
	near("query tok/s", f.QueryTokensPerS, 200000.0/60)
	near("miss tok/s", f.MissTokensPerS, 160000.0/60)
	near("req/s", *f.RequestsPerS, 200.0/60)
	near("preempt/req", *f.PreemptionsPerRequest, 4.0/200)
	near("load cv", f.LoadCV, 0.5) // 50 vs 150 requests
	near("load max/mean", f.LoadMaxOverMean, 1.5)
	near("in flight", *a.Replicas[0].InFlightMean, 3)
	if a.Replicas[1].PreemptionsPerRequest == nil || *a.Replicas[1].PreemptionsPerRequest != 4.0/150 {
		t.Errorf("per-replica preemptions per request: %v", a.Replicas[1].PreemptionsPerRequest)
	}
	if f.LoadBasis != "requests/s" {
		t.Errorf("load basis %q", f.LoadBasis)
	}
	e := a.Estimate
	c := SharedCacheCeiling(0.2, 2)
	near("ceiling", e.HitRate, c.HitRate)
	near("gain", e.GainMax, c.HitRate-0.2)
	near("prefill saved", e.PrefillSavedMax, (c.HitRate-0.2)/0.8)
	near("tok/s saved", e.PrefillTokensPerSSavedMax, (c.HitRate-0.2)*200000/60)
	joined := strings.Join(a.Warnings, "\n")
	for _, w := range []string{"Preemptions are high: 0.020 per finished request", "Load is already uneven: the busiest replica carries 1.50x"} {
		if !strings.Contains(joined, w) {
			t.Errorf("warning %q missing from:\n%s", w, joined)
		}
	}
}

func TestDecideWarnings(t *testing.T) {
	s := fleet(0.2, 0.2, 0.2)
	s.Replicas[0].KVUsageMax = ptr(0.97)
	s.Replicas[1].QueryTokens, s.Replicas[1].HitTokens = 0, 0       // served requests, looked nothing up
	s.Replicas[2].Requests, s.Replicas[2].Preemptions = nil, ptr(3) // no request counts: no per-request rate
	for i := range s.Replicas {
		s.Replicas[i].QueryTokens /= 20 // 10k tokens in all: below the sample floor
	}
	a, err := Decide(s, DefaultThresholds())
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(a.Warnings, "\n")
	for _, w := range []string{"KV pressure: usage reached 97.0%", "pod-1/0 finished 100 requests but looked up no prompt tokens",
		"3 preemptions in the window", "rates are noisy"} {
		if !strings.Contains(joined, w) {
			t.Errorf("warning %q missing from:\n%s", w, joined)
		}
	}
	if a.Fleet.LoadBasis != "prompt tokens/s" || a.Fleet.RequestsPerS != nil || a.Replicas[1].HitRate != nil {
		t.Errorf("without request counts everywhere the spread is on tokens: %+v", a.Fleet)
	}
}

func TestDecideErrors(t *testing.T) {
	s := fleet(0, 0)
	for i := range s.Replicas {
		s.Replicas[i].QueryTokens = 0
	}
	if _, err := Decide(s, DefaultThresholds()); !errors.Is(err, ErrNoTraffic) || !strings.Contains(err.Error(), "widen") {
		t.Errorf("no traffic: %v", err)
	}
	if _, err := Decide(Snapshot{WindowSeconds: 1}, DefaultThresholds()); err == nil {
		t.Error("empty snapshot accepted")
	}
	if _, err := Decide(fleet(0.1, 0.1), Thresholds{HighHitRate: 2}); err == nil {
		t.Error("bad thresholds accepted")
	}
	s = fleet(0.1, 0.1)
	s.WindowSeconds = 0
	if _, err := Decide(s, DefaultThresholds()); err == nil {
		t.Error("zero window accepted")
	}
}

func TestRenderers(t *testing.T) {
	a, err := Decide(fleet(0.2, 0.25, 0.15), DefaultThresholds())
	if err != nil {
		t.Fatal(err)
	}
	var tb, md, js bytes.Buffer
	if err := RenderTable(&tb, a); err != nil {
		t.Fatal(err)
	}
	if err := RenderMarkdown(&md, a); err != nil {
		t.Fatal(err)
	}
	if err := RenderJSON(&js, a); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"VERDICT: worth-routing", "REPLICA", "pod-2/0", "fleet", "20.0%", "About the counters:"} {
		if !strings.Contains(tb.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, tb.String())
		}
	}
	for _, line := range strings.Split(tb.String(), "\n") {
		if len(line) > 130 {
			t.Errorf("table line longer than 130 columns: %q", line)
		}
	}
	for _, w := range []string{"**Verdict: `worth-routing`**", "| REPLICA | HIT RATE |", "### Why", "- "} {
		if !strings.Contains(md.String(), w) {
			t.Errorf("markdown lacks %q:\n%s", w, md.String())
		}
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back["verdict"] != "worth-routing" || back["fleet"].(map[string]any)["replicas"] != 3.0 ||
		back["estimate"].(map[string]any)["shared_hit_rate"] == nil || back["thresholds"].(map[string]any)["high_hit_rate"] != 0.5 {
		t.Errorf("json: %s", js.String())
	}
}

func TestNum(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 3.25: "3.2", 99.96: "100", 1234.4: "1,234", 1234567: "1,234,567", -4321: "-4,321"} {
		if got := num(in); got != want {
			t.Errorf("num(%v) = %q, want %q", in, got, want)
		}
	}
}
