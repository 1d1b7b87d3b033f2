package assess

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim/vllmsim"
)

// startSims runs n in-process vLLM simulators on 127.0.0.1 (HTTP only, no KV events), sped up
// so a test's traffic takes milliseconds.
func startSims(t *testing.T, n int, cfg vllmsim.Config) []*vllmsim.Sim {
	t.Helper()
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 50
	}
	var sims []*vllmsim.Sim
	for range n {
		sim, err := vllmsim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(func() { cancel(); _ = sim.Close() })
		if err := sim.Start(ctx); err != nil {
			t.Fatal(err)
		}
		sims = append(sims, sim)
	}
	return sims
}

func urls(sims []*vllmsim.Sim) []string {
	var out []string
	for _, s := range sims {
		out = append(out, s.URL())
	}
	return out
}

// target is one engine rank to send a request to.
type target struct {
	url  string
	rank int // -1: let the engine pick
}

func targets(sims []*vllmsim.Sim) []target {
	var out []target
	for _, s := range sims {
		if dp := s.Config().DataParallelSize; dp > 1 {
			for r := range dp {
				out = append(out, target{s.URL(), r})
			}
			continue
		}
		out = append(out, target{s.URL(), -1})
	}
	return out
}

// complete sends one completion of token ids (max_tokens tokens) to a target.
func complete(ctx context.Context, tg target, prompt []uint32, maxTokens int) error {
	body, _ := json.Marshal(map[string]any{"model": "vllm-sim", "prompt": prompt, "max_tokens": maxTokens})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tg.url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if tg.rank >= 0 {
		req.Header.Set("X-data-parallel-rank", strconv.Itoa(tg.rank))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", tg.url, resp.Status)
	}
	return nil
}

// tokens returns n random token ids below the simulator's vocabulary.
func tokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(rng.IntN(150000))
	}
	return out
}

// roundRobin sends prompts one at a time to the targets in turn: prompt-blind placement.
func roundRobin(tgs []target, prompts [][]uint32) func(context.Context) error {
	return func(ctx context.Context) error {
		for i, p := range prompts {
			if err := complete(ctx, tgs[i%len(tgs)], p, 1); err != nil {
				return err
			}
		}
		return nil
	}
}

