package router

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/app"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/simproc"
	"github.com/kvroute/kvroute/sim/simproc/simproctest"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

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

// startRouter runs a kvrouter over the engines and returns its API URL.
func startRouter(t *testing.T, es []discovery.Engine, mod func(*config.Config)) string {
	url, _ := startRouterServer(t, es, mod)
	return url
}

func startRouterServer(t *testing.T, es []discovery.Engine, mod func(*config.Config)) (string, *app.Router) {
	t.Helper()
	cfg := config.Default()
	cfg.Events.Enabled = false
	if mod != nil {
		mod(&cfg)
	}
	s, err := app.New(app.Options{Config: cfg, Source: discovery.NewStatic(es), ProbeInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	<-s.Synced()
	api := httptest.NewServer(s.APIHandler())
	t.Cleanup(func() { api.Close(); cancel(); <-done })
	return api.URL, s
}

// cuttingEngine is a vLLM stand-in that accepts a stream, sends two tokens and dies (the
// connection closes with no terminator).
func cuttingEngine(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"vllm-sim","object":"model"}]}`))
			return
		case "/health":
			return
		case "/v1/completions/render", "/v1/chat/completions/render", "/tokenize":
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for i := range 2 {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"text_completion\",\"created\":1,\"model\":\"vllm-sim\",\"choices\":[{\"index\":0,\"text\":\"t%d\",\"logprobs\":null,\"finish_reason\":null}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// The official SDK through faults: attempts that fail before the first token are invisible to
// it; a stream cut after its first token, by the engine's own error event or by the engine
// dying, raises in the SDK instead of passing as a complete answer.
func TestOpenAISDKFaults(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		skipUnlessCI(t, "node not installed")
	}
	dir := sdkModules(t)
	bad := startPinnedSim(t, vllmsim.Config{FailRate: 1})
	good := startPinnedSim(t, vllmsim.Config{SSEKeepAliveInterval: 5 * time.Millisecond})
	retryURL := startRouter(t, []discovery.Engine{{Name: "bad", URL: bad.URL(), Ready: true}, {Name: "good", URL: good.URL(), Ready: true}},
		func(c *config.Config) { c.Policy = "round-robin" })
	errSim := startPinnedSim(t, vllmsim.Config{StreamErrorAfter: 3})
	errURL := startRouter(t, []discovery.Engine{{Name: "e", URL: errSim.URL(), Ready: true}}, nil)
	cutURL := startRouter(t, []discovery.Engine{{Name: "c", URL: cuttingEngine(t), Ready: true}}, nil)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "faults.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KVROUTE_URL_RETRY="+retryURL+"/v1", "KVROUTE_URL_ENGINE_ERROR="+errURL+"/v1",
		"KVROUTE_URL_CUT="+cutURL+"/v1")
	outb, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("node faults.mjs: %v\n%s%s", err, outb, stderr)
	}
	var got struct {
		RetryClean  int      `json:"retry_clean"`
		RetryFailed []string `json:"retry_failed"`
		EngineError struct {
			Raised bool
			Chunks int
			Error  string
		} `json:"engine_error"`
		Cut struct {
			Raised bool
			Chunks int
			Error  string
		} `json:"cut"`
	}
	line := strings.TrimSpace(string(outb))
	if err := json.Unmarshal([]byte(line[strings.LastIndex(line, "\n")+1:]), &got); err != nil {
		t.Fatalf("sdk output %q: %v", outb, err)
	}
	t.Logf("sdk saw %+v", got)
	if got.RetryClean != 8 || len(got.RetryFailed) > 0 {
		t.Errorf("retried streams not clean in the SDK: %d clean, failed %q", got.RetryClean, got.RetryFailed)
	}
	if !got.EngineError.Raised || got.EngineError.Chunks == 0 {
		t.Errorf("engine's in-stream error after the first token: %+v", got.EngineError)
	}
	if !got.Cut.Raised || got.Cut.Chunks == 0 {
		t.Errorf("engine dying mid-stream: %+v", got.Cut)
	}
}

// streamOutcome classifies what a plain HTTP client saw of one stream.
func streamOutcome(url, body string) string {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return "failed: " + err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("failed: %d %s", resp.StatusCode, b)
	}
	tokens, errEv, done := 0, false, false
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		switch {
		case strings.HasPrefix(line, `data: {"error"`):
			errEv = true
		case strings.HasPrefix(line, "data: [DONE]"):
			done = true
		case strings.HasPrefix(line, "data: {"):
			tokens++
		}
		if err != nil {
			broken := !errors.Is(err, io.EOF)
			switch {
			case done && !errEv && !broken && tokens > 0:
				return "clean"
			case tokens > 0 && errEv && broken && !done:
				return "cut"
			default:
				return fmt.Sprintf("failed: tokens %d error event %v done %v broken %v", tokens, errEv, done, broken)
			}
		}
	}
}

// kill -9 of a vllm-sim process (headers at acceptance, as vLLM) under streaming load: no
// request without a first token fails; every stream cut mid-way is visibly broken.
func TestKill9UnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds vllm-sim and runs processes")
	}
	bin := testkit.Build(t, "./cmd/vllm-sim")
	var es []discovery.Engine
	var sims []*simproc.Sim
	for i := range 3 {
		name := fmt.Sprintf("e%d", i)
		s := simproctest.Start(t, bin, simproc.Options{Name: "vllm-sim " + name}, "--kv-events-port", "0", "--kv-replay-port", "0",
			"--sse-keep-alive-interval", "0.02", "--time-scale", "5", "--prefill-tokens-per-s", "4000")
		sims = append(sims, s)
		es = append(es, discovery.Engine{Name: name, URL: s.URL, Ready: true})
	}
	api, srv := startRouterServer(t, es, nil)
	const n = 90
	results := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 15)
	var once sync.Once
	for i := range n {
		if i == 30 {
			// Under load: about 15 streams in flight, some still in prefill, some decoding.
			time.Sleep(60 * time.Millisecond)
			once.Do(sims[1].Kill)
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			body := fmt.Sprintf(`{"model":"vllm-sim","stream":true,"max_tokens":40,"prompt":"%d %s"}`, i, strings.Repeat("lorem ipsum ", 200))
			results[i] = streamOutcome(api+"/v1/completions", body)
		}()
	}
	wg.Wait()
	count := map[string]int{}
	for i, r := range results {
		if strings.HasPrefix(r, "failed") {
			t.Errorf("request %d: %s", i, r)
			count["failed"]++
			continue
		}
		count[r]++
	}
	retried := testutil.ToFloat64(srv.Metrics().Retries.WithLabelValues("e1"))
	t.Logf("kill -9 under load: %v, attempts retried off the killed engine %v", count, retried)
	if retried+float64(count["cut"]) == 0 {
		t.Fatal("nothing was in flight on the killed engine: the test proved nothing")
	}
}

// holdHeadersEnv=1 runs every in-process vllm-sim whose test does not pin its timing with the
// simulator's old timing (HoldHeaders: a stream's headers wait for its first token); the default
// is vLLM's (headers at acceptance). `make test` runs the request-path suites both ways.
const holdHeadersEnv = "VLLMSIM_HOLD_HEADERS"
