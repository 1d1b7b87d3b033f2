package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configure a live replay. Every (policy, seed) run gets fresh vllm-sim processes and a
// fresh kvrouter, so each policy starts with cold engine caches and a cold router index; that
// costs a few hundred milliseconds per run and avoids reset_prefix_cache's 409 while requests drain.
type Options struct {
	SimBin, RouterBin string
	Replicas          int
	Policies          []string
	Seeds             int
	FirstSeed         int // seeds run FirstSeed .. FirstSeed+Seeds-1 (default 1)
	// Concurrency caps requests in flight; an arrival finding the cap full waits, and its TTFT
	// is measured from when it is actually sent (Outcome.Held is the wait, Outcome.SentAt shows
	// it too). A cap the traffic reaches makes the replay closed-loop (Summary.Held): to compare
	// policies on the same arrivals, give at least the requests that can be in flight at once.
	Concurrency     int
	Tokens          Tokenizer
	OutputScale     float64       // max_tokens = round(output_length x OutputScale), at least 1
	MaxOutputTokens int           // cap on max_tokens (0: none)
	Jitter          time.Duration // per-seed arrival jitter (Workload.Jittered)
	Model           string        // the sims' --model
	SimArgs         []string      // extra vllm-sim flags (timing, blocks) for every engine
	RouterArgs      []string      // extra kvrouter flags (not --listen/--admin-listen: the kernel picks those)
	// RouterPrefix are arguments RouterBin takes before the router's flags: ["router"] when
	// RouterBin is kvbench, whose hidden router subcommand runs kvrouter's code with the
	// benchmark policies registered (a kvrouter binary offers the production ones only).
	RouterPrefix []string
	// BlockSize is the engines' KV block size. A router without events learns no block size
	// (it comes with the first event), and until it knows one it routes every request unkeyed,
	// by load alone; so a policy label ending in NoEventsSuffix passes it as --block-size, and
	// such a label needs it (unless RouterArgs set --block-size).
	BlockSize int
	// Routers is how many kvrouter replicas front the engines (default 1). With more than one
	// they run as peers (docs/router.md, "Several router replicas": an embedded NATS server each,
	// clustered on loopback, sharing their in-flight load), and request i goes to router i mod
	// Routers.
	Routers int
	// CaptureUnder names the policies whose routers capture their traffic as a Mooncake trace
	// (kvrouter --capture-dir <run dir>/capture; RunResult.CaptureDir): the trial's input. Only
	// with one router: each of several would capture its own share of the traffic, and no one
	// file would be the workload.
	CaptureUnder []string
	// External are routers the replay does not start, each run after the policies of a seed on
	// Engines (required with them), which they were configured with.
	External []External
	Engines  *Engines
	// ExternalReady bounds the wait for an external router to serve probe requests before its
	// run (default 2 min: time to start one on the engines the replay printed).
	ExternalReady time.Duration
	LogDir        string        // process logs and engines files (required)
	Drain         time.Duration // how long a run may take after its last arrival (default 60 s)
	Progress      io.Writer     // one line per run; nil = quiet
}

// Run is one (policy, seed) replay.
type RunResult struct {
	Policy   string         `json:"policy"`
	Seed     int            `json:"seed"`
	Wall     float64        `json:"wall_s"`
	Outcomes []Outcome      `json:"-"`
	ScaleUp  *ScaleUpResult `json:"scale_up,omitempty"`
	Engines  []string       `json:"engines"` // engine names in start order (the last ones are added by a scale-up)
	// CaptureDir holds the router's capture files when Options.CaptureUnder named the policy.
	CaptureDir string `json:"capture_dir,omitempty"`
	Routers    int    `json:"routers"`
	// RouterSync is each router's peers and load-sync cost at the end of the run (Routers > 1).
	RouterSync []RouterSync `json:"router_sync,omitempty"`
	// CPU is what the run cost the machine while requests were replayed; a run over MaxHostCPU
	// is invalid (its latencies measure the machine).
	CPU CPUUse `json:"cpu"`
	// RouterEvents: the routers subscribed to the engines' KV events (false for a policy label
	// ending in NoEventsSuffix: every replica scored from the approximate index).
	RouterEvents bool `json:"router_events"`
	// External says which external router ran ("router-url URL", "ext-proc ADDR"; empty for a
	// policy of the replay's own routers).
	External string `json:"external,omitempty"`
	// Accuracy is the routers' per-mode accuracy counters at the end of the run, summed over
	// routers (ModeTokens); AccuracyErr says why they could not be read.
	Accuracy    map[string]ModeTokens `json:"accuracy,omitempty"`
	AccuracyErr string                `json:"accuracy_error,omitempty"`
}

