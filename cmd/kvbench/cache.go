package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/sim/fleet"
	"github.com/kvroute/kvroute/sim/policies"
	"github.com/kvroute/kvroute/sim/replay"
)

// cacheOutput is the JSON shape of `kvbench cache --json` (docs/benchmarks.md; main_test.go pins
// its fields).
type cacheOutput struct {
	Trace          string          `json:"trace"`
	Replicas       int             `json:"replicas"`
	CapacityBlocks int             `json:"capacity_blocks"`
	Results        []*fleet.Result `json:"results"`
	Ceilings       ceilings        `json:"ceilings"`
	// Ranking names the policies best first by block hit rate (ties: lower TTFT p90, then name).
	// Results stay in --policies order so scripts can index them; the table prints this order.
	Ranking []string `json:"ranking"`
}

type ceilings struct {
	GlobalLRU float64 `json:"global-lru"`
	Belady    float64 `json:"belady"`
}

const defaultPolicies = "kv,load,round-robin,random,session,prefix-char,sglang-cache-aware,llmd-default,dynamo-kv"

func runCache(args []string, stdout, stderr io.Writer) error {
	reg := policies.Registry() // the production policies and kvbench's benchmark ones
	fs := flag.NewFlagSet("cache", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := fleet.DefaultConfig
	trace := fs.String("trace", "", "Mooncake JSONL trace, or a kvrouter capture directory (this or --regime is required)")
	regime := fs.String("regime", "", "generated regime instead of a trace ("+strings.Join(replay.RegimeNames(), ", ")+")")
	regimeRequests := fs.Int("regime-requests", 4000, "--regime: requests")
	regimeRate := fs.Float64("regime-rate", 16, "--regime: mean arrivals per second (kvbench replay names it --rate)")
	replicas := fs.Int("replicas", d.Replicas, "replicas in the fleet (kvbench replay defaults to 4: each of its replicas is a vllm-sim process on this machine)")
	capacity := fs.Int("capacity-blocks", d.CapacityBlocks, "KV capacity of the whole fleet in 512-token blocks")
	policies := fs.String("policies", defaultPolicies, "comma-separated policies ("+strings.Join(reg.Names(), ", ")+"); every peer's by default, where kvbench replay, whose every policy is a live run, defaults to four")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	speed := fs.Float64("speed", d.Speed, "replay speed: arrival = timestamp / speed (the model's time costs nothing, so the trace's own pace; kvbench replay, in wall time, defaults to 20)")
	prefill := fs.Float64("prefill-tokens-per-s", d.PrefillTokensPerS, "prefill rate for uncached tokens")
	decode := fs.Float64("decode-ms-per-token", d.DecodeMsPerToken, "decode time per output token (ms)")
	seqs := fs.Int("max-num-seqs", d.MaxNumSeqs, "running requests per replica; the rest queue")
	engine := fs.String("engine", d.Engine, "replica service model: step (vLLM v1 scheduler steps: prefill chunks and decodes batched) or serial (one prefill at a time, decodes beside it)")
	batched := fs.Int("max-batched-tokens", d.MaxBatchedTokens, "--engine step: token budget per scheduler step (vLLM's --max-num-batched-tokens)")
	seed := fs.Int64("seed", d.Seed, "seed of every random choice")
	report := fs.String("report", "", "write an HTML report into this directory")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvbench cache (--trace FILE|DIR | --regime NAME) [flags]\n\n"+
			"Runs the deterministic fleet model (sim/fleet) over a trace for each policy and prints hit rate,\n"+
			"balance and TTFT per policy, with the best of each column first.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments %q", fs.Args())
	}
	if (*trace == "") == (*regime == "") {
		return usagef("exactly one of --trace and --regime is required")
	}
	if *regime != "" && !slices.Contains(replay.RegimeNames(), *regime) {
		return usagef("--regime %q: known regimes are %s", *regime, strings.Join(replay.RegimeNames(), ", "))
	}
	if *speed <= 0 || *prefill <= 0 || *decode < 0 || *seqs < 1 || *batched < 1 {
		return usagef("--speed and --prefill-tokens-per-s must be > 0, --decode-ms-per-token >= 0, --max-num-seqs and --max-batched-tokens >= 1")
	}
	names := splitList(*policies)
	if len(names) == 0 {
		return usagef("--policies is empty")
	}
	for _, n := range names {
		if _, err := reg.New(n, score.Options{}); err != nil {
			return usageError{err}
		}
	}
	var tr *fleet.Trace
	var err error
	if *regime != "" {
		w, err := replay.Regime(*regime, replay.RegimeOptions{Requests: *regimeRequests, Rate: *regimeRate,
			Replicas: *replicas, Seed: uint64(*seed)})
		if err != nil {
			return err
		}
		tr = w.Trace()
		*trace = "regime " + *regime
	} else if tr, err = fleet.LoadTrace(*trace); err != nil {
		return err
	}
	cfg := fleet.Config{Replicas: *replicas, CapacityBlocks: *capacity, Speed: *speed,
		PrefillTokensPerS: *prefill, DecodeMsPerToken: *decode, MaxNumSeqs: *seqs, Seed: *seed,
		WindowSeconds: d.WindowSeconds, Engine: *engine, MaxBatchedTokens: *batched}
	out := cacheOutput{Trace: filepath.Base(*trace), Replicas: *replicas, CapacityBlocks: *capacity,
		Ceilings: ceilings{GlobalLRU: round3(fleet.GlobalLRU(tr, *capacity)), Belady: round3(fleet.Belady(tr, *capacity))}}
	for _, n := range names {
		r, err := fleet.Run(tr, cfg, n)
		if err != nil {
			return err
		}
		out.Results = append(out.Results, r)
	}
	out.Ranking = rankByHitRate(out.Results)
	if *report != "" {
		if err := writeReport(*report, &out, "kvbench cache "+strings.Join(args, " ")); err != nil {
			return err
		}
	}
	if *asJSON {
		rounded := out
		rounded.Results = nil
		for _, r := range out.Results {
			c := *r
			c.HitRateBlocks, c.HitRateTokens = round3(c.HitRateBlocks), round3(c.HitRateTokens)
			c.Imbalance, c.ImbalanceP95 = round3(c.Imbalance), round3(c.ImbalanceP95)
			c.TTFTP50, c.TTFTP90 = round3(c.TTFTP50), round3(c.TTFTP90)
			rounded.Results = append(rounded.Results, &c)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rounded)
	}
	return writeTable(stdout, &out)
}

