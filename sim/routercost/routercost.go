// Package routercost measures what the router itself costs a request: its CPU time per request,
// the time it adds to the first token, and the throughput it keeps of going direct, through the
// real kvrouter binary in front of one vllm-sim engine over loopback (kvbench cost).
//
// Every prompt is text no earlier request sent, so the router renders it through the engine
// (its render cache and the engine's prefix cache never hit) and hashes all its blocks: the
// cost measured is the request path a new prompt takes. Direct and routed requests alternate,
// so a machine busy with other work slows both sides alike.
package routercost

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/router/extproc/gatewaytest"
	"github.com/kvroute/kvroute/sim/simproc"
)

// Router is one kvrouter binary under test.
type Router struct {
	Name string // in the results ("kvrouter" when one is measured)
	Bin  string
	Args []string // before kvrouter's own flags (a subcommand, for a binary that wraps it)
}

// Options say what to measure. Zero sizes or counts skip that part.
type Options struct {
	SimBin   string
	Routers  []Router
	Policies []string // kvrouter --policy values, each measured in turn
	// Modes are how the router is put in front of the engine, each measured in turn: ModeProxy
	// (the default; requests go through its OpenAI listener) and ModePicker (it is an endpoint
	// picker, --ext-proc-listen, and kvbench plays the gateway: the picker's ext_proc round
	// trips and its reading of the streamed response, the gateway forwarding the bytes).
	Modes  []string
	Rounds int // every (router, policy) is measured this many times, interleaved

	CPUSizes    []int // prompt tokens of the CPU-per-request measurement
	CPURequests int   // sequential requests per size

	TTFTSizes []int // prompt tokens of the added-TTFT measurement
	TTFTPairs int   // direct/routed pairs per size

	StreamTokens   int // prompt tokens of the concurrent-streams measurement
	Streams        int // concurrent streams
	StreamRequests int // requests per phase (direct, then routed)

	MaxTokens int    // output tokens of every request
	Dir       string // the processes' logs
	Progress  io.Writer
}

// The modes Options.Modes names.
const (
	ModeProxy  = "proxy"
	ModePicker = "picker"
)

// Figures is one measurement of one router, policy and mode.
type Figures struct {
	Router string `json:"router"`
	Policy string `json:"policy"`
	Mode   string `json:"mode"`
	Round  int    `json:"round"`

	CPU     []CPUFigure    `json:"cpu,omitempty"`
	TTFT    []TTFTFigure   `json:"ttft,omitempty"`
	Streams *StreamsFigure `json:"streams,omitempty"`
}

// CPUFigure is the CPU time the router and the engine spent per sequential request of one size.
type CPUFigure struct {
	PromptTokens int     `json:"prompt_tokens"`
	Requests     int     `json:"requests"`
	RouterMs     float64 `json:"router_cpu_ms"`
	EngineMs     float64 `json:"engine_cpu_ms"`
	// RouterIdleMs is the router's CPU per request it spends with no request at all (its
	// health and metrics loops over the same wall time), included in RouterMs.
	RouterIdleMs float64 `json:"router_idle_cpu_ms"`
}

// TTFTFigure is the first-token time through the router and direct, in alternating pairs.
type TTFTFigure struct {
	PromptTokens int     `json:"prompt_tokens"`
	Pairs        int     `json:"pairs"`
	DirectP50Ms  float64 `json:"direct_p50_ms"`
	RoutedP50Ms  float64 `json:"routed_p50_ms"`
	AddedP50Ms   float64 `json:"added_p50_ms"` // of each pair's routed minus direct
	AddedP90Ms   float64 `json:"added_p90_ms"`
	// PickP50Ms and PickP90Ms (picker mode) are the ext_proc round trip of the routed requests:
	// from the request headers sent to the pick received, the body's pieces in between.
	PickP50Ms float64 `json:"pick_p50_ms,omitempty"`
	PickP90Ms float64 `json:"pick_p90_ms,omitempty"`
}

// StreamsFigure is many concurrent streams, direct and then routed.
type StreamsFigure struct {
	PromptTokens int     `json:"prompt_tokens"`
	Streams      int     `json:"streams"`
	Requests     int     `json:"requests"`
	DirectRPS    float64 `json:"direct_rps"`
	RoutedRPS    float64 `json:"routed_rps"`
	Ratio        float64 `json:"ratio"` // routed over direct requests per second
	DirectP50Ms  float64 `json:"direct_ttft_p50_ms"`
	RoutedP50Ms  float64 `json:"routed_ttft_p50_ms"`
	AddedP50Ms   float64 `json:"added_ttft_p50_ms"`
	Failed       int     `json:"failed"`
}