// ScaleUpResult measures a scale-up run inside the new replicas' warm-up window.
type ScaleUpResult struct {
	// NewShareOfFair is the share of requests sent in the window that the new replicas served,
	// over their fair share (added / final size): near 1, new replicas take their share at once.
	NewShareOfFair float64 `json:"new_share_of_fair"`
	// HitBefore/HitDuring are cached-token ratios in the window before the scale-up and in the
	// warm-up window; HitDrop = 1 - during/before: what routing to cold replicas costs.
	HitBefore float64 `json:"hit_before"`
	HitDuring float64 `json:"hit_during"`
	HitDrop   float64 `json:"hit_drop"`
}

// Replay runs every policy over every seed (policies interleaved within a seed, so drifting
// machine load hits all of them alike) and returns the runs.
func Replay(ctx context.Context, o Options, w Workload) ([]*RunResult, error) {
	if err := o.check(w); err != nil {
		return nil, err
	}
	var runs []*RunResult
	for seed := o.FirstSeed; seed < o.FirstSeed+o.Seeds; seed++ {
		wl := w.Jittered(uint64(seed), o.Jitter)
		for _, pol := range o.Policies {
			r, err := runOne(ctx, o, wl, pol, seed)
			if err != nil {
				return runs, fmt.Errorf("policy %s seed %d: %w", pol, seed, err)
			}
			runs = append(runs, r)
			o.progress(r)
		}
		for _, ext := range o.External {
			r, err := runExternal(ctx, o, wl, ext, seed)
			if err != nil {
				return runs, fmt.Errorf("%s seed %d: %w", ext.Name, seed, err)
			}
			runs = append(runs, r)
			o.progress(r)
		}
	}
	return runs, nil
}

// progress prints one line for a finished run.
func (o *Options) progress(r *RunResult) {
	if o.Progress != nil {
		s := summarize([]*RunResult{r})
		routers := ""
		if o.Routers > 1 {
			routers = fmt.Sprintf(" through %d routers", o.Routers)
		}
		fmt.Fprintf(o.Progress, "replay: %-20s seed %d%s: %d requests in %.1fs, ttft p90 %.3fs, p99 %.3fs, cached %.2f, errors %d\n",
			r.Policy, r.Seed, routers, len(r.Outcomes), r.Wall, s.TTFTP90.Mean, s.TTFTP99.Mean, s.CachedRatio.Mean, s.Errors)
	}
}

