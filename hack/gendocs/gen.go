package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kvroute/kvroute/sim/fleet"
)

// fleetTrace is one committed trace the fleet-model tables cover (the Makefile's BENCH_TRACES).
type fleetTrace struct {
	key, label, path string
	// headline: the trace's TTFTs measure routing, not a backlog, so the README may quote it.
	headline bool
}

var fleetTraces = []fleetTrace{
	{"conversation", "Mooncake conversation", "testdata/traces/mooncake/conversation_trace.jsonl", true},
	{"synthetic", "Mooncake synthetic", "testdata/traces/mooncake/synthetic_trace.jsonl", true},
	// 34 requests/s against a fleet that serves at most 12.8: every policy queues for minutes.
	{"llmd", "llm-d shared prefix", "testdata/traces/synthetic/llmd_shared_prefix_150x5_6000_1200_1000.jsonl", false},
}

// fleetPolicies is `kvbench cache`'s default --policies, in its order.
var fleetPolicies = []string{"kv", "load", "round-robin", "random", "session", "prefix-char",
	"sglang-cache-aware", "llmd-default", "dynamo-kv"}

// peers are the policies that emulate another project's router (router/score/peers.go).
var peers = []string{"sglang-cache-aware", "llmd-default", "dynamo-kv"}

type fleetRun struct {
	trace             fleetTrace
	globalLRU, belady float64
	results           []*fleet.Result
}

func (r *fleetRun) get(policy string) *fleet.Result {
	for _, x := range r.results {
		if x.Policy == policy {
			return x
		}
	}
	return nil
}

// runFleet runs every default policy over tr at kvbench cache's defaults.
func runFleet(root string, tr fleetTrace) (*fleetRun, error) {
	t, err := fleet.LoadTrace(filepath.Join(root, tr.path))
	if err != nil {
		return nil, err
	}
	cfg := fleet.DefaultConfig
	run := &fleetRun{trace: tr, globalLRU: fleet.GlobalLRU(t, cfg.CapacityBlocks), belady: fleet.Belady(t, cfg.CapacityBlocks)}
	for _, p := range fleetPolicies {
		r, err := fleet.Run(t, cfg, p)
		if err != nil {
			return nil, err
		}
		run.results = append(run.results, r)
	}
	return run, nil
}

// resultFile is one committed live-replay result: `kvbench replay --json`'s output under
// "replay", with what it was measured on.
type resultFile struct {
	name    string
	Title   string `json:"title"`
	Label   string `json:"label"` // what the workload shows: reuse, or no reuse
	Order   int    `json:"order"`
	Commit  string `json:"commit"`
	Command string `json:"command"`
	Machine string `json:"machine"`
	Replay  struct {
		Workload  string          `json:"workload"`
		Replicas  int             `json:"replicas"`
		Seeds     int             `json:"seeds"`
		Requests  int             `json:"requests"`
		Results   []replaySummary `json:"results"`
		BestOther []struct {
			Metric    string   `json:"metric"`
			Policy    string   `json:"policy"`
			BestOther []string `json:"best_other_per_seed"`
			Ratio     interval `json:"ratio"`
		} `json:"best_other_ratios"`
	} `json:"replay"`
}

type replaySummary struct {
	Policy         string   `json:"policy"`
	Seeds          int      `json:"seeds"`
	Requests       int      `json:"requests"`
	Errors         int      `json:"errors"`
	Held           int      `json:"held"`
	TTFTP50        interval `json:"ttft_p50_s"`
	TTFTP90        interval `json:"ttft_p90_s"`
	TTFTP99        interval `json:"ttft_p99_s"`
	CachedRatio    interval `json:"cached_ratio"`
	MaxEngineShare interval `json:"max_engine_share"`
}

type interval struct {
	Mean  float64 `json:"mean"`
	Lo    float64 `json:"lo"`
	Hi    float64 `json:"hi"`
	N     int     `json:"n"`
	Range bool    `json:"range"`
}

func (f *resultFile) get(policy string) *replaySummary {
	for i := range f.Replay.Results {
		if f.Replay.Results[i].Policy == policy {
			return &f.Replay.Results[i]
		}
	}
	return nil
}

func loadResults(root string) ([]*resultFile, error) {
	paths, err := filepath.Glob(filepath.Join(root, "docs/results/*.json"))
	if err != nil {
		return nil, err
	}
	var out []*resultFile
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		f := &resultFile{name: strings.TrimSuffix(filepath.Base(p), ".json")}
		if err := json.Unmarshal(b, f); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		switch {
		case f.Commit == "" || f.Command == "" || f.Title == "":
			return nil, fmt.Errorf("%s: title, commit and command are required", p)
		case f.get("kv") == nil || f.get("round-robin") == nil:
			return nil, fmt.Errorf("%s: kv and round-robin are required", p)
		}
		out = append(out, f)
	}
	slices.SortStableFunc(out, func(a, b *resultFile) int { return a.Order - b.Order })
	return out, nil
}

