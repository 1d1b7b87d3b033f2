package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/sim/fleet"
	"github.com/kvroute/kvroute/sim/policies"
	"github.com/kvroute/kvroute/sim/replay"
)

// replayOutput is the JSON shape of `kvbench replay --json`.
type replayOutput struct {
	Workload string           `json:"workload"`
	Replicas int              `json:"replicas"`
	Routers  int              `json:"routers"`
	Seeds    int              `json:"seeds"`
	Requests int              `json:"requests"`
	Interval string           `json:"interval"`
	Results  []replay.Summary `json:"results"`
	// EventsRatios pairs each policy run with and without KV events (a label and the same
	// label with replay.NoEventsSuffix): per-seed with/without ratios and their intervals.
	EventsRatios []replay.EventsRatio `json:"events_ratios,omitempty"`
	// BestOther is the policy under test (--under-test) over the best other policy of each seed,
	// for TTFT p90, TTFT p99 and the cached-token ratio, with intervals over the seeds.
	BestOther []replay.BestOtherRatio `json:"best_other_ratios,omitempty"`
	// RatioHalfWidth is --ratio-halfwidth when seeds were added until the TTFT ratios' intervals
	// were that narrow (relative half-width).
	RatioHalfWidth float64             `json:"ratio_halfwidth_target,omitempty"`
	Runs           []*replay.RunResult `json:"runs"`
}

const defaultReplayPolicies = "kv,load,round-robin,prefix-char"