func (o *Options) check(w Workload) error {
	switch {
	case o.SimBin == "" || o.RouterBin == "":
		return errors.New("the vllm-sim and kvrouter binaries are required")
	case o.Replicas < 1:
		return errors.New("replicas must be >= 1")
	case len(o.Policies) == 0:
		return errors.New("no policies")
	case o.Seeds < 1:
		return errors.New("seeds must be >= 1")
	case o.Concurrency < 1:
		return errors.New("concurrency must be >= 1")
	case o.Tokens.PerBlock < 1:
		return errors.New("tokens per trace block must be >= 1")
	case o.OutputScale <= 0:
		return errors.New("output scale must be > 0")
	case o.LogDir == "":
		return errors.New("a log directory is required")
	case o.Routers < 0:
		return errors.New("routers must be >= 1 (0: one)")
	case o.Routers > 1 && len(o.CaptureUnder) > 0:
		return errors.New("capture needs one router: with several, each would capture only its share of the traffic")
	case o.Routers > 1 && hasFlag(o.RouterArgs, "config"):
		return errors.New("with several routers the replay writes each one's --config (its peers block); give the other settings as flags")
	case hidesListening(o.RouterArgs):
		return errors.New("a --log-level above info hides the \"kvrouter listening\" line the replay reads the routers' ports from")
	case len(w.Requests) == 0:
		return errors.New("the workload has no requests")
	case hasFlag(o.RouterArgs, "no-events"):
		return fmt.Errorf("give --no-events through a policy label (kv%s), so the results say which mode ran", NoEventsSuffix)
	case o.BlockSize < 1 && !hasFlag(o.RouterArgs, "block-size") && slices.ContainsFunc(o.Policies, func(p string) bool { _, ev := SplitPolicy(p); return !ev }):
		return fmt.Errorf("policies without events need the engines' block size (Options.BlockSize): without it the router routes every request unkeyed, not from the approximate index")
	case len(o.External) > 0 && o.Engines == nil:
		return errors.New("external routers need the engines they front (Options.Engines, StartEngines)")
	case len(o.External) > 0 && w.ScaleUp != nil:
		return errors.New("a scale-up rewrites its routers' engines file mid-run; an external router's engines are fixed: no scale-up with external routers")
	case w.ScaleUp != nil && (w.ScaleUp.From < 1 || w.ScaleUp.To != o.Replicas || w.ScaleUp.From >= w.ScaleUp.To):
		return fmt.Errorf("scale-up %d -> %d does not fit %d replicas", w.ScaleUp.From, w.ScaleUp.To, o.Replicas)
	}
	for _, bin := range []string{o.SimBin, o.RouterBin} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("binary: %w", err)
		}
	}
	names := map[string]bool{}
	for _, p := range o.Policies {
		names[p] = true
	}
	for _, x := range o.External {
		if x.Name == "" || names[x.Name] || (x.URL == "") == (x.ExtProc == "") {
			return fmt.Errorf("external router %q: needs a name no policy or other router has, and exactly one of a URL and an ext_proc address", x.Name)
		}
		names[x.Name] = true
	}
	if o.ExternalReady <= 0 {
		o.ExternalReady = 2 * time.Minute
	}
	if o.FirstSeed < 1 {
		o.FirstSeed = 1
	}
	if o.Routers == 0 {
		o.Routers = 1
	}
	if o.Drain <= 0 {
		o.Drain = 60 * time.Second
	}
	return os.MkdirAll(o.LogDir, 0o755)
}

func (o *Options) maxTokens(r *Request) int {
	n := int(math.Round(float64(r.OutputLength) * o.OutputScale))
	if o.MaxOutputTokens > 0 {
		n = min(n, o.MaxOutputTokens)
	}
	return max(n, 1)
}