// simArgs make the engine fast and its cache big enough for the largest prompt and every
// concurrent stream: the engine's simulated time is the same on both sides, so what differs
// is the router.
func simArgs(o *Options) []string {
	longest := slices.Max(slices.Concat([]int{2048}, o.CPUSizes, o.TTFTSizes))
	blocks := max(longest, o.StreamTokens*o.Streams)/16*2 + 1024
	return []string{"--model", "cost", "--step-model", "flat", "--prefill-tokens-per-s", "10000000",
		"--decode-ms-per-token", "2", "--num-gpu-blocks", strconv.Itoa(blocks),
		"--max-model-len", strconv.Itoa(max(131072, longest+o.MaxTokens+16)),
		"--max-num-seqs", strconv.Itoa(max(256, o.Streams)), "--max-batched-tokens", "131072"}
}

// Run measures every router and policy Rounds times, in the order round, router, policy.
func Run(ctx context.Context, o Options) ([]Figures, error) {
	o.Rounds = max(o.Rounds, 1)
	o.MaxTokens = cmp.Or(o.MaxTokens, 16)
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if len(o.Modes) == 0 {
		o.Modes = []string{ModeProxy}
	}
	for _, m := range o.Modes {
		if m != ModeProxy && m != ModePicker {
			return nil, fmt.Errorf("mode %q: want %s or %s", m, ModeProxy, ModePicker)
		}
	}
	var out []Figures
	for round := 1; round <= o.Rounds; round++ {
		for _, r := range o.Routers {
			for _, pol := range o.Policies {
				for _, mode := range o.Modes {
					fmt.Fprintf(o.Progress, "round %d: %s --policy %s, %s mode\n", round, r.Name, pol, mode)
					f, err := measure(ctx, &o, r, pol, mode, round)
					if err != nil {
						return out, fmt.Errorf("%s --policy %s, %s mode, round %d: %w", r.Name, pol, mode, round, err)
					}
					out = append(out, f)
				}
			}
		}
	}
	return out, nil
}

// measure starts one engine and one router and runs the three measurements.
func measure(ctx context.Context, o *Options, r Router, policy, mode string, round int) (Figures, error) {
	f := Figures{Router: r.Name, Policy: policy, Mode: mode, Round: round}
	tag := fmt.Sprintf("%s-%s-%s-%d", r.Name, policy, mode, round)
	simLog, err := os.Create(filepath.Join(o.Dir, "vllm-sim-"+tag+".log"))
	if err != nil {
		return f, err
	}
	defer simLog.Close()
	sim, err := simproc.Start(ctx, o.SimBin, simArgs(o), simproc.Options{Log: simLog, StartTimeout: 20 * time.Second})
	if err != nil {
		return f, err
	}
	defer sim.Stop()
	engine := "e0=" + sim.URL
	if len(sim.Events) > 0 {
		engine += ";events=" + sim.Events[0]
	}
	if len(sim.Replay) > 0 {
		engine += ";replay=" + sim.Replay[0]
	}
	args := []string{"--engine", engine, "--policy", policy, "--model", "cost"}
	if mode == ModePicker {
		args = append(args, "--ext-proc-listen", "127.0.0.1:0")
	}
	rp, err := startRouter(ctx, r, args, filepath.Join(o.Dir, "kvrouter-"+tag+".log"))
	if err != nil {
		return f, err
	}
	defer rp.stop()
	if err := rp.waitReady(ctx, 20*time.Second); err != nil {
		return f, err
	}
	c := newClient(max(o.Streams, 8), "cost", o.MaxTokens, tag)
	direct := func(ctx context.Context, size int) result { return c.complete(ctx, sim.URL, size) }
	routed := func(ctx context.Context, size int) result { return c.complete(ctx, "http://"+rp.api, size) }
	if mode == ModePicker {
		if rp.extProc == "" {
			return f, fmt.Errorf("kvrouter logged no ext_proc address; its log:\n%s", rp.tail())
		}
		gw, err := gatewaytest.Dial(rp.extProc)
		if err != nil {
			return f, err
		}
		defer func() { _ = gw.Close() }()
		gw.HTTP = c.http // the same connection pool as the direct requests
		routed = func(ctx context.Context, size int) result { return c.viaGateway(ctx, gw, size) }
	}
	// A first request each way opens the connections and fills the router's caches of the
	// engine's answers (model list, block size).
	for side, send := range []front{direct, routed} {
		if res := send(ctx, 256); res.err != nil {
			return f, fmt.Errorf("warm-up request (%s): %w", []string{"direct", mode}[side], res.err)
		}
	}
	for _, n := range o.CPUSizes {
		if o.CPURequests <= 0 {
			break
		}
		cf, err := measureCPU(ctx, routed, rp.pid(), sim.Pid(), n, o.CPURequests)
		if err != nil {
			return f, err
		}
		f.CPU = append(f.CPU, cf)
	}
	for _, n := range o.TTFTSizes {
		if o.TTFTPairs <= 0 {
			break
		}
		tf, err := measureTTFT(ctx, direct, routed, n, o.TTFTPairs)
		if err != nil {
			return f, err
		}
		f.TTFT = append(f.TTFT, tf)
	}
	if o.Streams > 0 && o.StreamRequests > 0 {
		sf, err := measureStreams(ctx, direct, routed, o.StreamTokens, o.Streams, o.StreamRequests)
		if err != nil {
			return f, err
		}
		f.Streams = &sf
	}
	if rp.exited() {
		return f, fmt.Errorf("kvrouter exited during the run; its log:\n%s", rp.tail())
	}
	return f, nil
}

