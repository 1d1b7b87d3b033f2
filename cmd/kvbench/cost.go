package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/kvroute/kvroute/sim/routercost"
)

// runCost is `kvbench cost`: what the real kvrouter binary costs a request (sim/routercost).
func runCost(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench cost", flag.ContinueOnError)
	fs.SetOutput(stderr)
	binDir := fs.String("bin-dir", "", "directory holding vllm-sim and kvrouter (default: next to kvbench, then bin/)")
	simBin := fs.String("vllm-sim", "", "vllm-sim binary")
	var routers []string
	fs.Func("kvrouter", "kvrouter binary, or NAME=PATH to compare several builds in one run (repeatable; default kvrouter from --bin-dir)", func(s string) error {
		routers = append(routers, s)
		return nil
	})
	policies := fs.String("policies", "kv,round-robin", "kvrouter --policy values, comma-separated, each measured")
	modes := fs.String("modes", "proxy,picker", "how the router fronts the engine, comma-separated, each measured: proxy (its OpenAI listener) and picker (an endpoint picker, --ext-proc-listen, kvbench playing the gateway as kvroutectl epp-check does)")
	rounds := fs.Int("rounds", 1, "measure every router and policy this many times, interleaved; figures are the median and range")
	cpuSizes := fs.String("cpu-sizes", "2048,4096,32768,102400", "prompt tokens of the CPU-per-request measurement (empty: skip)")
	cpuRequests := fs.Int("cpu-requests", 40, "sequential requests per CPU size")
	ttftSizes := fs.String("ttft-sizes", "4096,32768,102400", "prompt tokens of the added-TTFT measurement (empty: skip)")
	ttftPairs := fs.Int("ttft-pairs", 20, "direct/routed request pairs per TTFT size")
	streams := fs.Int("streams", 200, "concurrent streams of the throughput measurement (0: skip)")
	streamTokens := fs.Int("stream-tokens", 2048, "prompt tokens of each concurrent stream")
	streamRequests := fs.Int("stream-requests", 2000, "requests per side (direct, routed) of the throughput measurement")
	maxTokens := fs.Int("max-tokens", 16, "output tokens of every request")
	logDir := fs.String("log-dir", "", "keep the processes' logs here (default: a temporary directory, removed unless the run fails)")
	asJSON := fs.Bool("json", false, "print every measurement as JSON instead of the table")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	o := routercost.Options{Rounds: *rounds, CPURequests: *cpuRequests, TTFTPairs: *ttftPairs, Streams: *streams,
		StreamTokens: *streamTokens, StreamRequests: *streamRequests, MaxTokens: *maxTokens, Progress: stderr}
	var err error
	if o.CPUSizes, err = intList("--cpu-sizes", *cpuSizes); err != nil {
		return err
	}
	if o.TTFTSizes, err = intList("--ttft-sizes", *ttftSizes); err != nil {
		return err
	}
	for _, p := range strings.Split(*policies, ",") {
		if p = strings.TrimSpace(p); p != "" {
			o.Policies = append(o.Policies, p)
		}
	}
	if len(o.Policies) == 0 {
		return usagef("--policies: name at least one policy")
	}
	for _, m := range strings.Split(*modes, ",") {
		switch m = strings.TrimSpace(m); m {
		case "":
		case routercost.ModeProxy, routercost.ModePicker:
			if !slices.Contains(o.Modes, m) {
				o.Modes = append(o.Modes, m)
			}
		default:
			return usagef("--modes: %q is neither proxy nor picker", m)
		}
	}
	if len(o.Modes) == 0 {
		return usagef("--modes: name proxy, picker or both")
	}
	if *rounds < 1 || *cpuRequests < 0 || *ttftPairs < 0 || *streams < 0 || *streamRequests < 0 || *maxTokens < 1 || *streamTokens < 1 {
		return usagef("--rounds and --max-tokens must be at least 1; counts must not be negative")
	}
	if o.SimBin, o.Routers, err = costBinaries(*binDir, *simBin, routers); err != nil {
		return usageError{err}
	}
	o.Dir = *logDir
	keep := o.Dir != ""
	if !keep {
		if o.Dir, err = os.MkdirTemp("", "kvbench-cost-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	figs, err := routercost.Run(ctx, o)
	if err != nil {
		return fmt.Errorf("%w\n(logs kept in %s)", err, o.Dir)
	}
	if !keep {
		_ = os.RemoveAll(o.Dir)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(figs)
	}
	return writeCostTable(stdout, figs)
}

func intList(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, usagef("%s: %q is not a positive token count", flagName, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// costBinaries finds vllm-sim and the kvrouter builds: given paths first, then --bin-dir, else
// the directory kvbench runs from, then ./bin.
func costBinaries(dir, simBin string, routers []string) (string, []routercost.Router, error) {
	dirs := []string{dir}
	if dir == "" {
		dirs = nil
		if exe, err := os.Executable(); err == nil {
			dirs = append(dirs, filepath.Dir(exe))
		}
		dirs = append(dirs, "bin")
	}
	find := func(name string) (string, error) {
		for _, d := range dirs {
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p, nil
			}
		}
		return "", fmt.Errorf("no %s binary in %s (make build, or --%s PATH)", name, strings.Join(dirs, ", "), name)
	}
	sim := simBin
	if sim == "" {
		var err error
		if sim, err = find("vllm-sim"); err != nil {
			return "", nil, err
		}
	}
	if len(routers) == 0 {
		p, err := find("kvrouter")
		if err != nil {
			return "", nil, err
		}
		return sim, []routercost.Router{{Name: "kvrouter", Bin: p}}, nil
	}
	var out []routercost.Router
	for i, r := range routers {
		name, path, ok := strings.Cut(r, "=")
		if !ok {
			name, path = "kvrouter", r
			if len(routers) > 1 {
				name = "kvrouter-" + strconv.Itoa(i+1)
			}
		}
		if slices.ContainsFunc(out, func(x routercost.Router) bool { return x.Name == name }) {
			return "", nil, fmt.Errorf("--kvrouter: name %q given twice", name)
		}
		out = append(out, routercost.Router{Name: name, Bin: path})
	}
	return sim, out, nil
}

// costRow is one router, policy and mode's figures over every round.
type costRow struct {
	router, policy, mode string
	figs                 []routercost.Figures
}

func costRows(figs []routercost.Figures) []*costRow {
	var rows []*costRow
	for _, f := range figs {
		i := slices.IndexFunc(rows, func(r *costRow) bool { return r.router == f.Router && r.policy == f.Policy && r.mode == f.Mode })
		if i < 0 {
			rows = append(rows, &costRow{router: f.Router, policy: f.Policy, mode: f.Mode})
			i = len(rows) - 1
		}
		rows[i].figs = append(rows[i].figs, f)
	}
	return rows
}

// spread is the median of xs and, over more than one round, its range.
func spread(xs []float64, digits int) string {
	if len(xs) == 0 {
		return "-"
	}
	s := slices.Sorted(slices.Values(xs))
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', digits, 64) }
	if len(s) == 1 {
		return f(med)
	}
	return f(med) + " [" + f(s[0]) + ", " + f(s[len(s)-1]) + "]"
}

func writeCostTable(w io.Writer, figs []routercost.Figures) error {
	rows := costRows(figs)
	if len(rows) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	first := rows[0].figs[0]
	if len(first.CPU) > 0 {
		fmt.Fprintln(tw, "router CPU per streamed request, ms (render included; picker mode: the picker's process, the gateway's forwarding not included; median [min, max] over rounds)")
		hdr := "router\tpolicy\tmode"
		for _, c := range first.CPU {
			hdr += fmt.Sprintf("\t%d tok", c.PromptTokens)
		}
		fmt.Fprintln(tw, hdr+"\tidle share\tengine at largest")
		for _, r := range rows {
			line := r.router + "\t" + r.policy + "\t" + r.mode
			var idle, engine []float64
			for i := range first.CPU {
				var xs []float64
				for _, f := range r.figs {
					if i < len(f.CPU) {
						xs = append(xs, f.CPU[i].RouterMs)
						if i == len(first.CPU)-1 {
							idle = append(idle, f.CPU[i].RouterIdleMs/max(f.CPU[i].RouterMs, 1e-9))
							engine = append(engine, f.CPU[i].EngineMs)
						}
					}
				}
				line += "\t" + spread(xs, 2)
			}
			fmt.Fprintln(tw, line+"\t"+spread(idle, 2)+"\t"+spread(engine, 1))
		}
		fmt.Fprintln(tw)
	}
	if len(first.TTFT) > 0 {
		fmt.Fprintln(tw, "router-added TTFT, ms (routed minus direct, alternating pairs: p50 / p90; picker mode: as the gateway's client sees it)")
		hdr := "router\tpolicy\tmode"
		for _, t := range first.TTFT {
			hdr += fmt.Sprintf("\t%d tok p50\tp90\tdirect p50", t.PromptTokens)
		}
		fmt.Fprintln(tw, hdr)
		for _, r := range rows {
			line := r.router + "\t" + r.policy + "\t" + r.mode
			for i := range first.TTFT {
				var p50, p90, direct []float64
				for _, f := range r.figs {
					if i < len(f.TTFT) {
						p50, p90, direct = append(p50, f.TTFT[i].AddedP50Ms), append(p90, f.TTFT[i].AddedP90Ms), append(direct, f.TTFT[i].DirectP50Ms)
					}
				}
				line += "\t" + spread(p50, 1) + "\t" + spread(p90, 1) + "\t" + spread(direct, 1)
			}
			fmt.Fprintln(tw, line)
		}
		fmt.Fprintln(tw)
	}
	writePickTable(tw, rows, first)
	if first.Streams != nil {
		s := first.Streams
		fmt.Fprintf(tw, "%d concurrent streams of %d tokens, %d requests a side\n", s.Streams, s.PromptTokens, s.Requests)
		fmt.Fprintln(tw, "router\tpolicy\tmode\trouted/direct req/s\tdirect req/s\tadded TTFT p50 ms\tdirect TTFT p50 ms\tfailed")
		for _, r := range rows {
			var ratio, drps, added, dp50, failed []float64
			for _, f := range r.figs {
				if f.Streams != nil {
					ratio, drps = append(ratio, f.Streams.Ratio), append(drps, f.Streams.DirectRPS)
					added, dp50 = append(added, f.Streams.AddedP50Ms), append(dp50, f.Streams.DirectP50Ms)
					failed = append(failed, float64(f.Streams.Failed))
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.router, r.policy, r.mode, spread(ratio, 3), spread(drps, 0),
				spread(added, 1), spread(dp50, 1), spread(failed, 0))
		}
	}
	return tw.Flush()
}

// writePickTable is the picker's ext_proc round trip (request headers sent to pick received)
// per prompt size, for the rows measured in picker mode.
func writePickTable(tw *tabwriter.Writer, rows []*costRow, first routercost.Figures) {
	if !slices.ContainsFunc(rows, func(r *costRow) bool { return r.mode == routercost.ModePicker }) || len(first.TTFT) == 0 {
		return
	}
	fmt.Fprintln(tw, "picker round trip, ms (ext_proc: request headers sent to pick received, the body's pieces between; p50 / p90)")
	hdr := "router\tpolicy"
	for _, t := range first.TTFT {
		hdr += fmt.Sprintf("\t%d tok p50\tp90", t.PromptTokens)
	}
	fmt.Fprintln(tw, hdr)
	for _, r := range rows {
		if r.mode != routercost.ModePicker {
			continue
		}
		line := r.router + "\t" + r.policy
		for i := range first.TTFT {
			var p50, p90 []float64
			for _, f := range r.figs {
				if i < len(f.TTFT) {
					p50, p90 = append(p50, f.TTFT[i].PickP50Ms), append(p90, f.TTFT[i].PickP90Ms)
				}
			}
			line += "\t" + spread(p50, 2) + "\t" + spread(p90, 2)
		}
		fmt.Fprintln(tw, line)
	}
	fmt.Fprintln(tw)
}