func runOne(ctx context.Context, o Options, w Workload, policy string, seed int) (res *RunResult, err error) {
	dir := filepath.Join(o.LogDir, runDirName(policy, seed))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var stops []func() // the processes started, stopped in reverse order
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	// Engines.
	sims := make([]*sim, o.Replicas)
	names := make([]string, o.Replicas)
	for i := range sims {
		names[i] = fmt.Sprintf("engine-%d", i)
		args := []string{"--host", "127.0.0.1", "--model", o.Model, "--seed", strconv.Itoa(seed*100 + i)}
		if len(w.Adapters) > 0 {
			args = append(args, "--lora-modules", strings.Join(w.Adapters, ","))
		}
		args = append(args, o.SimArgs...)
		s, err := startSim(ctx, o.SimBin, names[i], args, filepath.Join(dir, names[i]+".log"))
		if err != nil {
			return nil, err
		}
		stops = append(stops, s.stop)
		sims[i] = s
	}
	// The router, on the engines file.
	enginesFile := filepath.Join(dir, "engines.txt")
	initial := o.Replicas
	if w.ScaleUp != nil {
		initial = w.ScaleUp.From
	}
	if err := writeEngines(enginesFile, sims[:initial], names, time.Time{}, 0); err != nil {
		return nil, err
	}
	captureDir := ""
	if slices.Contains(o.CaptureUnder, policy) {
		captureDir = filepath.Join(dir, "capture")
	}
	routers, err := startRouters(ctx, o, dir, enginesFile, policy, captureDir, names[:initial], &stops)
	if err != nil {
		return nil, err
	}
	bases := make([]string, len(routers))
	for i, r := range routers {
		bases[i] = "http://" + r.api
	}

	// Replay.
	_, events := SplitPolicy(policy)
	res = &RunResult{Policy: policy, Seed: seed, Engines: names, CaptureDir: captureDir, Routers: len(routers), RouterEvents: events}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Concurrency, MaxConnsPerHost: o.Concurrency}}
	defer client.CloseIdleConnections()
	// Every engine (those a scale-up adds included) and every router.
	var pids []int
	for _, r := range routers {
		pids = append(pids, r.cmd.Process.Pid)
	}
	for _, s := range sims {
		pids = append(pids, s.Pid())
	}
	scaled := w.ScaleUp == nil
	var arrive func(ctx context.Context, start time.Time, r *Request) error
	if !scaled {
		arrive = func(ctx context.Context, start time.Time, r *Request) error {
			if scaled || r.At < w.ScaleUp.At {
				return nil
			}
			if err := sleepUntil(ctx, start.Add(w.ScaleUp.At)); err != nil {
				return err
			}
			scaled = true
			return writeEngines(enginesFile, sims, names, time.Now().Add(w.ScaleUp.Warmup), initial)
		}
	}
	// Request i to router i mod N: the even spread a Kubernetes Service gives over many client
	// connections, here per request, so every router routes the same share and the peers'
	// shared load is what keeps their decisions consistent.
	send := func(ctx context.Context, i int, r *Request, prompt []uint32, maxTokens int) Outcome {
		return complete(ctx, client, bases[i%len(bases)], o.Model, r, prompt, maxTokens)
	}
	if len(w.Warm) > 0 {
		if err := warmFleet(ctx, o, send, w.Warm); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	out, err := drive(ctx, o, w, send, pids, arrive, res)
	if err != nil {
		return nil, err
	}
	res.Outcomes = out
	// A router books a request's end as the last piece goes out, around when the client reads
	// it: read the counters a moment later, so the last requests are in them.
	if err := sleepUntil(ctx, time.Now().Add(warmSettle)); err != nil {
		return nil, err
	}
	for _, r := range routers {
		m, err := r.accuracy()
		if err != nil {
			res.AccuracyErr = err.Error()
			res.Accuracy = nil
			break
		}
		res.Accuracy = addModes(res.Accuracy, m)
	}
	if len(routers) > 1 {
		for _, r := range routers {
			s, err := r.syncFigures()
			if err != nil {
				s.Err = err.Error()
			}
			res.RouterSync = append(res.RouterSync, s)
		}
	}
	if w.ScaleUp != nil {
		res.ScaleUp = scaleUpResult(out, names[initial:], w.ScaleUp, initial)
	}
	return res, ctx.Err()
}

// sender sends request i (its prompt and max_tokens already made) through one front end and
// measures it; a failure is the outcome's Err.
type sender func(ctx context.Context, i int, r *Request, prompt []uint32, maxTokens int) Outcome

