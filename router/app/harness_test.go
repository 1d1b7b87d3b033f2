package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// fleet is N in-process engines with real HTTP and ZMQ sockets.
type simFleet struct {
	sims  []*vllmsim.Sim
	names []string
}

// startSim starts a vllm-sim whose header timing follows holdHeadersEnv.
func startSim(t *testing.T, cfg vllmsim.Config) *vllmsim.Sim {
	t.Helper()
	if os.Getenv(holdHeadersEnv) == "1" {
		cfg.HoldHeaders = true // the simulator's old timing; make test runs the suite both ways
	}
	return startPinnedSim(t, cfg)
}

// startPinnedSim starts a vllm-sim with the header timing cfg gives, whatever holdHeadersEnv says.
func startPinnedSim(t *testing.T, cfg vllmsim.Config) *vllmsim.Sim {
	t.Helper()
	if cfg.KVEventsPort == 0 && cfg.KVEventsConnect == "" {
		cfg.KVEventsPort = -1
	}
	if cfg.KVReplayPort == 0 {
		cfg.KVReplayPort = -1
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 20
	}
	sim, err := vllmsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = sim.Close() })
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return sim
}

func startFleet(t *testing.T, n int, cfg vllmsim.Config) *simFleet {
	if os.Getenv(holdHeadersEnv) == "1" {
		cfg.HoldHeaders = true
	}
	return startPinnedFleet(t, n, cfg)
}

// startPinnedFleet starts n vllm-sims with the header timing cfg gives, whatever holdHeadersEnv says.
func startPinnedFleet(t *testing.T, n int, cfg vllmsim.Config) *simFleet {
	f := &simFleet{}
	for i := range n {
		f.sims = append(f.sims, startPinnedSim(t, cfg))
		f.names = append(f.names, fmt.Sprintf("e%d", i))
	}
	return f
}

func (f *simFleet) engines() []discovery.Engine {
	var es []discovery.Engine
	for i, s := range f.sims {
		es = append(es, simEngine(f.names[i], s))
	}
	return es
}

func simEngine(name string, s *vllmsim.Sim) discovery.Engine {
	return discovery.Engine{Name: name, URL: s.URL(), Events: s.EventEndpoints(), Replay: s.ReplayEndpoints(), Ready: true}
}

// pushSource is a discovery.Source the test feeds.
type pushSource struct{ ch chan []discovery.Engine }

func newPushSource(first []discovery.Engine) *pushSource {
	p := &pushSource{ch: make(chan []discovery.Engine, 8)}
	p.ch <- first
	return p
}

func (p *pushSource) Run(ctx context.Context, update func([]discovery.Engine)) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case es := <-p.ch:
			update(es)
		}
	}
}

// router is a running Server behind real HTTP listeners.
type router struct {
	s      *Router
	api    *httptest.Server
	admin  *httptest.Server
	cancel context.CancelFunc
	done   chan struct{}
}

func startRouter(t *testing.T, src discovery.Source, mod func(*Options)) *router {
	t.Helper()
	o := Options{Config: config.Default(), Source: src, ProbeInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	o.Config.BlockSize = 16
	if mod != nil {
		mod(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rt := &router{s: s, api: httptest.NewServer(s.APIHandler()), admin: httptest.NewServer(s.AdminHandler()), cancel: cancel, done: make(chan struct{})}
	go func() { defer close(rt.done); _ = s.Run(ctx) }()
	t.Cleanup(rt.stop)
	select {
	case <-s.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("first snapshot not applied")
	}
	return rt
}

func (rt *router) stop() {
	rt.cancel()
	<-rt.done
	rt.api.Close()
	rt.admin.Close()
}

// waitBound bounds every wait on a condition in this package's tests (a bound, not a wait).
const waitBound = 10 * time.Second

// waitStreams waits until every rank's stream is in state want.
func (rt *router) waitStreams(t *testing.T, want string) {
	t.Helper()
	all := func() bool {
		for _, e := range rt.s.Engines() {
			for _, r := range e.Ranks {
				if r.Stream != want {
					return false
				}
			}
		}
		return true
	}
	if !testkit.Until(waitBound, all) {
		t.Fatalf("streams not %s: %+v", want, rt.s.Engines())
	}
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func postJSON(t *testing.T, url string, body string) answer {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

// cachedTokens reads usage.prompt_tokens_details.cached_tokens of a non-streamed answer.
func (a answer) cachedTokens(t *testing.T) int {
	t.Helper()
	var v struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(a.body, &v); err != nil {
		t.Fatalf("answer %d %s: %v", a.status, a.body, err)
	}
	return v.Usage.PromptTokensDetails.CachedTokens
}

// idsPrompt is a completion body with token ids: prefix p (a seed) of n tokens, then m
// distinct tokens from seed q.
func idsPrompt(p, n, q, m, maxTokens int) string {
	var b bytes.Buffer
	b.WriteString(`{"model":"vllm-sim","max_tokens":`)
	fmt.Fprint(&b, maxTokens)
	b.WriteString(`,"prompt":[`)
	for i := range n + m {
		if i > 0 {
			b.WriteByte(',')
		}
		if i < n {
			fmt.Fprint(&b, 1000+(p*7919+i*31)%100000)
		} else {
			fmt.Fprint(&b, 1000+(q*104729+i*17)%100000)
		}
	}
	b.WriteString(`]}`)
	return b.String()
}

// routeAll sends bodies with the given concurrency and returns the engine header of each.
func routeAll(t *testing.T, url string, bodies []string, conc int) []string {
	t.Helper()
	out := make([]string, len(bodies))
	var wg sync.WaitGroup
	sem := make(chan struct{}, conc)
	errs := make(chan string, len(bodies))
	for i, b := range bodies {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(b))
			if err != nil {
				errs <- err.Error()
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				errs <- fmt.Sprintf("%d %s", resp.StatusCode, body)
			}
			out[i] = resp.Header.Get("x-kvroute-engine")
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("request failed: %s", e)
	}
	return out
}

func share(routes []string) map[string]int {
	m := map[string]int{}
	for _, r := range routes {
		m[r]++
	}
	return m
}

// holdHeadersEnv=1 runs every in-process vllm-sim whose test does not pin its timing with the
// simulator's old timing (HoldHeaders: a stream's headers wait for its first token); the default
// is vLLM's (headers at acceptance). `make test` runs the request-path suites both ways.
const holdHeadersEnv = "VLLMSIM_HOLD_HEADERS"