// generate returns every generated file's full content, by path relative to root.
func generate(root string) (map[string][]byte, error) {
	var runs []*fleetRun
	for _, tr := range fleetTraces {
		r, err := runFleet(root, tr)
		if err != nil {
			return nil, fmt.Errorf("fleet model on %s: %w", tr.path, err)
		}
		runs = append(runs, r)
	}
	results, err := loadResults(root)
	if err != nil {
		return nil, err
	}
	render := func(name string) (string, error) {
		switch {
		case name == "headline":
			return headline(runs, results), nil
		case name == "fleet-ceilings":
			return fleetCeilings(runs), nil
		case strings.HasPrefix(name, "fleet-"):
			for _, r := range runs {
				if r.trace.key == strings.TrimPrefix(name, "fleet-") {
					return fleetTable(r), nil
				}
			}
		case strings.HasPrefix(name, "replay-"):
			for _, f := range results {
				if f.name == strings.TrimPrefix(name, "replay-") {
					return replayTable(f), nil
				}
			}
		}
		return "", fmt.Errorf("no generator for this region (fleet-TRACE, replay-RESULT, headline, fleet-ceilings)")
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs/*.md"))
	if err != nil {
		return nil, err
	}
	docs = append([]string{filepath.Join(root, "README.md")}, docs...)
	files := map[string][]byte{}
	for _, p := range docs {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		if !strings.Contains(string(b), beginMark) {
			continue
		}
		out, err := fill(string(b), render)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		rel, _ := filepath.Rel(root, p)
		files[filepath.ToSlash(rel)] = []byte(out)
	}
	files["docs/img/fleet-ttft-p90.svg"] = fleetPlot(runs)
	if len(results) > 0 {
		files["docs/img/replay-ttft-p90.svg"] = replayPlot(results)
	}
	return files, nil
}

func cacheCommand(tr fleetTrace) string { return "bin/kvbench cache --trace " + tr.path }

func fleetTable(r *fleetRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "`%s` (8 replicas, 4,800 blocks; one cache of the whole capacity: LRU %.3f, Belady %.3f)\n\n",
		cacheCommand(r.trace), r.globalLRU, r.belady)
	b.WriteString("| policy | hit, blocks | hit, tokens | x global LRU | imbalance | imbalance p95 | TTFT p50 s | TTFT p90 s |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|\n")
	bestHit, bestP95, bestP90 := math.Inf(-1), math.Inf(1), math.Inf(1)
	for _, x := range r.results {
		bestHit = math.Max(bestHit, round(x.HitRateBlocks, 3))
		bestP95 = math.Min(bestP95, round(x.ImbalanceP95, 2))
		bestP90 = math.Min(bestP90, round(x.TTFTP90, 2))
	}
	bold := func(s string, best bool) string {
		if best {
			return "**" + s + "**"
		}
		return s
	}
	for _, x := range r.results {
		vs := 0.0
		if r.globalLRU > 0 {
			vs = x.HitRateBlocks / r.globalLRU
		}
		fmt.Fprintf(&b, "| %s | %s | %.3f | %.2f | %.2f | %s | %.2f | %s |\n", x.Policy,
			bold(fmt.Sprintf("%.3f", x.HitRateBlocks), round(x.HitRateBlocks, 3) == bestHit),
			x.HitRateTokens, vs, x.Imbalance,
			bold(fmt.Sprintf("%.2f", x.ImbalanceP95), round(x.ImbalanceP95, 2) == bestP95),
			x.TTFTP50,
			bold(fmt.Sprintf("%.2f", x.TTFTP90), round(x.TTFTP90, 2) == bestP90))
	}
	return b.String()
}

func fleetCeilings(runs []*fleetRun) string {
	var b strings.Builder
	b.WriteString("| trace | requests' blocks cached by one LRU of the whole capacity | by Belady | round-robin, timed model |\n")
	b.WriteString("|---|--:|--:|--:|\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "| %s | %.3f | %.3f | %.3f |\n", r.trace.label, r.globalLRU, r.belady, r.get("round-robin").HitRateBlocks)
	}
	return b.String()
}

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

func fmtInterval(iv interval, format string) string {
	if iv.N < 2 {
		return fmt.Sprintf(format, iv.Mean)
	}
	if iv.Range {
		return fmt.Sprintf(format+" ("+format+".."+format+")", iv.Mean, iv.Lo, iv.Hi)
	}
	return fmt.Sprintf(format+" ["+format+", "+format+"]", iv.Mean, iv.Lo, iv.Hi)
}

func replayTable(f *resultFile) string {
	var b strings.Builder
	fmt.Fprintf(&b, "**%s** (%s). %d requests a seed, %d engines, %d seeds; measured at commit `%s` on %s:\n\n",
		f.Title, f.Label, f.Replay.Requests, f.Replay.Replicas, f.Replay.Seeds, f.Commit, f.Machine)
	fmt.Fprintf(&b, "```sh\n%s\n```\n\n", f.Command)
	b.WriteString("| policy | TTFT p50 s | TTFT p90 s | TTFT p99 s | cached | busiest engine / fair share | held | errors |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, s := range f.Replay.Results {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %d | %d |\n", s.Policy,
			fmtInterval(s.TTFTP50, "%.3f"), fmtInterval(s.TTFTP90, "%.3f"), fmtInterval(s.TTFTP99, "%.3f"),
			fmtInterval(s.CachedRatio, "%.2f"), fmtInterval(s.MaxEngineShare, "%.2f"), s.Held, s.Errors)
	}
	var ratios []string
	for _, r := range f.Replay.BestOther {
		if r.Ratio.N == 0 { // no seed had a value: nothing cached under any policy
			continue
		}
		ratios = append(ratios, fmt.Sprintf("%s %s", strings.TrimSuffix(r.Metric, "_s"), fmtInterval(r.Ratio, "%.3f")))
	}
	if len(ratios) > 0 {
		fmt.Fprintf(&b, "\n`kv` / the best other policy of each seed: %s.\n", strings.Join(ratios, "; "))
	}
	return b.String()
}

// bestPeer is the peer emulation with the lowest TTFT p90 among those ttft knows.
func bestPeer(ttft func(string) (float64, bool)) string {
	best, bestV := "", math.Inf(1)
	for _, p := range peers {
		if v, ok := ttft(p); ok && v < bestV {
			best, bestV = p, v
		}
	}
	return best
}

func headline(runs []*fleetRun, results []*resultFile) string {
	var b strings.Builder
	b.WriteString("| workload | measured by | kv | round-robin | best peer emulation |\n")
	b.WriteString("|---|---|---|---|---|\n")
	cell := func(p90, cached float64) string { return fmt.Sprintf("%.2f s, %.0f %%", p90, 100*cached) }
	var cmds []string
	for _, r := range runs {
		if !r.trace.headline {
			continue
		}
		peer := bestPeer(func(p string) (float64, bool) {
			if x := r.get(p); x != nil {
				return x.TTFTP90, true
			}
			return 0, false
		})
		kv, rr, pr := r.get("kv"), r.get("round-robin"), r.get(peer)
		fmt.Fprintf(&b, "| %s trace, 8 replicas | fleet model | %s | %s | %s (%s) |\n", r.trace.label,
			cell(kv.TTFTP90, kv.HitRateTokens), cell(rr.TTFTP90, rr.HitRateTokens),
			cell(pr.TTFTP90, pr.HitRateTokens), peer)
		cmds = append(cmds, cacheCommand(r.trace))
	}
	for _, f := range results {
		peer := bestPeer(func(p string) (float64, bool) {
			if s := f.get(p); s != nil {
				return s.TTFTP90.Mean, true
			}
			return 0, false
		})
		kv, rr := f.get("kv"), f.get("round-robin")
		peerCell := "not run"
		if s := f.get(peer); s != nil {
			peerCell = fmt.Sprintf("%s (%s)", cell(s.TTFTP90.Mean, s.CachedRatio.Mean), peer)
		}
		fmt.Fprintf(&b, "| %s (%s) | live replay, %d engines, mean of %d seeds | %s | %s | %s |\n", f.Title, f.Label,
			f.Replay.Replicas, f.Replay.Seeds, cell(kv.TTFTP90.Mean, kv.CachedRatio.Mean),
			cell(rr.TTFTP90.Mean, rr.CachedRatio.Mean), peerCell)
		cmds = append(cmds, "bin/"+strings.TrimSuffix(strings.TrimPrefix(f.Command, "bin/"), " --json"))
	}
	b.WriteString("\nEach cell: time to first token, p90, and the share of prompt tokens served from cache.")
	var commits []string
	for _, f := range results {
		if !slices.Contains(commits, "`"+f.Commit+"`") {
			commits = append(commits, "`"+f.Commit+"`")
		}
	}
	if len(commits) > 0 {
		fmt.Fprintf(&b, " Live rows measured at commit %s ([docs/results/](docs/results/)).", strings.Join(commits, ", "))
	}
	b.WriteString(" Reproduce (after `make build`):\n\n```sh\n")
	for _, c := range cmds {
		b.WriteString(c + "\n")
	}
	b.WriteString("```\n")
	return b.String()
}