// drive replays w's requests through send at their arrival times, at most o.Concurrency in
// flight, and fills res's wall time and CPU use (pids: the processes the run costs). arrive,
// when set, runs before each arrival is sent (the scale-up's engines-file rewrite); its error
// ends the run.
func drive(ctx context.Context, o Options, w Workload, send sender, pids []int, arrive func(context.Context, time.Time, *Request) error,
	res *RunResult) ([]Outcome, error) {
	rctx, cancel := context.WithTimeout(ctx, w.Span()+o.Drain)
	defer cancel()
	sem := make(chan struct{}, o.Concurrency)
	out := make([]Outcome, len(w.Requests))
	for i := range out {
		out[i] = Outcome{Index: i, Err: "not sent: the run's time bound was reached"}
	}
	var wg sync.WaitGroup
	cpu0, cpuErr := snapshotCPU(pids)
	start := time.Now()
	for i := range w.Requests {
		r := &w.Requests[i]
		if arrive != nil {
			if err := arrive(rctx, start, r); err != nil {
				if rctx.Err() != nil {
					break
				}
				return nil, err
			}
		}
		if err := sleepUntil(rctx, start.Add(r.At)); err != nil {
			break
		}
		var held time.Duration
		select {
		case sem <- struct{}{}:
		default: // every slot busy: the request waits on an earlier one's completion
			t0 := time.Now()
			select {
			case sem <- struct{}{}:
			case <-rctx.Done():
			}
			held = time.Since(t0)
		}
		if rctx.Err() != nil {
			break
		}
		prompt := o.Tokens.Prompt(r)
		wg.Add(1)
		go func(i int, held time.Duration) {
			defer wg.Done()
			defer func() { <-sem }()
			sent := time.Since(start)
			oc := send(rctx, i, r, prompt, o.maxTokens(r))
			oc.Index, oc.SentAt, oc.Held = i, sent, held.Seconds()
			out[i] = oc
		}(i, held)
	}
	wg.Wait()
	res.Wall = time.Since(start).Seconds()
	if cpu1, err := snapshotCPU(pids); err == nil && cpuErr == nil {
		res.CPU = cpuUse(cpu0, cpu1, res.Wall, numCPU())
	}
	return out, nil
}

// warmSettle is how long the measured replay waits after the warm-up's last completion: the
// engines publish a step's KV events as it ends, and the routers index them within milliseconds
// on loopback; 250 ms leaves the last batches time to land before the first measured request.
const warmSettle = 250 * time.Millisecond

// warmFleet sends the warm-up requests through the routers (request i to router i mod N, as
// the replay does), each at its At, at most o.Concurrency in flight, and waits for all of them.
// A warm-up request that fails fails the run: the fleet is then not in the state the
// measurement says it was.
func warmFleet(ctx context.Context, o Options, send sender, warm []Request) error {
	wctx, cancel := context.WithTimeout(ctx, warm[len(warm)-1].At+o.Drain)
	defer cancel()
	sem := make(chan struct{}, o.Concurrency)
	errs := make([]string, len(warm))
	var wg sync.WaitGroup
	start := time.Now()
	for i := range warm {
		r := &warm[i]
		if err := sleepUntil(wctx, start.Add(r.At)); err != nil {
			break
		}
		select {
		case sem <- struct{}{}:
		case <-wctx.Done():
		}
		if wctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = send(wctx, i, r, o.Tokens.Prompt(r), o.maxTokens(r)).Err
		}(i)
	}
	wg.Wait()
	if err := wctx.Err(); err != nil {
		return fmt.Errorf("%d requests not done in %v: %w", len(warm), warm[len(warm)-1].At+o.Drain, err)
	}
	for i, e := range errs {
		if e != "" {
			return fmt.Errorf("request %d of %d: %s", i, len(warm), e)
		}
	}
	return sleepUntil(ctx, time.Now().Add(warmSettle))
}

// routerArgs is a router's command line for the policy label, before its capture and peer
// flags. Every router is told the engines' block size, as the operator tells it
// (controllers/render RouterConfig sets it from spec.engine.blockSize): a router left to learn
// it from the first event keys nothing before then and routes every request by load, so a cold
// fleet's first requests (until the first prefills store their blocks) would all be routed
// unkeyed and counted as full misses, a start no deployed router has. Without events it is required (check).
func routerArgs(o Options, enginesFile, policy string) []string {
	base, events := SplitPolicy(policy)
	args := append([]string{"--engines-file", enginesFile, "--policy", base}, o.RouterArgs...)
	if !events {
		args = append(args, "--no-events")
	}
	if o.BlockSize >= 1 && !hasFlag(o.RouterArgs, "block-size") {
		args = append(args, "--block-size", strconv.Itoa(o.BlockSize))
	}
	return args
}

