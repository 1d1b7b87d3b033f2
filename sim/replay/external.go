package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/router/extproc/gatewaytest"
)

// External is a router the replay does not start, run beside its own policies on the same
// workload and on engines it keeps for them (Engines): an OpenAI-compatible endpoint (URL), or
// an endpoint picker's ext_proc address (ExtProc), for which the replay plays the gateway with
// the client `kvroutectl epp-check` uses (router/extproc/gatewaytest): each request's headers
// and body go to the picker, the request goes to the endpoint it picked, and the response
// phases go back to it.
type External struct {
	Name    string // the label in every table
	URL     string // http://host:port; requests go to URL/v1/completions
	ExtProc string // host:port of the picker's ext_proc gRPC service (plaintext)
	// Admin, when set, is a kvrouter's admin base URL (http://host:port): its accuracy
	// counters are read before and after each run, so the run reports predicted against actual
	// cached tokens as the replay's own policies do.
	Admin string
}

// Engines are the vllm-sims an external router fronts. Unlike a policy's engines, started
// fresh for each run on ports the kernel picks, they live for the whole replay, at addresses
// the external router was configured with; between runs their prefix caches are reset (POST
// /reset_prefix_cache, which publishes AllBlocksCleared on the KV-event stream, so an
// event-driven router forgets them too) and they start each run as cold as a policy's.
type Engines struct {
	Names []string
	sims  []*sim
}

// EnginePortsStride separates the port ranges StartEngines uses from a base port: engine i
// serves HTTP on base+i, publishes KV events on base+EnginePortsStride+i*ranks (rank r: +r)
// and serves replay on base+2*EnginePortsStride+i*ranks.
const EnginePortsStride = 1000

// StartEngines starts o.Replicas vllm-sims with o.SimArgs for the external routers (ranks: the
// DP ranks each runs; adapters: the workload's LoRA adapters). With basePort 0 the kernel picks every port (a router configured after
// they started, from Lines); otherwise the ports are fixed (EnginePortsStride), so a router
// can be configured before. Logs go to o.LogDir/external-engines.
func StartEngines(ctx context.Context, o Options, basePort, ranks int, adapters []string) (*Engines, error) {
	ranks = max(ranks, 1)
	if basePort < 0 || basePort > 0 && basePort+2*EnginePortsStride+o.Replicas*ranks > 65535 {
		return nil, fmt.Errorf("engine base port %d: the replay's %d engines of %d ranks need ports up to base+%d", basePort,
			o.Replicas, ranks, 2*EnginePortsStride+o.Replicas*ranks)
	}
	if o.Replicas > EnginePortsStride || o.Replicas*ranks > EnginePortsStride {
		return nil, fmt.Errorf("%d engines of %d ranks do not fit the port layout (%d ports a range)", o.Replicas, ranks, EnginePortsStride)
	}
	dir := filepath.Join(o.LogDir, "external-engines")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	e := &Engines{}
	for i := range o.Replicas {
		name := fmt.Sprintf("engine-%d", i)
		args := []string{"--host", "127.0.0.1", "--model", o.Model, "--seed", strconv.Itoa(max(o.FirstSeed, 1)*100 + i)}
		if len(adapters) > 0 {
			args = append(args, "--lora-modules", strings.Join(adapters, ","))
		}
		args = append(args, o.SimArgs...)
		if basePort > 0 {
			args = append(args, "--port", strconv.Itoa(basePort+i),
				"--kv-events-port", strconv.Itoa(basePort+EnginePortsStride+i*ranks),
				"--kv-replay-port", strconv.Itoa(basePort+2*EnginePortsStride+i*ranks))
		}
		s, err := startSim(ctx, o.SimBin, name, args, filepath.Join(dir, name+".log"))
		if err != nil {
			e.Stop()
			return nil, err
		}
		e.sims = append(e.sims, s)
		e.Names = append(e.Names, name)
	}
	return e, nil
}

// Stop stops the engines.
func (e *Engines) Stop() {
	for _, s := range e.sims {
		s.stop()
	}
}

// Lines are the engines in kvrouter's --engine / --engines-file syntax (docs/router.md).
func (e *Engines) Lines() []string {
	out := make([]string, len(e.sims))
	for i, s := range e.sims {
		out[i] = s.EngineLine(e.Names[i], time.Time{})
	}
	return out
}