func writeTable(w io.Writer, out *cacheOutput) error {
	fmt.Fprintf(w, "trace %s, %d replicas, %d blocks (%d per replica); global-lru %.3f, belady %.3f\n",
		out.Trace, out.Replicas, out.CapacityBlocks, out.CapacityBlocks/out.Replicas, out.Ceilings.GlobalLRU, out.Ceilings.Belady)
	byName := make(map[string]*fleet.Result, len(out.Results))
	for _, r := range out.Results {
		byName[r.Policy] = r
	}
	if line := headline(out.Results); line != "" {
		fmt.Fprintln(w, line)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rank\tpolicy\thit_blocks\thit_tokens\tvs_lru\timbalance\timbalance_p95\tttft_p50_s\tttft_p90_s\t")
	for i, name := range out.Ranking {
		r := byName[name]
		vs := 0.0
		if out.Ceilings.GlobalLRU > 0 {
			vs = r.HitRateBlocks / out.Ceilings.GlobalLRU
		}
		fmt.Fprintf(tw, "%d\t%s\t%.3f\t%.3f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", i+1, r.Policy, r.HitRateBlocks,
			r.HitRateTokens, vs, r.Imbalance, r.ImbalanceP95, r.TTFTP50, r.TTFTP90)
	}
	return tw.Flush()
}

// headline names the best policy of each column a reader weighs (hit rate: highest; TTFT p90 and
// imbalance p95: lowest), with every policy that ties at the printed precision: no one column
// decides, as the policy with the most hits can queue the most.
func headline(results []*fleet.Result) string {
	if len(results) == 0 {
		return ""
	}
	cols := []struct {
		name     string
		decimals int
		value    func(*fleet.Result) float64
		higher   bool
	}{
		{"hit_blocks", 3, func(r *fleet.Result) float64 { return r.HitRateBlocks }, true},
		{"ttft_p90_s", 2, func(r *fleet.Result) float64 { return r.TTFTP90 }, false},
		{"imbalance_p95", 2, func(r *fleet.Result) float64 { return r.ImbalanceP95 }, false},
	}
	var parts []string
	for _, c := range cols {
		scale := math.Pow(10, float64(c.decimals))
		var best float64
		var names []string
		for i, r := range results {
			v := math.Round(c.value(r)*scale) / scale
			switch {
			case i == 0 || c.higher && v > best || !c.higher && v < best:
				best, names = v, []string{r.Policy}
			case v == best:
				names = append(names, r.Policy)
			}
		}
		slices.Sort(names)
		parts = append(parts, fmt.Sprintf("%s %s %.*f", c.name, strings.Join(names, ", "), c.decimals, best))
	}
	return "best per column: " + strings.Join(parts, " | ") + " (rows ordered by hit_blocks)"
}

// rankByHitRate orders policy names best first: higher block hit rate, then lower TTFT p90, then
// name, so equal results always print in the same order.
func rankByHitRate(results []*fleet.Result) []string {
	sorted := slices.Clone(results)
	slices.SortStableFunc(sorted, func(a, b *fleet.Result) int {
		if c := cmp.Compare(b.HitRateBlocks, a.HitRateBlocks); c != 0 {
			return c
		}
		if c := cmp.Compare(a.TTFTP90, b.TTFTP90); c != 0 {
			return c
		}
		return strings.Compare(a.Policy, b.Policy)
	})
	names := make([]string, len(sorted))
	for i, r := range sorted {
		names[i] = r.Policy
	}
	return names
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func round3(x float64) float64 {
	return float64(int64(x*1000+0.5)) / 1000
}

// mkdir creates the report directory.
func mkdir(dir string) error { return os.MkdirAll(dir, 0o755) }