// startRouters starts o.Routers kvrouters on the engines file, one after another (with several,
// each names the route ports of those before it), and waits until each is ready, knows the
// engines and, with several, sees every other router. Each is stopped through stops.
func startRouters(ctx context.Context, o Options, dir, enginesFile, policy, captureDir string, engines []string, stops *[]func()) ([]*routerProc, error) {
	var routers []*routerProc
	var routes []string
	for i := range o.Routers {
		id, logName := fmt.Sprintf("router-%d", i), "kvrouter.log"
		args := routerArgs(o, enginesFile, policy)
		if captureDir != "" {
			args = append(args, "--capture-dir", captureDir)
		}
		if o.Routers > 1 {
			logName = fmt.Sprintf("kvrouter-%d.log", i)
			cfg := filepath.Join(dir, id+".yaml")
			if err := peersConfig(cfg, id, routes); err != nil {
				return nil, err
			}
			args = append(args, "--config", cfg)
		}
		r, err := startRouter(ctx, o.RouterBin, o.RouterPrefix, id, args, filepath.Join(dir, logName), 15*time.Second)
		if err != nil {
			return nil, err
		}
		*stops = append(*stops, r.stop)
		if o.Routers > 1 && r.cluster == "" {
			return nil, fmt.Errorf("kvrouter %s logged no peer_cluster address (log: %s)", id, r.logPath)
		}
		routers = append(routers, r)
		routes = append(routes, r.cluster)
	}
	for _, r := range routers {
		if err := waitHTTP(ctx, r.proc, "http://"+r.api+"/readyz", 15*time.Second); err != nil {
			return nil, err
		}
		if err := waitEngines(ctx, "http://"+r.admin, engines, 5*time.Second); err != nil {
			return nil, err
		}
		if o.Routers > 1 {
			if err := r.waitPeers(ctx, o.Routers-1, 15*time.Second); err != nil {
				return nil, err
			}
		}
	}
	return routers, nil
}

func writeEngines(path string, sims []*sim, names []string, warmupUntil time.Time, warmFrom int) error {
	var b strings.Builder
	b.WriteString("# written by kvbench replay\n")
	for i, s := range sims {
		var wu time.Time
		if i >= warmFrom && warmFrom > 0 {
			wu = warmupUntil
		}
		b.WriteString(s.EngineLine(names[i], wu) + "\n")
	}
	return writeFileAtomic(path, []byte(b.String()))
}

// waitEngines waits until the router's /debug/engines names every engine, so a run does not
// start while some engines are still unknown to the router.
func waitEngines(ctx context.Context, admin string, names []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	for {
		missing := ""
		resp, err := c.Get(admin + "/debug/engines")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, n := range names {
				if !strings.Contains(string(b), `"`+n+`"`) {
					missing = n
					break
				}
			}
		} else {
			missing = err.Error()
		}
		if missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kvrouter /debug/engines still lacks %s after %s", missing, timeout)
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return err
		}
	}
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func scaleUpResult(out []Outcome, added []string, su *ScaleUp, initial int) *ScaleUpResult {
	isNew := map[string]bool{}
	for _, n := range added {
		isNew[n] = true
	}
	var inWin, onNew int
	var cBefore, pBefore, cDuring, pDuring int
	for _, o := range out {
		if o.Err != "" {
			continue
		}
		switch {
		case o.SentAt >= su.At && o.SentAt < su.At+su.Warmup:
			inWin++
			if isNew[o.Engine] {
				onNew++
			}
			cDuring += o.CachedTokens
			pDuring += o.PromptTokens
		case o.SentAt >= su.At-su.Warmup && o.SentAt < su.At:
			cBefore += o.CachedTokens
			pBefore += o.PromptTokens
		}
	}
	r := &ScaleUpResult{NewShareOfFair: math.NaN(), HitBefore: ratio(cBefore, pBefore), HitDuring: ratio(cDuring, pDuring)}
	if inWin > 0 {
		fair := float64(su.To-initial) / float64(su.To)
		r.NewShareOfFair = float64(onNew) / float64(inWin) / fair
	}
	r.HitDrop = 1 - r.HitDuring/r.HitBefore
	return r
}

func ratio(a, b int) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}