// Endpoints are the engines' HTTP addresses as ip:port, the form an endpoint picker names
// (x-gateway-destination-endpoint) and an InferencePool's endpoints take.
func (e *Engines) Endpoints() []string {
	out := make([]string, len(e.sims))
	for i, s := range e.sims {
		if u, err := url.Parse(s.URL); err == nil {
			out[i] = u.Host
		}
	}
	return out
}

// File is the engines as kvrouter's engines file, with each engine's endpoint and KV-event
// addresses in a comment for other routers' configuration.
func (e *Engines) File() string {
	var b strings.Builder
	b.WriteString("# written by kvbench replay: the engines an external router (--router-url, --ext-proc) fronts.\n")
	b.WriteString("# kvrouter: --engines-file this file. Other routers: the endpoints (ip:port, OpenAI API) and\n")
	b.WriteString("# the vLLM KV-event publishers (ZMQ PUB, topic \"\", DP rank r at port+r) are:\n")
	eps := e.Endpoints()
	for i, s := range e.sims {
		fmt.Fprintf(&b, "#   %s endpoint %s events %s replay %s\n", e.Names[i], eps[i], strings.Join(s.Events, ","), strings.Join(s.Replay, ","))
	}
	for _, l := range e.Lines() {
		b.WriteString(l + "\n")
	}
	return b.String()
}

func (e *Engines) pids() []int {
	out := make([]int, len(e.sims))
	for i, s := range e.sims {
		out[i] = s.Pid()
	}
	return out
}

// engineOf names the engine at endpoint (ip:port), "" when none is.
func (e *Engines) engineOf(endpoint string) string {
	for i, ep := range e.Endpoints() {
		if ep == strings.TrimSpace(endpoint) {
			return e.Names[i]
		}
	}
	return ""
}

// reset empties every engine's prefix cache. An engine still running a request (a stream the
// last run's client cut, draining) refuses with 409; it is asked again until timeout.
func (e *Engines) reset(ctx context.Context, timeout time.Duration) error {
	c := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(timeout)
	for i, s := range e.sims {
		for {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/reset_prefix_cache", nil)
			if err != nil {
				return err
			}
			resp, err := c.Do(req)
			status := 0
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				status = resp.StatusCode
				if status == http.StatusOK {
					break
				}
				err = fmt.Errorf("status %d", status)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: reset_prefix_cache: %w after %v", e.Names[i], err, timeout)
			}
			if err := sleepUntil(ctx, time.Now().Add(100*time.Millisecond)); err != nil {
				return err
			}
		}
	}
	return nil
}

// externalSender sends through one external router: to its URL, or through the picker with the
// replay playing the gateway. Close releases its connections.
func externalSender(o Options, ext External, engines *Engines) (sender, func(), error) {
	if ext.URL != "" {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Concurrency, MaxConnsPerHost: o.Concurrency}}
		base := strings.TrimRight(ext.URL, "/")
		send := func(ctx context.Context, _ int, r *Request, prompt []uint32, maxTokens int) Outcome {
			return complete(ctx, client, base, o.Model, r, prompt, maxTokens)
		}
		return send, client.CloseIdleConnections, nil
	}
	gw, err := gatewaytest.Dial(ext.ExtProc)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: ext_proc %s: %w", ext.Name, ext.ExtProc, err)
	}
	gw.HTTP = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Concurrency}}
	send := func(ctx context.Context, _ int, r *Request, prompt []uint32, maxTokens int) Outcome {
		return throughGateway(ctx, gw, engines, completionJSON(o.Model, r, prompt, maxTokens))
	}
	return send, func() { _ = gw.Close() }, nil
}