func runReplay(args []string, stdout, stderr io.Writer) error {
	reg := policies.Registry() // the production policies and kvbench's benchmark ones
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	trace := fs.String("trace", "", "Mooncake JSONL trace or a kvrouter capture directory (this or --regime)")
	regime := fs.String("regime", "", "generated workload instead of a trace: "+strings.Join(replay.RegimeNames(), ", "))
	replicas := fs.Int("replicas", 4, "vllm-sim engines, each a process on this machine, hence fewer than kvbench cache's 8 (scale-up: the final size; it starts at half)")
	routers := fs.Int("routers", 1, "kvrouter replicas, clustered as peers sharing their in-flight load; request i goes to router i mod N")
	speed := fs.Float64("speed", 20, "trace replay speed: arrival = (timestamp - first) / speed (20 where kvbench cache takes 1: a live run waits in wall time)")
	policies := fs.String("policies", defaultReplayPolicies, "comma-separated policies, four by default where kvbench cache runs every peer's, since each is a live run ("+strings.Join(reg.Names(), ", ")+"); a policy ending in "+replay.NoEventsSuffix+" runs its routers with --no-events (every replica scored from the approximate index), so kv,kv"+replay.NoEventsSuffix+" compares the two interleaved")
	routerEvents := fs.Bool("router-events", true, "routers subscribe to the engines' KV events; false runs every policy as POLICY"+replay.NoEventsSuffix)
	engineKind := fs.String("engine-kind", "vllm", "the fleet's engine kind: every vllm-sim speaks that engine's HTTP and KV-event wire (vllm, sglang, trtllm) and every kvrouter runs --engine-kind with it")
	seeds := fs.Int("seeds", 3, "repetitions; a seed moves the arrival jitter and the sims' seeds (a regime's requests are drawn once and are the same in every seed; --capacity draws them per seed)")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	report := fs.String("report", "", "write an HTML report into this directory")
	outcomes := fs.String("outcomes", "", "write every request of every run here as JSON lines (policy, seed, and the request's send time, TTFT, end-to-end time, tokens, engine, error): the per-request data behind the percentiles")
	duration := fs.Duration("duration", 8*time.Second, "replay only arrivals in the first DURATION of wall time (0 = no bound; --capacity with --trace: 0 unless given)")
	maxReq := fs.Int("max-requests", 200, "replay at most this many requests per run (0 = all; --capacity with --regime: 0 unless given, each probe sending --duration of arrivals)")
	offset := fs.Int("offset", 0, "start at this request of the trace")
	warmReq := fs.Int("warm-requests", 0, "traces: before each run's measured requests, send the trace's N requests before --offset (--offset >= N) at the same speed through the same routers, unmeasured, and wait for them: a fleet that has served the trace before, where a cold one measures a cold start")
	conc := fs.Int("concurrency", 64, "requests in flight at most (--capacity: 4 x the engines' running slots unless given)")
	tpb := fs.Int("tokens-per-trace-block", replay.DefaultTokensPerTraceBlock, "tokens each 512-token trace block becomes (512 = unscaled)")
	outScale := fs.Float64("output-scale", 0, "max_tokens = output_length x this (default tokens-per-trace-block/512)")
	maxOut := fs.Int("max-output-tokens", 32, "cap on max_tokens (0 = none)")
	jitter := fs.Duration("jitter", 20*time.Millisecond, "per-seed arrival jitter")
	rate := fs.Float64("rate", 25, "regimes: mean arrivals per second (kvbench cache names it --regime-rate)")
	warmup := fs.Duration("warmup", 2*time.Second, "scale-up regime: warm-up window of the new replicas")
	stepModel := fs.String("sim-step-model", defaultSimStepModel, "engine step-time model: vllm-0.20.1-b300 (vllm-sim's default) or splitwise-h100 (alias calibrated), each run at the prefill rate below, or flat (the rate below plus a fixed decode step)")
	prefill := fs.Float64("sim-prefill-tokens-per-s", 0, "engine prefill rate (default 20000 x tokens-per-trace-block/512: trace-equivalent time); a calibrated model: its compute-bound rate")
	decode := fs.Float64("sim-decode-ms-per-token", 20, "flat step model: engine decode step")
	timeScale := fs.Float64("sim-time-scale", 1, "vllm-sim --time-scale: divides every engine duration (on top of a calibrated model's rate match)")
	atAcceptance := fs.Bool("sim-headers-at-acceptance", true, "engines send a stream's headers at acceptance as vLLM does; false holds them until the first token (the old timing)")
	firstSeed := fs.Int("first-seed", 1, "number of the first seed (runs first-seed .. first-seed+seeds-1)")
	blockSize := fs.Int("sim-block-size", 16, "engine KV block size in tokens")
	blocks := fs.Int("sim-num-gpu-blocks", 0, "engine KV blocks (default: 600 trace blocks' worth, as docs/benchmarks.md's 8 x 600)")
	seqs := fs.Int("sim-max-num-seqs", 32, "engine running requests")
	dp := fs.Int("sim-data-parallel-size", 1, "DP ranks per engine")
	binDir := fs.String("bin-dir", "", "directory with vllm-sim (default: next to kvbench, then bin/)")
	simBin := fs.String("vllm-sim", "", "vllm-sim binary (overrides --bin-dir)")
	routerBin := fs.String("kvrouter", "", "run this kvrouter binary as the routers, for production policies only (default: this kvbench's own router, kvrouter's code with the benchmark policies registered, for every policy)")
	capacity := fs.Bool("capacity", false, "search each policy's highest rate (regimes: --rate; traces: --speed) with TTFT p99 under --slo and no failed request; seeds added up to --seeds (at most 10) until kv / best other is known within 3%")
	maxProbes := fs.Int("max-probes", 10, "--capacity: probes per policy and seed at most")
	slo := fs.Duration("slo", 2*time.Second, "--capacity: TTFT p99 bound in trace time (wall time x --sim-time-scale)")
	underTest := fs.String("under-test", "kv", "the policy under test: the table ends with its per-seed ratio to the best other policy of each seed (TTFT p90, p99: lowest; cached ratio: highest), mean and 95% t-interval; --capacity reports its capacity ratio")
	ratioHW := fs.Float64("ratio-halfwidth", 0, "adaptive seeds (0 = off): run seeds one at a time from --first-seed, up to --seeds (at most 10), and stop once the --under-test policy's TTFT p90 and p99 ratios to the best other both have a relative half-width under this (0.03: 3%), which takes at least 3 seeds")
	logDir := fs.String("log-dir", "", "keep process logs here (default: a temporary directory, removed unless a run fails)")
	var externals []replay.External
	fs.Func("router-url", "an external OpenAI-compatible router, NAME=URL[;admin=URL] (repeatable): replayed beside the policies, on engines kvbench keeps for it (their list is printed and written to --engines-out), as column NAME; admin= names a kvrouter's admin listener, whose accuracy counters are read", func(v string) error {
		x, err := parseExternal(v, false)
		externals = append(externals, x)
		return err
	})
	fs.Func("ext-proc", "an external endpoint picker's ext_proc address, NAME=HOST:PORT[;admin=URL] (repeatable): kvbench plays the gateway (kvroutectl epp-check's client), forwarding each request to the endpoint picked, as column NAME", func(v string) error {
		x, err := parseExternal(v, true)
		externals = append(externals, x)
		return err
	})
	enginePorts := fs.Int("engine-ports", 0, "with --router-url or --ext-proc: the kept engines' base port, so a router can be configured before kvbench starts (engine i: HTTP BASE+i, KV events BASE+1000+i x DP ranks, replay BASE+2000+i x DP ranks); 0: the kernel picks, and the router is configured from --engines-out")
	enginesOut := fs.String("engines-out", "", "with --router-url or --ext-proc: write the kept engines here as kvrouter's engines file (--engines-file), their endpoints and KV-event addresses in comments")
	externalReady := fs.Duration("external-ready-timeout", 2*time.Minute, "with --router-url or --ext-proc: how long each external router has to serve 2 probe requests per engine in a row before its run")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvbench replay (--trace FILE|DIR | --regime NAME) [flags]\n\n"+
			"Replays a workload live through vllm-sim engines and kvrouter processes on this machine, once\n"+
			"per policy and seed, and prints TTFT and cached share per policy.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments %q", fs.Args())
	}
	if (*trace == "") == (*regime == "") {
		return usagef("give exactly one of --trace and --regime")
	}
	if *speed <= 0 || *tpb < 1 || *firstSeed < 1 || *timeScale <= 0 || *replicas < 1 || *routers < 1 || *seeds < 1 || *conc < 1 || *maxProbes < 1 || *rate <= 0 || *outScale < 0 || *blockSize < 1 {
		return usagef("--speed, --rate, --sim-time-scale must be > 0; --replicas, --routers, --seeds, --first-seed, --concurrency, --max-probes, --tokens-per-trace-block, --sim-block-size >= 1; --output-scale >= 0")
	}
	names := splitList(*policies)
	if len(names) == 0 {
		return usagef("--policies is empty")
	}
	if *warmReq < 0 || *warmReq > 0 && (*trace == "" || *offset < *warmReq) {
		return usagef("--warm-requests N needs --trace and --offset >= N (the warm-up is the N requests before the offset)")
	}
	if len(externals) > 0 && *capacity {
		return usagef("--router-url and --ext-proc are not for --capacity (replay them at a fixed rate beside the policies)")
	}
	if *enginePorts < 0 || *enginePorts > 0 && len(externals) == 0 || *enginesOut != "" && len(externals) == 0 {
		return usagef("--engine-ports (>= 0) and --engines-out are the engines of --router-url and --ext-proc; give one of those")
	}
	if *ratioHW < 0 || *ratioHW > 0 && (*seeds < 3 || *capacity) {
		return usagef("--ratio-halfwidth must be >= 0; it needs --seeds >= 3 (the most seeds it may run) and is not for --capacity (which stops at 3%%)")
	}
	for i, n := range names {
		base, events := replay.SplitPolicy(n)
		if _, err := reg.New(base, score.Options{}); err != nil {
			return usageError{err}
		}
		if *routerBin != "" && !slices.Contains(score.ProductionPolicies, base) {
			return fmt.Errorf("--kvrouter runs a kvrouter binary, which offers the production policies only; %s is kvbench's (leave --kvrouter out to serve it with kvbench's router)", base)
		}
		if events && !*routerEvents {
			names[i] = n + replay.NoEventsSuffix
		}
	}
	// The policy under test by its label: with --router-events=false kv runs as kv:no-events.
	if !slices.Contains(names, *underTest) && slices.Contains(names, *underTest+replay.NoEventsSuffix) {
		*underTest += replay.NoEventsSuffix
	}
	if *ratioHW > 0 && (!slices.Contains(names, *underTest) || len(names) < 2) {
		return usagef("--ratio-halfwidth needs the policy under test (--under-test %s) and another policy in --policies", *underTest)
	}
	o := replay.Options{Replicas: *replicas, Routers: *routers, BlockSize: *blockSize, Policies: names, Seeds: *seeds, FirstSeed: *firstSeed, Concurrency: *conc,
		Tokens: replay.Tokenizer{PerBlock: *tpb}, OutputScale: *outScale, MaxOutputTokens: *maxOut,
		Jitter: *jitter, Model: "vllm-sim", Progress: stderr}
	if o.OutputScale == 0 {
		o.OutputScale = float64(*tpb) / fleet.TraceBlockTokens
	}
	if *prefill == 0 {
		*prefill = 20000 * float64(*tpb) / fleet.TraceBlockTokens
	}
	if *blocks == 0 {
		*blocks = 600*(*tpb) / *blockSize + 1
	}
	steps, err := simStepArgs(*stepModel, *prefill, *decode, *timeScale, *tpb)
	if err != nil {
		return usageError{err}
	}
	o.SimArgs = append(steps, "--headers-at-acceptance="+strconv.FormatBool(*atAcceptance), "--block-size", strconv.Itoa(*blockSize),
		"--num-gpu-blocks", strconv.Itoa(*blocks), "--max-num-seqs", strconv.Itoa(*seqs),
		"--data-parallel-size", strconv.Itoa(*dp), "--max-model-len", "1048576", "--engine-kind", *engineKind)
	o.RouterArgs = append(o.RouterArgs, "--engine-kind", *engineKind)
	if o.SimBin, o.RouterBin, o.RouterPrefix, err = findBinaries(*binDir, *simBin, *routerBin); err != nil {
		return err
	}

	if *capacity {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		d := capacityDefaults(given, *trace != "", *replicas, *seqs, *dp)
		if d.Concurrency > 0 {
			*conc = d.Concurrency
			o.Concurrency = *conc
		}
		if d.SetMaxRequests {
			*maxReq = d.MaxRequests
		}
		if d.SetDuration {
			*duration = d.Duration
		}
		// As a replay's: a temporary directory unless --log-dir names one, removed when the search
		// ends without an error (it holds every probe's engine and router logs).
		keep := *logDir != ""
		if !keep {
			if *logDir, err = os.MkdirTemp("", "kvbench-capacity-"); err != nil {
				return err
			}
		}
		o.LogDir = *logDir
		err = runCapacity(o, *trace, *regime, *offset, *warmReq, *maxReq, *duration, *speed, *rate, *replicas, *warmup,
			replay.CapacityOptions{Policy: *underTest, SLO: slo.Seconds(), TimeScale: *timeScale, MaxSeeds: *seeds,
				Target: 0.03, Precision: 0.05, MaxProbes: *maxProbes}, *asJSON, stdout, stderr)
		if err == nil && !keep {
			os.RemoveAll(o.LogDir)
		}
		return err
	}
	var w replay.Workload
	if *trace != "" {
		tr, err := fleet.LoadTrace(*trace)
		if err != nil {
			return err
		}
		if w, err = replay.TraceSlice(tr, *offset, *maxReq, *speed, *duration); err != nil {
			return err
		}
		if w.Warm, err = replay.WarmSlice(tr, *offset, *warmReq, *speed); err != nil {
			return err
		}
		w.Name = filepath.Base(*trace)
	} else {
		n := *maxReq
		if n <= 0 {
			n = 160
		}
		if *duration > 0 {
			n = min(n, max(int(duration.Seconds()**rate), 1))
		}
		if w, err = replay.Regime(*regime, replay.RegimeOptions{Requests: n, Rate: *rate, Replicas: *replicas, Warmup: *warmup}); err != nil {
			return err
		}
	}

	keep := *logDir != ""
	if !keep {
		if *logDir, err = os.MkdirTemp("", "kvbench-replay-"); err != nil {
			return err
		}
	}
	o.LogDir = *logDir
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(externals) > 0 {
		o.External, o.ExternalReady = externals, *externalReady
		eng, err := startExternalEngines(ctx, o, *enginePorts, *dp, w.Adapters, *enginesOut, stderr)
		if err != nil {
			return err
		}
		defer eng.Stop()
		o.Engines = eng
	}
	warmed := ""
	if len(w.Warm) > 0 {
		warmed = fmt.Sprintf(" after %d warm-up requests", len(w.Warm))
	}
	fmt.Fprintf(stderr, "replay: %s, %d requests over %.1fs%s, %d replicas, %d routers, %d policies%s x %d seeds; logs in %s\n",
		w.Name, len(w.Requests), w.Span().Seconds(), warmed, *replicas, *routers, len(names), externalCount(externals), *seeds, o.LogDir)
	runs, err := replayRuns(ctx, o, w, *underTest, *ratioHW, replay.Replay, stderr)
	if err != nil {
		return fmt.Errorf("%w (logs kept in %s)", err, o.LogDir)
	}
	if !keep {
		os.RemoveAll(o.LogDir)
	}
	out := replayOutput{Workload: w.Name, Replicas: *replicas, Routers: *routers, Seeds: seedsRun(runs), Requests: len(w.Requests),
		Interval: "mean over seeds of each per-seed figure, 95% Student-t interval", Results: replay.Summarize(runs),
		EventsRatios: replay.EventsRatios(runs), BestOther: replay.PolicyRatios(runs, *underTest), RatioHalfWidth: *ratioHW, Runs: runs}
	if *outcomes != "" {
		if err := writeOutcomes(*outcomes, runs); err != nil {
			return err
		}
	}
	if *report != "" {
		if err := writeReplayReport(*report, &out, "kvbench replay "+strings.Join(args, " ")); err != nil {
			return err
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return writeReplayTable(stdout, &out)
}

// replayRuns runs the replay: every seed at once, or, with a half-width target (adaptive seeds),
// one seed at a time (all policies interleaved within it, as replay.Replay does) until the policy
// under test's TTFT p90 and p99 ratios to the best other are that tight or o.Seeds (at most 10)
// have run. play is replay.Replay (a test's fake elsewhere).
func replayRuns(ctx context.Context, o replay.Options, w replay.Workload, underTest string, halfWidth float64,
	play func(context.Context, replay.Options, replay.Workload) ([]*replay.RunResult, error), stderr io.Writer) ([]*replay.RunResult, error) {
	if halfWidth <= 0 {
		return play(ctx, o, w)
	}
	maxSeeds, first := min(o.Seeds, 10), max(o.FirstSeed, 1)
	var runs []*replay.RunResult
	for seed := first; seed < first+maxSeeds; seed++ {
		o.FirstSeed, o.Seeds = seed, 1
		rs, err := play(ctx, o, w)
		runs = append(runs, rs...)
		if err != nil {
			return runs, err
		}
		ratios := replay.PolicyRatios(runs, underTest)
		for _, b := range ratios[:2] {
			fmt.Fprintf(stderr, "replay: after seed %d: %s\n", seed, ratioLine(b))
		}
		if replay.TTFTRatiosSettled(ratios, maxSeeds, halfWidth) {
			break
		}
	}
	return runs, nil
}

// seedsRun counts the distinct seeds among the runs.
func seedsRun(runs []*replay.RunResult) int {
	seen := map[int]bool{}
	for _, r := range runs {
		seen[r.Seed] = true
	}
	return len(seen)
}

// ratioLine prints a policy's ratio to the best other policy of each seed.
func ratioLine(b replay.BestOtherRatio) string {
	best := "lowest"
	if b.Metric == "cached_ratio" {
		best = "highest"
	}
	if b.Ratio.N == 0 {
		return fmt.Sprintf("%s / best other (%s), %s: no seed has a ratio (no other policy measured above 0, or %s had no successful request)",
			b.Policy, best, b.Metric, b.Policy)
	}
	hw := "n/a (under 3 seeds)"
	if b.HalfWidth != nil {
		hw = fmt.Sprintf("%.1f%%", 100**b.HalfWidth)
	}
	per := make([]string, len(b.PerSeed))
	for i, r := range b.PerSeed {
		per[i] = "-"
		if r != nil {
			per[i] = fmt.Sprintf("%.3f", *r)
		}
	}
	return fmt.Sprintf("%s / best other (%s), %s: %s over %d seeds, relative half-width %s; per seed [%s], best other per seed %v",
		b.Policy, best, b.Metric, ci(b.Ratio, 3), b.Ratio.N, hw, strings.Join(per, " "), b.BestOther)
}

// defaultSimStepModel is vllm-sim's default step model (vllmsim.DefaultStepModel; a test keeps
// them equal), so a replay's engines time steps as a vllm-sim started by hand would.
const defaultSimStepModel = "vllm-0.20.1-b300"

// stepModelTokensPerS are vllm-sim's calibrated models' compute-bound prefill rates by name,
// aliases included (vllmsim.StepModelTokensPerS; a test keeps them equal without linking the
// simulator into kvbench).
var stepModelTokensPerS = map[string]float64{
	"vllm-0.20.1-b300": 1000 / 0.044371,
	"splitwise-h100":   1000 / 0.14356,
	"calibrated":       1000 / 0.14356,
}

// simStepArgs are the engines' step-model flags. Every model keeps a prompt's prefill
// trace-equivalent at prefillPerS (tokens of the shrunk prompt per second): flat by that rate,
// a calibrated one by reading each token as 512/tokensPerBlock model tokens (--step-token-scale)
// and scaling time so its compute-bound rate is prefillPerS, so a regime's load stays where it
// was chosen and what differs between models is the shape of a step's cost (README of
// sim/vllmsim, Timing model).
func simStepArgs(model string, prefillPerS, decodeMs, timeScale float64, tokensPerBlock int) ([]string, error) {
	if model == "flat" {
		return []string{"--step-model", "flat", "--prefill-tokens-per-s", fmtF(prefillPerS),
			"--decode-ms-per-token", fmtF(decodeMs), "--time-scale", fmtF(timeScale)}, nil
	}
	rate, ok := stepModelTokensPerS[model]
	if !ok {
		return nil, fmt.Errorf("--sim-step-model must be vllm-0.20.1-b300, splitwise-h100 (or calibrated) or flat, got %q", model)
	}
	tokenScale := float64(fleet.TraceBlockTokens) / float64(tokensPerBlock)
	return []string{"--step-model", model, "--step-token-scale", fmtF(tokenScale),
		"--time-scale", fmtF(timeScale * prefillPerS * tokenScale / rate)}, nil
}

// findBinaries looks for vllm-sim: --vllm-sim, then --bin-dir, then the directory kvbench runs
// from, then ./bin. The routers are routerBin when given (a kvrouter binary), else this kvbench's
// hidden router subcommand (router.go), which serves every policy, the benchmark ones too, with
// kvrouter's code: both sides of a comparison run the same router.
func findBinaries(dir, simBin, routerBin string) (sim, router string, routerPrefix []string, err error) {
	var dirs []string
	if dir != "" {
		dirs = []string{dir}
	} else {
		if exe, err := os.Executable(); err == nil {
			dirs = append(dirs, filepath.Dir(exe))
		}
		dirs = append(dirs, "bin")
	}
	find := func(explicit, name string) (string, error) {
		if explicit != "" {
			return explicit, nil
		}
		for _, d := range dirs {
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p, nil
			}
		}
		return "", fmt.Errorf("no %s binary in %s (make build, or --%s PATH)", name, strings.Join(dirs, ", "), name)
	}
	if sim, err = find(simBin, "vllm-sim"); err != nil {
		return "", "", nil, err
	}
	if routerBin != "" {
		return sim, routerBin, nil, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", "", nil, fmt.Errorf("kvbench's own binary, to run its router: %w", err)
	}
	return sim, self, []string{"router"}, nil
}