// assessEngines runs the engines collector with traffic inside the window, then decides.
func assessEngines(t *testing.T, sims []*vllmsim.Sim, traffic func(context.Context) error) Assessment {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	snap, err := CollectEngines(ctx, EngineOptions{URLs: urls(sims), SampleEvery: 20 * time.Millisecond, Wait: traffic})
	if err != nil {
		t.Fatal(err)
	}
	a, err := Decide(snap, DefaultThresholds())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestEnginesOneReplica(t *testing.T) {
	sims := startSims(t, 1, vllmsim.Config{})
	rng := rand.New(rand.NewPCG(1, 1))
	system := tokens(rng, 512)
	var prompts [][]uint32
	for range 6 {
		prompts = append(prompts, append(append([]uint32{}, system...), tokens(rng, 16)...))
	}
	a := assessEngines(t, sims, roundRobin(targets(sims), prompts))
	if a.Verdict != VerdictSingleReplica {
		t.Fatalf("verdict %s: %s", a.Verdict, a.Headline)
	}
	// 5 of 6 requests hit the 512-token system prompt (32 whole blocks): 2560 of 6*528 tokens.
	if got, want := a.Fleet.HitRate, 2560.0/(6*528); got != want {
		t.Errorf("hit rate %v, want %v", got, want)
	}
}

// A shared system prompt sent round-robin: every replica caches it after its first request, so
// each hits most of its tokens with no routing at all. One engine runs two DP ranks, which are
// two replicas with their own caches.
func TestEnginesSharedSystemPromptRoundRobin(t *testing.T) {
	sims := append(startSims(t, 2, vllmsim.Config{}), startSims(t, 1, vllmsim.Config{DataParallelSize: 2})...)
	rng := rand.New(rand.NewPCG(2, 2))
	system := tokens(rng, 1024)
	var prompts [][]uint32
	for range 32 {
		prompts = append(prompts, append(append([]uint32{}, system...), tokens(rng, 16)...))
	}
	a := assessEngines(t, sims, roundRobin(targets(sims), prompts))
	if a.Verdict != VerdictAlreadyHigh || a.Fleet.Replicas != 4 {
		t.Fatalf("verdict %s over %d replicas: %s\n%q", a.Verdict, a.Fleet.Replicas, a.Headline, a.Reasons)
	}
	// Each replica gets 8 requests, the first missing the system prompt: 7*1024 of 8*1040.
	want := 7 * 1024.0 / (8 * 1040)
	for _, r := range a.Replicas {
		if r.HitRate == nil || *r.HitRate != want || r.RequestsPerS == nil || *r.RequestsPerS <= 0 {
			t.Errorf("%s: hit rate %v (want %v), req/s %v", r.ID, r.HitRate, want, r.RequestsPerS)
		}
	}
	dp := strings.TrimPrefix(sims[2].URL(), "http://")
	ranks := 0
	for _, r := range a.Replicas {
		if r.Pod == dp && (r.ID == dp+"/0" || r.ID == dp+"/1") {
			ranks++
		}
	}
	if ranks != 2 || a.Fleet.LoadMaxOverMean != 1 {
		t.Errorf("the DP engine should be two replicas (%d found); load spread %v", ranks, a.Fleet.LoadMaxOverMean)
	}
}

// Unique prompts: nothing is ever reused, so there is nothing for routing to gather.
func TestEnginesUniquePrompts(t *testing.T) {
	sims := startSims(t, 3, vllmsim.Config{})
	rng := rand.New(rand.NewPCG(3, 3))
	var prompts [][]uint32
	for range 30 {
		prompts = append(prompts, tokens(rng, 700))
	}
	a := assessEngines(t, sims, roundRobin(targets(sims), prompts))
	if a.Verdict != VerdictNotWorthIt || a.Fleet.HitRate != 0 || a.Estimate.GainMax != 0 {
		t.Fatalf("verdict %s, hit %v, gain %v: %s", a.Verdict, a.Fleet.HitRate, a.Estimate.GainMax, a.Headline)
	}
	if a.Fleet.QueryTokensPerS <= 0 || a.WindowSeconds <= 0 {
		t.Errorf("rates from the measured window: %+v", a.Fleet)
	}
}

// Many shared prefixes (RAG documents, per-tenant prompts), each used by three requests in
// random order, placed round-robin: a prefix mostly lands on a replica that has not seen it.
func TestEnginesManySpreadPrefixes(t *testing.T) {
	const replicas, docs, uses, docLen, tail = 4, 48, 3, 1024, 16
	sims := startSims(t, replicas, vllmsim.Config{})
	rng := rand.New(rand.NewPCG(4, 4))
	var prompts [][]uint32
	var docOf []int
	for d := range docs {
		doc := tokens(rng, docLen)
		for range uses {
			prompts = append(prompts, append(append([]uint32{}, doc...), tokens(rng, tail)...))
			docOf = append(docOf, d)
		}
	}
	rng.Shuffle(len(prompts), func(i, j int) {
		prompts[i], prompts[j] = prompts[j], prompts[i]
		docOf[i], docOf[j] = docOf[j], docOf[i]
	})
	a := assessEngines(t, sims, roundRobin(targets(sims), prompts))
	if a.Verdict != VerdictWorthRouting {
		t.Fatalf("verdict %s: %s\n%q", a.Verdict, a.Headline, a.Reasons)
	}
	// Exactly what the engines must have counted: a document hits on every request after the
	// first on the same replica.
	seen := map[[2]int]bool{}
	hits := 0
	for i, d := range docOf {
		key := [2]int{d, i % replicas}
		if seen[key] {
			hits += docLen
		}
		seen[key] = true
	}
	total := float64(len(prompts) * (docLen + tail))
	if got, want := a.Fleet.HitRate, float64(hits)/total; got != want {
		t.Errorf("blind hit rate %v, want %v", got, want)
	}
	// One shared cache would hit all but the first use of each document. The favourable reading
	// of the counters should land near it (the model's k is right here; only the sample is small).
	shared := float64(docs*(uses-1)*docLen) / total
	t.Logf("blind %.3f ceiling %.3f shared %.3f", a.Fleet.HitRate, a.Estimate.HitRate, shared)
	if e := a.Estimate; e.HitRate < shared-0.1 || e.HitRate > shared+0.1 || e.PrefillTokensPerSSavedMax <= 0 {
		t.Errorf("ceiling %v, one shared cache %v", e.HitRate, shared)
	}
}

// A cache too small for the running batch: vLLM (and the simulator) preempt, the counter shows
// it, and the verdict carries the warning.
func TestEnginesPreemptionsAreFlagged(t *testing.T) {
	sims := startSims(t, 2, vllmsim.Config{NumGPUBlocks: 48, TimeScale: 20})
	rng := rand.New(rand.NewPCG(5, 5))
	tgs := targets(sims)
	a := assessEngines(t, sims, func(ctx context.Context) error {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for i := range 16 {
			p := tokens(rng, 200)
			wg.Go(func() {
				if err := complete(ctx, tgs[i%2], p, 120); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		return <-errs
	})
	if a.Fleet.Preemptions == nil || *a.Fleet.Preemptions == 0 {
		t.Fatalf("no preemptions counted: %+v", a.Fleet)
	}
	if !strings.Contains(strings.Join(a.Warnings, "\n"), "Preemptions are high") {
		t.Errorf("warnings %q", a.Warnings)
	}
	// The sampler sees the cache fill up unless the machine is too loaded to sample during the
	// ~0.2 s of traffic, so only its presence is asserted.
	if a.Fleet.KVUsageMax == nil {
		t.Error("no KV usage sampled")
	} else {
		t.Logf("KV usage max %.2f", *a.Fleet.KVUsageMax)
	}
}

// An engine restarted inside the window: its counters start again, and the delta is taken from
// zero, as Prometheus's increase() does.
func TestEnginesCounterReset(t *testing.T) {
	sims := startSims(t, 2, vllmsim.Config{})
	rng := rand.New(rand.NewPCG(6, 6))
	tgs := targets(sims)
	// Traffic before the window, so sim 0's counters are ahead of what follows the restart.
	for range 4 {
		if err := complete(context.Background(), tgs[0], tokens(rng, 800), 1); err != nil {
			t.Fatal(err)
		}
	}
	a := assessEngines(t, sims, func(ctx context.Context) error {
		resp, err := http.Post(sims[0].URL()+"/debug/restart", "application/json", nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return roundRobin(tgs, [][]uint32{tokens(rng, 100), tokens(rng, 100)})(ctx)
	})
	if got := a.Replicas[0].QueryTokensPerS * a.WindowSeconds; got < 99 || got > 101 {
		t.Errorf("sim 0 looked up %v tokens after its restart, want 100", got)
	}
	if !strings.Contains(strings.Join(a.Notes, "\n"), "went down (engine restart?)") {
		t.Errorf("notes %q", a.Notes)
	}
}

// vLLM leaves /metrics open, but a proxy in front may not: the key goes along as a bearer token.
func TestEnginesBehindAuthProxy(t *testing.T) {
	sims := startSims(t, 2, vllmsim.Config{})
	var proxied []string
	for _, s := range sims {
		h := s.Handler()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer k3y" {
				http.Error(w, "missing key", http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		proxied = append(proxied, srv.URL+"/")
	}
	ctx := context.Background()
	noop := func(context.Context) error { return nil }
	_, err := CollectEngines(ctx, EngineOptions{URLs: proxied, Wait: noop})
	if err == nil || !strings.Contains(err.Error(), "401 Unauthorized") || !strings.Contains(err.Error(), "--api-key-file") {
		t.Fatalf("without the key: %v", err)
	}
	snap, err := CollectEngines(ctx, EngineOptions{URLs: proxied, APIKey: "k3y", Wait: noop})
	if err != nil || len(snap.Replicas) != 2 || snap.Model != "vllm-sim" {
		t.Fatalf("with the key: %v %+v", err, snap)
	}
}

func TestEnginesErrors(t *testing.T) {
	sims := startSims(t, 1, vllmsim.Config{})
	other := startSims(t, 1, vllmsim.Config{Model: "other"})
	notVLLM := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprintln(w, "# TYPE go_goroutines gauge\ngo_goroutines 7")
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(notVLLM.Close)
	oldVLLM := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "# TYPE vllm:gpu_prefix_cache_queries_total counter\nvllm:gpu_prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 5")
	}))
	t.Cleanup(oldVLLM.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	noop := func(context.Context) error { return nil }
	for _, c := range []struct {
		name string
		o    EngineOptions
		want string
	}{
		{"two models", EngineOptions{URLs: urls(append(sims, other...))}, "serve 2 models (other, vllm-sim): a fleet is one model, pass --model"},
		{"wrong model", EngineOptions{URLs: urls(sims), Model: "qwen"}, `no engine serves model_name "qwen"; they serve vllm-sim`},
		{"not vLLM", EngineOptions{URLs: []string{notVLLM.URL}}, "serves no vllm:* metrics"},
		{"old vLLM", EngineOptions{URLs: []string{oldVLLM.URL}}, "no vllm:prefix_cache_queries_total: the engine predates vLLM 0.10"},
		{"wrong path", EngineOptions{URLs: []string{notVLLM.URL + "/v1"}}, "404 Not Found"},
		{"unreachable", EngineOptions{URLs: []string{closed}}, "cannot scrape " + closed + "/metrics"},
		{"not a URL", EngineOptions{URLs: []string{"10.0.0.5:8000"}}, "want an http(s) URL"},
		{"twice", EngineOptions{URLs: []string{sims[0].URL(), sims[0].URL() + "/metrics"}}, "listed twice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.o.Wait = noop
			_, err := CollectEngines(context.Background(), c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want %q", err, c.want)
			}
		})
	}
	// The model filter keeps one fleet out of engines serving two.
	snap, err := CollectEngines(context.Background(), EngineOptions{URLs: urls(append(sims, other...)), Model: "other", Wait: noop})
	if err != nil || len(snap.Replicas) != 1 || snap.Replicas[0].Pod != strings.TrimPrefix(other[0].URL(), "http://") ||
		!strings.Contains(strings.Join(snap.Notes, "\n"), strings.TrimPrefix(sims[0].URL(), "http://")+" serves no") {
		t.Errorf("model filter: %v %+v %q", err, snap.Replicas, snap.Notes)
	}
}

// Without a Wait hook the collector sleeps the window and samples the gauges meanwhile.
func TestEnginesWindowTimer(t *testing.T) {
	sims := startSims(t, 2, vllmsim.Config{})
	start := time.Now()
	snap, err := CollectEngines(context.Background(), EngineOptions{URLs: urls(sims), Window: 300 * time.Millisecond,
		SampleEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond || snap.WindowSeconds < 0.3 {
		t.Errorf("window %v s after %v", snap.WindowSeconds, took)
	}
	if !strings.Contains(snap.Notes[0], "two scrapes of each engine's /metrics") || snap.Replicas[0].KVUsageMean == nil {
		t.Errorf("notes %q, replica %+v", snap.Notes, snap.Replicas[0])
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := CollectEngines(ctx, EngineOptions{URLs: urls(sims), Window: time.Minute}); err == nil {
		t.Error("a cancelled context must stop the collection")
	}
}
