package app

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// mirrors reports whether the router's replica holds exactly the sim rank's cached hashes.
func mirrors(rt *router, engine string, sim *vllmsim.Sim) bool {
	id, ok := rt.s.ix.Replica(engine, 0)
	if !ok {
		return false
	}
	want := sim.CacheState().Ranks[0].Hashes
	st, err := rt.s.ix.Stats(id)
	if err != nil || st.Blocks[index.GPU] != len(want) {
		return false
	}
	for _, h := range want {
		if _, ok := rt.s.ix.ParentKey(id, h); !ok {
			return false
		}
	}
	return true
}

func streamState(rt *router, engine string) string {
	for _, e := range rt.s.Engines() {
		if e.Name == engine {
			return e.Ranks[0].Stream
		}
	}
	return ""
}

// gatedSim is a vllm-sim behind a proxy whose /health can be made to fail: the engine as the
// router's probe sees it.
type gatedSim struct {
	sim  *vllmsim.Sim
	gate *httptest.Server
	down atomic.Bool
}

func startGatedSim(t *testing.T) *gatedSim {
	g := &gatedSim{}
	var target atomic.Pointer[url.URL]
	g.gate = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && g.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		httputil.NewSingleHostReverseProxy(target.Load()).ServeHTTP(w, r)
	}))
	t.Cleanup(g.gate.Close)
	topic := "kv@" + g.gate.Listener.Addr().String() + "@vllm-sim"
	g.sim = startSim(t, vllmsim.Config{KVEventsTopic: &topic})
	u, _ := url.Parse(g.sim.URL())
	target.Store(u)
	return g
}

func (g *gatedSim) engine(name string) discovery.Engine {
	return discovery.Engine{Name: name, URL: g.gate.URL, Events: g.sim.EventEndpoints(), Replay: g.sim.ReplayEndpoints(), Ready: true}
}

// A static engine seen down by the health probe stops counting as exact at once; restarted
// while down and idle after its return, its old blocks are gone within one probe interval plus
// 1 s of the return (the identity check finds the last applied batch missing from its ring).
func TestStaticEngineRestartWhileDown(t *testing.T) {
	g := startGatedSim(t)
	const probe = 200 * time.Millisecond
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{g.engine("e")}), func(o *Options) { o.ProbeInterval = probe })
	rt.waitStreams(t, "exact")
	for i := range 4 {
		if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(i, 64, i, 16, 2)); a.status != 200 {
			t.Fatalf("status %d", a.status)
		}
	}
	testkit.WaitFor(t, waitBound, "index mirrors the engine", func() bool { return mirrors(rt, "e", g.sim) && streamState(rt, "e") == "exact" })
	t0 := time.Now()
	g.down.Store(true)
	testkit.WaitFor(t, waitBound, "not exact once the probe fails", func() bool { return streamState(rt, "e") != "exact" })
	t.Logf("not exact %v after the engine went down (probe interval %v)", time.Since(t0).Round(time.Millisecond), probe)
	if time.Since(t0) > probe+time.Second {
		t.Fatalf("took %v", time.Since(t0))
	}
	g.sim.Restart()
	t1 := time.Now()
	g.down.Store(false)
	testkit.WaitFor(t, waitBound, "the new process mirrored", func() bool { return mirrors(rt, "e", g.sim) && streamState(rt, "e") == "exact" })
	took := time.Since(t1)
	t.Logf("old blocks gone, exact again %v after the engine's return", took.Round(time.Millisecond))
	if took > probe+time.Second {
		t.Fatalf("took %v, want within one probe interval plus 1 s", took)
	}
}

// An engine that keeps serving but stops publishing: after a few requests past the staleness
// window the stream is no longer exact; when the publisher resumes, the held batches arrive in
// order and it is exact again.
func TestEngineServesButStopsPublishing(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	clk := &fakeClock{}
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("e", sim)}), func(o *Options) { o.Now = clk.now })
	rt.waitStreams(t, "exact")
	if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 64, 1, 16, 2)); a.status != 200 {
		t.Fatalf("status %d", a.status)
	}
	// Its batch applied first: a batch applied after the clock moves would restart the window.
	testkit.WaitFor(t, waitBound, "the first request's blocks indexed", func() bool { return mirrors(rt, "e", sim) })
	sim.SetEventsStalled(true)
	clk.advance(kvevents.QuietAfter + 100*time.Millisecond)
	t0 := time.Now()
	for i := range kvevents.QuietHits {
		if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(10+i, 64, i, 16, 2)); a.status != 200 {
			t.Fatalf("status %d", a.status)
		}
	}
	// The router hands the evidence to the stream after the answer's last byte: wait for it.
	testkit.WaitFor(t, waitBound, "the stream inexact after the quiet requests", func() bool { return streamState(rt, "e") == "inexact" })
	// At least QuietHits quiet answers: the first request's own evidence may reach the stream
	// after the clock moved, and count too.
	if st, _ := rt.s.sub.Stats("e", 0); st.StaleMarks != 1 || st.QuietRequests < kvevents.QuietHits {
		t.Fatalf("stale marks %d, quiet requests %d; want 1, >= %d", st.StaleMarks, st.QuietRequests, kvevents.QuietHits)
	}
	t.Logf("stale after %d requests, %v", kvevents.QuietHits, time.Since(t0).Round(time.Millisecond))
	sim.SetEventsStalled(false)
	testkit.WaitFor(t, waitBound, "exact again with the held batches applied", func() bool { return mirrors(rt, "e", sim) && streamState(rt, "e") == "exact" })
}