func fmtF(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// ci prints an interval as mean [lo,hi] (t-interval) or mean [min..max] (two seeds); "-" when
// nothing was measured.
func ci(iv replay.Interval, digits int) string {
	if math.IsNaN(iv.Mean) {
		return "-"
	}
	f := "%." + strconv.Itoa(digits) + "f"
	if iv.N < 2 {
		return fmt.Sprintf(f, iv.Mean)
	}
	if iv.Range {
		return fmt.Sprintf(f+" ["+f+".."+f+"]", iv.Mean, iv.Lo, iv.Hi)
	}
	return fmt.Sprintf(f+" ["+f+","+f+"]", iv.Mean, iv.Lo, iv.Hi)
}

func writeReplayTable(w io.Writer, out *replayOutput) error {
	spread := "mean [95% t-interval over seeds]"
	switch {
	case out.Seeds == 2:
		spread = "mean [min..max of the 2 seeds; 3 or more give a t-interval]"
	case out.Seeds < 2:
		spread = "one seed: no spread"
	}
	routers := ""
	if out.Routers > 1 {
		routers = fmt.Sprintf(", %d routers", out.Routers)
	}
	fmt.Fprintf(w, "%s: %d requests, %d replicas%s, %d seeds; %s\n",
		out.Workload, out.Requests, out.Replicas, routers, out.Seeds, spread)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	scale := false
	for _, r := range out.Results {
		scale = scale || r.NewShareOfFair != nil
	}
	head := "policy\tttft_p50_s\tttft_p90_s\tttft_p99_s\te2e_p90_s\treq_per_s\tcached\tmax_share\terrors"
	if scale {
		head += "\tnew_share_of_fair\thit_drop"
	}
	fmt.Fprintln(tw, head+"\t")
	for _, r := range out.Results {
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d", r.Policy, ci(r.TTFTP50, 3), ci(r.TTFTP90, 3), ci(r.TTFTP99, 3),
			ci(r.E2EP90, 2), ci(r.Throughput, 1), ci(r.CachedRatio, 2), ci(r.MaxEngineShare, 2), r.Errors)
		if scale && r.NewShareOfFair != nil {
			line += "\t" + ci(*r.NewShareOfFair, 2) + "\t" + ci(*r.HitDrop, 2)
		}
		fmt.Fprintln(tw, line+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range out.Results {
		for _, e := range r.FirstErrors {
			fmt.Fprintf(w, "  %s error: %s\n", r.Policy, e)
		}
	}
	for _, r := range out.Results {
		// Arrivals that waited on earlier completions: the policies did not see the same
		// traffic (a policy whose requests finish together lets the next ones in together).
		if r.Held > 0 {
			fmt.Fprintf(w, "  %s: %d of %d requests waited for --concurrency: closed-loop, its arrivals were not the workload's (raise --concurrency)\n",
				r.Policy, r.Held, r.Requests*r.Seeds)
		}
	}
	writeExternalLines(w, out)
	for _, b := range out.BestOther {
		fmt.Fprintf(w, "%s\n", ratioLine(b))
	}
	writeSyncLines(w, out)
	writeEventsLines(w, out)
	return nil
}

// writeEventsLines says which policies ran without KV events, prints each policy's accuracy
// counters per scoring mode (predicted over actual cached tokens, summed over seeds), and, for
// a policy run both ways, the per-seed ratios with events / without.
func writeEventsLines(w io.Writer, out *replayOutput) {
	for _, r := range out.Results {
		if !r.RouterEvents {
			fmt.Fprintf(w, "  %s: routers ran with --no-events: every replica scored from the approximate index\n", r.Policy)
		}
	}
	for _, r := range out.Results {
		if len(r.Accuracy) == 0 {
			continue
		}
		var parts []string
		for _, m := range replay.ModeNames(r.Accuracy) {
			a := r.Accuracy[m]
			if a.Prompt == 0 {
				continue
			}
			pa := "-"
			if a.Actual > 0 {
				pa = fmt.Sprintf("%.2f", a.Predicted/a.Actual)
			}
			parts = append(parts, fmt.Sprintf("%s %.0f%% of prompt tokens, predicted %.3f / actual %.3f cached (x%s)",
				m, 100*a.Prompt/totalPrompt(r.Accuracy), a.Predicted/a.Prompt, a.Actual/a.Prompt, pa))
		}
		if len(parts) > 0 {
			fmt.Fprintf(w, "  %s accuracy by scoring mode: %s\n", r.Policy, strings.Join(parts, "; "))
		}
	}
	for _, e := range out.EventsRatios {
		fmt.Fprintf(w, "  %s / %s%s per seed (%d seeds): cached %s, ttft p50 %s, ttft p90 %s\n", e.Policy, e.Policy, replay.NoEventsSuffix,
			len(e.Seeds), ci(e.CachedCI, 3), ci(e.TTFTP50CI, 3), ci(e.TTFTP90CI, 3))
	}
}

func totalPrompt(m map[string]replay.ModeTokens) float64 {
	t := 0.0
	for _, a := range m {
		t += a.Prompt
	}
	return t
}

// writeSyncLines sums, per policy over its runs, what the routers' load sync cost: bytes every
// router published per request replayed, the mean lag, and the peers each router saw at the
// end (a run where one saw fewer than the others is a cluster that did not hold).
func writeSyncLines(w io.Writer, out *replayOutput) {
	for _, pol := range out.Results {
		var bytes, lagSum, lost, dropped float64
		var requests, lagN, fewest int
		fewest = math.MaxInt
		for _, r := range out.Runs {
			if r.Policy != pol.Policy || len(r.RouterSync) == 0 {
				continue
			}
			requests += len(r.Outcomes)
			for _, s := range r.RouterSync {
				bytes += s.SentBytes
				lost += s.LostBatches
				dropped += s.Dropped
				fewest = min(fewest, s.Peers)
				if s.MeanLagMs > 0 {
					lagSum += s.MeanLagMs
					lagN++
				}
			}
		}
		if requests == 0 {
			continue
		}
		lag := "-"
		if lagN > 0 {
			lag = fmt.Sprintf("%.1f ms", lagSum/float64(lagN))
		}
		fmt.Fprintf(w, "  %s load sync: %.0f bytes published per request (all routers), mean lag %s, fewest peers seen %d, %.0f lost batches, %.0f dropped changes\n",
			pol.Policy, bytes/float64(requests), lag, fewest, lost, dropped)
	}
}

// writeReplayReport writes index.html with the table, TTFT CDFs (all seeds pooled), cached
// ratio per policy and requests per engine over time, with the SVG helpers of report.go.
func writeReplayReport(dir string, out *replayOutput, cmdline string) error {
	if err := mkdir(dir); err != nil {
		return err
	}
	esc := html.EscapeString
	var b strings.Builder
	fmt.Fprintf(&b, "<!doctype html><html><head><meta charset=\"utf-8\"><title>kvbench replay: %s</title>"+
		"<style>body{font-family:sans-serif;margin:2em}code{background:#f4f4f4;padding:2px}</style></head><body>", esc(out.Workload))
	fmt.Fprintf(&b, "<h1>kvbench replay — %s</h1><p>%d vllm-sim engines, %d requests per run, %d seeds; live processes on loopback.</p>",
		esc(out.Workload), out.Replicas, out.Requests, out.Seeds)
	fmt.Fprintf(&b, "<p>Command: <code>%s</code></p><h2>Results</h2>", esc(cmdline))
	var tb strings.Builder
	_ = writeReplayTable(&tb, out)
	b.WriteString("<pre>" + esc(tb.String()) + "</pre>")

	var cdf, share []series
	for _, pol := range out.Results {
		var ttfts []float64
		for _, r := range out.Runs {
			if r.Policy != pol.Policy {
				continue
			}
			for _, o := range r.Outcomes {
				if o.Err == "" {
					ttfts = append(ttfts, o.TTFT)
				}
			}
		}
		sort.Float64s(ttfts)
		s := series{name: pol.Policy}
		step := max(len(ttfts)/400, 1)
		for i := 0; i < len(ttfts); i += step {
			s.xs, s.ys = append(s.xs, ttfts[i]), append(s.ys, float64(i+1)/float64(len(ttfts)))
		}
		cdf = append(cdf, s)
		share = append(share, series{name: pol.Policy, xs: []float64{0, 1}, ys: []float64{pol.CachedRatio.Mean, pol.CachedRatio.Mean}})
	}
	b.WriteString("<h2>TTFT CDF (all seeds)</h2>")
	b.WriteString(linePlot(cdf, "TTFT (s, log scale)", "share of requests", true))
	b.WriteString("<h2>Cached-token ratio per policy (mean over seeds)</h2><ul>")
	for _, s := range share {
		fmt.Fprintf(&b, "<li>%s: %.3f</li>", esc(s.name), s.ys[0])
	}
	b.WriteString("</ul>")
	for _, r := range out.Runs {
		if r.Seed != 1 {
			continue
		}
		fmt.Fprintf(&b, "<h2>Requests per engine over time: %s (seed 1)</h2>", esc(r.Policy))
		b.WriteString(linePlot(enginesOverTime(r), "second of the run", "requests started", false))
	}
	b.WriteString("</body></html>\n")
	return os.WriteFile(filepath.Join(dir, "index.html"), []byte(b.String()), 0o644)
}

// enginesOverTime counts requests started per engine per second of a run.
func enginesOverTime(r *replay.RunResult) []series {
	last := 0
	for _, o := range r.Outcomes {
		last = max(last, int(o.SentAt.Seconds()))
	}
	var out []series
	for k, name := range r.Engines {
		if k >= 16 {
			break
		}
		s := series{name: name, xs: make([]float64, last+1), ys: make([]float64, last+1)}
		for i := range s.xs {
			s.xs[i] = float64(i)
		}
		for _, o := range r.Outcomes {
			if o.Engine == name && o.Err == "" {
				s.ys[int(o.SentAt.Seconds())]++
			}
		}
		out = append(out, s)
	}
	return out
}

// capacityFlagDefaults are the replay flags --capacity sets differently when they are not given.
type capacityFlagDefaults struct {
	// Concurrency (0: keep the flag's) is the replay's cap on requests in flight.
	Concurrency int
	// MaxRequests and Duration replace the flags' values where Set*.
	SetMaxRequests bool
	MaxRequests    int
	SetDuration    bool
	Duration       time.Duration
}

// capacityDefaults are --capacity's defaults for the flags not in given (the flags set on the
// command line). A capacity is the engines' limit, so nothing in the replay may bind first:
//   - --concurrency: four times the engines' running slots (replicas x max-num-seqs x DP ranks),
//     so the engines' waiting queues, not the replay's cap, hold an overload (a request held by
//     the cap counts its wait in its TTFT, but the cap paces the sends, and 64 slots cap 8
//     engines of 32 at a quarter of theirs), while a runaway probe stays bounded;
//   - a regime sends --duration of arrivals at each probed rate, with no count cap: 200 requests
//     (the replay's default) at 400 req/s arrive in half a second, shorter than the SLO, and
//     every policy would pass hot-prefix at every rate the search doubles to;
//   - a trace replays its --max-requests whatever the speed (--duration 0): a wall-time bound
//     replays fewer of its requests at the slower probes.
func capacityDefaults(given map[string]bool, trace bool, replicas, maxNumSeqs, dpRanks int) capacityFlagDefaults {
	var d capacityFlagDefaults
	if !given["concurrency"] {
		d.Concurrency = max(64, 4*replicas*maxNumSeqs*max(dpRanks, 1))
	}
	switch {
	case trace && !given["duration"]:
		d.SetDuration, d.Duration = true, 0
	case !trace && !given["max-requests"]:
		d.SetMaxRequests, d.MaxRequests = true, 0
	}
	return d
}

// capacityRequests is how many requests a regime's probe at rate sends: duration's worth of
// arrivals (a sustained load), at most maxReq when it is > 0; with no duration, maxReq, or 160.
func capacityRequests(rate float64, duration time.Duration, maxReq int) int {
	if duration <= 0 {
		if maxReq > 0 {
			return maxReq
		}
		return 160
	}
	n := max(int(duration.Seconds()*rate), 1)
	if maxReq > 0 {
		n = min(n, maxReq)
	}
	return n
}

// runCapacity is `kvbench replay --capacity`: the workload is rebuilt at each probed rate (a
// regime's arrival rate, or a trace's replay speed).
func runCapacity(o replay.Options, trace, regime string, offset, warmReq, maxReq int, duration time.Duration, speed, rate float64,
	replicas int, warmup time.Duration, c replay.CapacityOptions, asJSON bool, stdout, stderr io.Writer) error {
	var tr *fleet.Trace
	c.Start = rate
	if trace != "" {
		var err error
		if tr, err = fleet.LoadTrace(trace); err != nil {
			return err
		}
		c.Start = speed
	}
	workload := func(r float64, seed int) (replay.Workload, error) {
		if tr != nil {
			w, err := replay.TraceSlice(tr, offset, maxReq, r, duration)
			if err != nil {
				return w, err
			}
			w.Warm, err = replay.WarmSlice(tr, offset, warmReq, r)
			return w, err
		}
		return replay.Regime(regime, replay.RegimeOptions{Requests: capacityRequests(r, duration, maxReq), Rate: r,
			Replicas: replicas, Warmup: warmup, Seed: uint64(seed)})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	warmed := ""
	if warmReq > 0 {
		warmed = fmt.Sprintf(", each probe after %d warm-up requests", warmReq)
	}
	fmt.Fprintf(stderr, "capacity: %d policies, up to %d seeds, SLO %.2fs trace time%s; logs in %s\n", len(o.Policies), c.MaxSeeds, c.SLO, warmed, o.LogDir)
	res, err := replay.Capacity(ctx, o, c, workload)
	if err != nil {
		return fmt.Errorf("%w (logs kept in %s)", err, o.LogDir)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	if err := writeCapacityTable(stdout, res, o.Policies, c); err != nil {
		return err
	}
	if tr != nil {
		// A trace's rate is a replay speed; say what speed 1 is, so a capacity reads as requests
		// per second of this traffic.
		w1, err := workload(1, 1)
		if err != nil {
			return err
		}
		per := math.NaN()
		if sp := w1.Span().Seconds(); sp > 0 {
			per = float64(len(w1.Requests)-1) / sp
		}
		fmt.Fprintf(stdout, "rates are replay speeds of the trace: speed 1 is its own arrivals, %d requests over %.1fs (%.2f req/s)\n",
			len(w1.Requests), w1.Span().Seconds(), per)
	}
	return nil
}

func writeCapacityTable(w io.Writer, res *replay.CapacityResult, policies []string, c replay.CapacityOptions) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tcapacity (mean, 95% CI)\tper seed\t")
	for _, p := range policies {
		fmt.Fprintf(tw, "%s\t%s\t%v\t\n", p, ci(res.CapacityMean[p], 3), res.Capacity[p])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	hw := "n/a (under 3 seeds)"
	if res.HalfWidth != nil {
		hw = fmt.Sprintf("%.1f%%", 100**res.HalfWidth)
	}
	fmt.Fprintf(w, "%s / best other: %s, relative half-width %s; best other per seed %v\n", c.Policy, ci(res.RatioCI, 3), hw, res.BestOther)
	host, invalid := 0.0, 0
	for _, p := range res.Probes {
		host = max(host, p.CPU.Host)
		if p.CPU.Invalid {
			invalid++
		}
	}
	fmt.Fprintf(w, "%d runs, %d invalid (host CPU over %.0f%%); highest host CPU %.0f%%\n", len(res.Probes), invalid, 100*replay.MaxHostCPU, 100*host)
	return nil
}

// outcomeLine is one request of one run in --outcomes.
type outcomeLine struct {
	Policy string `json:"policy"`
	Seed   int    `json:"seed"`
	replay.Outcome
}

// writeOutcomes writes every request of every run as a JSON line, in run order, then request
// order. The percentiles in the table are read from these.
func writeOutcomes(path string, runs []*replay.RunResult) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	for _, r := range runs {
		for _, o := range r.Outcomes {
			if err := enc.Encode(outcomeLine{Policy: r.Policy, Seed: r.Seed, Outcome: o}); err != nil {
				f.Close()
				return err
			}
		}
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// parseExternal reads --router-url NAME=URL[;admin=URL] or --ext-proc NAME=HOST:PORT[;admin=URL].
func parseExternal(v string, extProc bool) (replay.External, error) {
	flagName := "--router-url"
	if extProc {
		flagName = "--ext-proc"
	}
	spec, opts, _ := strings.Cut(v, ";")
	name, addr, ok := strings.Cut(spec, "=")
	name, addr = strings.TrimSpace(name), strings.TrimSpace(addr)
	if !ok || name == "" || addr == "" || strings.ContainsAny(name, " :/,") {
		return replay.External{}, fmt.Errorf("%s %q: want NAME=ADDRESS (a name without spaces, ':', '/' or ',')", flagName, v)
	}
	x := replay.External{Name: name}
	if extProc {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return x, fmt.Errorf("%s %s: the picker's address is HOST:PORT (%v)", flagName, name, err)
		}
		x.ExtProc = addr
	} else {
		u, err := url.Parse(addr)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return x, fmt.Errorf("%s %s: %q is not an http(s)://host:port URL", flagName, name, addr)
		}
		x.URL = addr
	}
	for _, o := range strings.Split(opts, ";") {
		if o = strings.TrimSpace(o); o == "" {
			continue
		}
		k, val, _ := strings.Cut(o, "=")
		if k != "admin" || !strings.HasPrefix(val, "http") {
			return x, fmt.Errorf("%s %s: unknown option %q (only admin=http://HOST:PORT, a kvrouter's admin listener)", flagName, name, o)
		}
		x.Admin = val
	}
	return x, nil
}

func externalCount(xs []replay.External) string {
	if len(xs) == 0 {
		return ""
	}
	return fmt.Sprintf(" and %d external routers", len(xs))
}

// startExternalEngines starts the engines the external routers front, for the whole replay,
// and tells the user where they are: the lines a router is configured with, on stderr and in
// the engines file (out, and the log directory's external-engines.txt).
func startExternalEngines(ctx context.Context, o replay.Options, basePort, ranks int, adapters []string, out string, stderr io.Writer) (*replay.Engines, error) {
	if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
		return nil, err
	}
	eng, err := replay.StartEngines(ctx, o, basePort, ranks, adapters)
	if err != nil {
		return nil, err
	}
	file := eng.File()
	paths := []string{filepath.Join(o.LogDir, "external-engines.txt")}
	if out != "" {
		paths = append(paths, out)
	}
	for _, p := range paths {
		if err := writeAtomic(p, []byte(file)); err != nil {
			eng.Stop()
			return nil, err
		}
	}
	fmt.Fprintf(stderr, "replay: the external routers front these %d engines (engines file %s; kvrouter: --engines-file it):\n%s",
		len(eng.Names), paths[len(paths)-1], file)
	return eng, nil
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// writeExternalLines says what ran behind each external router's name.
func writeExternalLines(w io.Writer, out *replayOutput) {
	for _, pol := range out.Results {
		i := slices.IndexFunc(out.Runs, func(r *replay.RunResult) bool { return r.Policy == pol.Policy && r.External != "" })
		if i < 0 {
			continue
		}
		unknown := ""
		if math.IsNaN(pol.MaxEngineShare.Mean) {
			unknown = "; max_share -: it does not say which engine served (kvrouter's x-kvroute-engine)"
		}
		fmt.Fprintf(w, "  %s: external %s, on the engines kvbench kept for the external routers (reset between runs)%s\n",
			pol.Policy, out.Runs[i].External, unknown)
	}
}