// measureCPU sends n sequential requests of size tokens through the router and reads the
// router's and the engine's CPU time around them; the router's idle CPU over the same wall time
// is measured before.
func measureCPU(ctx context.Context, routed front, routerPid, simPid, size, n int) (CPUFigure, error) {
	f := CPUFigure{PromptTokens: size, Requests: n}
	for range 2 { // the first requests of a size grow the buffers that size needs
		if res := routed(ctx, size); res.err != nil {
			return f, res.err
		}
	}
	r0, s0, err := cpuTimes(routerPid, simPid)
	if err != nil {
		return f, err
	}
	start := time.Now()
	for range n {
		if res := routed(ctx, size); res.err != nil {
			return f, res.err
		}
	}
	wall := time.Since(start)
	r1, s1, err := cpuTimes(routerPid, simPid)
	if err != nil {
		return f, err
	}
	// The router's idle CPU: the same wall time, capped so a long size does not dominate the run.
	idleWall := min(wall, time.Second)
	i0, err := cpuTime(routerPid)
	if err != nil {
		return f, err
	}
	select {
	case <-ctx.Done():
		return f, ctx.Err()
	case <-time.After(idleWall):
	}
	i1, err := cpuTime(routerPid)
	if err != nil {
		return f, err
	}
	f.RouterMs = ms(r1-r0) / float64(n)
	f.EngineMs = ms(s1-s0) / float64(n)
	f.RouterIdleMs = ms(i1-i0) * (float64(wall) / float64(idleWall)) / float64(n)
	return f, nil
}

func cpuTimes(a, b int) (time.Duration, time.Duration, error) {
	x, err := cpuTime(a)
	if err != nil {
		return 0, 0, err
	}
	y, err := cpuTime(b)
	return x, y, err
}

// measureTTFT alternates direct and routed requests of size tokens, pairs of them.
func measureTTFT(ctx context.Context, direct, routed front, size, pairs int) (TTFTFigure, error) {
	f := TTFTFigure{PromptTokens: size, Pairs: pairs}
	var d, r, added, pick []float64
	for i := range pairs + 1 {
		// Which side goes first alternates too, so neither always follows the other's work.
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		var got [2]result
		for _, side := range order {
			send := direct
			if side == 1 {
				send = routed
			}
			if got[side] = send(ctx, size); got[side].err != nil {
				return f, got[side].err
			}
		}
		if i == 0 {
			continue // the size's first pair grows buffers on both sides
		}
		d, r = append(d, ms(got[0].ttft)), append(r, ms(got[1].ttft))
		added = append(added, ms(got[1].ttft)-ms(got[0].ttft))
		if got[1].pick > 0 {
			pick = append(pick, ms(got[1].pick))
		}
	}
	f.DirectP50Ms, f.RoutedP50Ms = quantile(d, 0.5), quantile(r, 0.5)
	f.AddedP50Ms, f.AddedP90Ms = quantile(added, 0.5), quantile(added, 0.9)
	if len(pick) > 0 {
		f.PickP50Ms, f.PickP90Ms = quantile(pick, 0.5), quantile(pick, 0.9)
	}
	return f, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// measureStreams runs requests through streams concurrent workers, direct and then routed.
func measureStreams(ctx context.Context, direct, routed front, size, streams, requests int) (StreamsFigure, error) {
	f := StreamsFigure{PromptTokens: size, Streams: streams, Requests: requests}
	var ttft [2][]float64
	for side, send := range []front{direct, routed} {
		rps, t, failed := closedLoop(ctx, send, size, streams, requests)
		if ctx.Err() != nil {
			return f, ctx.Err()
		}
		f.Failed += failed
		ttft[side] = t
		if side == 0 {
			f.DirectRPS = rps
		} else {
			f.RoutedRPS = rps
		}
	}
	if f.DirectRPS > 0 {
		f.Ratio = f.RoutedRPS / f.DirectRPS
	}
	f.DirectP50Ms, f.RoutedP50Ms = quantile(ttft[0], 0.5), quantile(ttft[1], 0.5)
	f.AddedP50Ms = f.RoutedP50Ms - f.DirectP50Ms
	return f, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// quantile is the q-quantile of xs by linear interpolation between closest ranks (0 when empty).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (pos-float64(i))*(s[i+1]-s[i])
}