// throughGateway sends one completion through a picker as the gateway does and measures it as
// the gateway's client would: the response pieces the picker lets through are read as they
// come (gatewaytest.Request.OnClientBody), so the first token's time is the client's.
func throughGateway(ctx context.Context, gw *gatewaytest.Gateway, engines *Engines, body []byte) Outcome {
	var o Outcome
	pr, pw := io.Pipe()
	parsed := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(parsed)
		readStream(pr, start, &o)
		// A stream read to its end or to an error: later pieces are dropped, not blocked on.
		_ = pr.CloseWithError(errors.New("read"))
	}()
	res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: body, Mode: gatewaytest.FullDuplex,
		OnClientBody: func(piece []byte) { _, _ = pw.Write(piece) }})
	if err != nil {
		_ = pw.CloseWithError(err)
	} else {
		_ = pw.Close()
	}
	<-parsed
	switch {
	case err != nil:
		o = Outcome{Err: "gateway: " + err.Error()}
	case res.Immediate:
		o = Outcome{Err: fmt.Sprintf("the picker answered HTTP %d: %s", res.Status, clip(res.ClientBody))}
	case res.Status != http.StatusOK:
		o = Outcome{Err: fmt.Sprintf("HTTP %d from %s (picked %s): %s", res.Status, res.Served, strings.Join(res.Endpoints, ","), clip(res.ClientBody))}
	}
	if res != nil {
		o.Engine = engines.engineOf(res.Served)
		if o.Engine == "" && res.Served != "" {
			o.Engine = res.Served
		}
	}
	return o
}

func clip(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// probeTokens is a prompt no replayed request sends (ids past any trace's), different per k.
func probeTokens(k int) []uint32 {
	out := make([]uint32, 0, 32)
	for pos := range 32 {
		out = append(out, tokenAt(1<<62+uint64(k), pos))
	}
	return out
}

// waitExternal sends small probe requests through the external router until want of them in a
// row succeed, or timeout: the router must know the engines (it was configured with them, or
// reads the engines file the replay wrote) before a measured run. The probes' blocks are
// cleared by the reset that follows.
func waitExternal(ctx context.Context, name string, send sender, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	ok, k := 0, 0
	last := ""
	for ok < want {
		k++
		oc := send(ctx, k, &Request{}, probeTokens(k), 1)
		if oc.Err == "" {
			ok++
			continue
		}
		ok, last = 0, oc.Err
		if time.Now().After(deadline) {
			return fmt.Errorf("external router %s did not serve %d probe requests in a row within %v; last error: %s", name, want, timeout, last)
		}
		if err := sleepUntil(ctx, time.Now().Add(200*time.Millisecond)); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// runExternal is one (external router, seed) replay on the kept engines: wait for the router,
// reset the engines' caches, warm up if asked, replay.
func runExternal(ctx context.Context, o Options, w Workload, ext External, seed int) (*RunResult, error) {
	e := o.Engines
	send, closeSend, err := externalSender(o, ext, e)
	if err != nil {
		return nil, err
	}
	defer closeSend()
	if err := waitExternal(ctx, ext.Name, send, max(2*len(e.Names), 2), o.ExternalReady); err != nil {
		return nil, err
	}
	if err := e.reset(ctx, o.Drain); err != nil {
		return nil, err
	}
	// The reset's AllBlocksCleared reaches an event-driven router within milliseconds on loopback.
	if err := sleepUntil(ctx, time.Now().Add(warmSettle)); err != nil {
		return nil, err
	}
	if len(w.Warm) > 0 {
		if err := warmFleet(ctx, o, send, w.Warm); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	res := &RunResult{Policy: ext.Name, Seed: seed, Engines: e.Names, Routers: 1, RouterEvents: true, External: ext.kind()}
	var before map[string]ModeTokens
	accErr := errors.New("no admin URL")
	if ext.Admin != "" {
		before, accErr = readAccuracy(ext.Admin, ext.Name)
	}
	out, err := drive(ctx, o, w, send, e.pids(), nil, res)
	if err != nil {
		return nil, err
	}
	res.Outcomes = out
	if ext.Admin != "" {
		// The router books a request's end as the last piece goes out, around when the client
		// reads it: give it a moment before the counters are read.
		if err := sleepUntil(ctx, time.Now().Add(warmSettle)); err != nil {
			return nil, err
		}
		after, err := readAccuracy(ext.Admin, ext.Name)
		if err == nil && accErr == nil {
			res.Accuracy = subModes(after, before)
		} else {
			res.AccuracyErr = errors.Join(accErr, err).Error()
		}
	}
	return res, ctx.Err()
}

func (x External) kind() string {
	if x.ExtProc != "" {
		return "ext-proc " + x.ExtProc
	}
	return "router-url " + x.URL
}
