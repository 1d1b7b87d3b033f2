package fleet

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/router/score"
)

// TestKVFrontier is a measurement, not a check (docs/benchmarks.md, "Tie-break seeds"): it
// runs `kv` over a grid of its two balance settings, the token bound's slack and the weight of
// queued prefill, on the three shared traces at the benchmark's defaults, and prints each point's hit rate over global-lru beside its imbalance p95, with the
// other policies' points for reference. It says whether any setting reaches both fleet-model
// targets at once (hit >= 0.97 x global-lru, p95 <= 1.05 x the trace's online floor).
//
//	KVROUTE_KV_FRONTIER=1 go test -count=1 -run TestKVFrontier -v ./sim/fleet/
//
// KVROUTE_KV_FRONTIER_SLACKS and KVROUTE_KV_FRONTIER_WEIGHTS (comma-separated, "inf" for no
// bound) replace the grid; KVROUTE_KV_FRONTIER_SEEDS=N runs every point over seeds 1..N.
func TestKVFrontier(t *testing.T) {
	if os.Getenv("KVROUTE_KV_FRONTIER") == "" {
		t.Skip("a measurement; set KVROUTE_KV_FRONTIER=1")
	}
	traces := []struct{ name, path string }{
		{"conversation", "../../testdata/traces/mooncake/conversation_trace.jsonl"},
		{"synthetic", "../../testdata/traces/mooncake/synthetic_trace.jsonl"},
		{"llm-d", "../../testdata/traces/synthetic/llmd_shared_prefix_150x5_6000_1200_1000.jsonl"},
	}
	slacks := envFloats(t, "KVROUTE_KV_FRONTIER_SLACKS", []float64{0.1, 0.2, 0.3, 0.5, 1, math.Inf(1)})
	weights := envFloats(t, "KVROUTE_KV_FRONTIER_WEIGHTS", []float64{0.1, 0.3, 1})
	seeds := int64(1)
	if v := os.Getenv("KVROUTE_KV_FRONTIER_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("KVROUTE_KV_FRONTIER_SEEDS: %q, want a count >= 1", v)
		}
		seeds = int64(n)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d seed(s) a point (the policies' tie-break draws); with more than one: mean (min-max)\n", seeds)
	fmt.Fprintln(&b, "| trace | policy | slack | queued-prefill weight | hit / global-lru | imbalance p95 | TTFT p90 s |")
	fmt.Fprintln(&b, "|---|---|---|---|---|---|---|")
	for _, tc := range traces {
		tr, err := LoadTrace(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		lru := GlobalLRU(tr, DefaultConfig.CapacityBlocks)
		point := func(policy, slack, weight string, kv *score.KVParams) {
			var hit, p95, ttft spread
			for seed := int64(1); seed <= seeds; seed++ {
				c := DefaultConfig
				c.KV, c.Seed = kv, seed
				r, err := Run(tr, c, policy)
				if err != nil {
					t.Fatal(err)
				}
				hit.add(r.HitRateBlocks / lru)
				p95.add(r.ImbalanceP95)
				ttft.add(r.TTFTP90)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", tc.name, policy, slack, weight,
				hit.format("%.3f"), p95.format("%.2f"), ttft.format("%.2f"))
		}
		for _, s := range slacks {
			for _, w := range weights {
				p := score.DefaultKV
				p.Slack, p.QueuedPrefillWeight = s, w
				point("kv", fmt.Sprint(s), fmt.Sprint(w), &p)
			}
		}
		for _, pol := range []string{"load", "round-robin", "sglang-cache-aware", "llmd-default", "dynamo-kv"} {
			point(pol, "", "", nil)
		}
	}
	t.Log("\n" + b.String())
}

// envFloats reads a comma-separated list of numbers from the environment, or returns def.
func envFloats(t *testing.T, name string, def []float64) []float64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []float64
	for _, f := range strings.Split(v, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, x)
	}
	return out
}

// spread is a figure over seeds: mean, least and most.
type spread struct {
	sum, lo, hi float64
	n           int
}

func (s *spread) add(x float64) {
	if s.n == 0 || x < s.lo {
		s.lo = x
	}
	if s.n == 0 || x > s.hi {
		s.hi = x
	}
	s.sum += x
	s.n++
}

func (s *spread) format(f string) string {
	if s.n == 1 {
		return fmt.Sprintf(f, s.sum)
	}
	return fmt.Sprintf(f+" ("+f+"-"+f+")", s.sum/float64(s.n), s.lo, s.hi)
}