// Kubernetes engines: discovery reports a restart by the pod's incarnation; the new process's
// blocks replace the old ones whether it published fewer batches than the old one (its seq went
// back) or more (it jumped).
func TestKubernetesEngineRestart(t *testing.T) {
	for _, n := range []int{1, 12} {
		t.Run(map[int]string{1: "fewer", 12: "more"}[n], func(t *testing.T) {
			sim := startSim(t, vllmsim.Config{})
			e := simEngine("pod", sim)
			e.Incarnation = "uid-1/0"
			src := newPushSource([]discovery.Engine{e})
			rt := startRouter(t, src, nil)
			rt.waitStreams(t, "exact")
			for i := range 4 {
				postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(i, 64, i, 16, 2))
			}
			testkit.WaitFor(t, waitBound, "mirror", func() bool { return mirrors(rt, "pod", sim) && streamState(rt, "pod") == "exact" })
			sim.Restart()
			for i := range n {
				postJSON(t, sim.URL()+"/v1/completions", idsPrompt(100+i, 64, i, 16, 2))
			}
			t0 := time.Now()
			e.Incarnation = "uid-1/1"
			src.ch <- []discovery.Engine{e}
			testkit.WaitFor(t, waitBound, "restart applied", func() bool { st, _ := rt.s.sub.Stats("pod", 0); return st.Restarts == 1 })
			testkit.WaitFor(t, waitBound, "the new process mirrored", func() bool { return mirrors(rt, "pod", sim) && streamState(rt, "pod") == "exact" })
			t.Logf("new process mirrored %v after discovery reported it", time.Since(t0).Round(time.Millisecond))
		})
	}
}

func TestParseGPUBlocks(t *testing.T) {
	body := `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="27391",prefix_caching_hash_algo="sha256"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
`
	if n := parseGPUBlocks(strings.NewReader(body)); n != 27391 {
		t.Fatalf("got %d, want 27391", n)
	}
	if n := parseGPUBlocks(strings.NewReader(`vllm:cache_config_info{num_gpu_blocks="None"} 1.0`)); n != 0 {
		t.Fatalf("got %d for None, want 0", n)
	}
}

// The limit from the engine's num_gpu_blocks reaches the stream: vllm-sim's 4,096 blocks.
func TestReplicaLimitFromEngineMetrics(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("e", sim)}), nil)
	rt.waitStreams(t, "exact")
	if n := rt.s.gpuBlocks(context.Background(), sim.URL()); n != sim.Config().NumGPUBlocks {
		t.Fatalf("num_gpu_blocks %d, want %d", n, sim.Config().NumGPUBlocks)
	}
}

// The engine's capacity bounds its replica's guesses: vllm-sim with 65 blocks (64 usable, one
// is vLLM's null block) and no events; four prompts of 32 blocks each leave the predicted and
// approximate side indexes at 64 entries, the first two prompts evicted and counted on /metrics.
func TestSideIndexesEvictAtTheEngineCapacity(t *testing.T) {
	sim := startSim(t, vllmsim.Config{NumGPUBlocks: 65, KVEventsPort: 0})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{{Name: "e", URL: sim.URL(), Ready: true}}),
		func(o *Options) { o.PredictedTTL = time.Hour })
	for i := range 4 {
		if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(130_000+i, 512, i, 1, 1)); a.status != 200 {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
	}
	if st := rt.s.ledger.Stats(); st.Predicted != 64 || st.Approximate != 64 || st.PredictedEvicted != 64 || st.ApproximateEvicted != 64 {
		t.Fatalf("ledger %+v, want 64 entries and 64 evicted in each side index", st)
	}
	resp, err := http.Get(rt.admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`kvroute_router_side_index_evicted_total{index="predicted"} 64`,
		`kvroute_router_side_index_evicted_total{index="approximate"} 64`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
