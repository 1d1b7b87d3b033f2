package app

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/degraded"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// A client's bad request, refused by the engine's render, comes back as the engine's own
// answer (status and body), costs one engine call and is not a tokenizer failure.
func TestRenderClientErrorsReturned(t *testing.T) {
	sim := startSim(t, vllmsim.Config{KVEventsPort: 0, MaxModelLen: 2048})
	h := sim.Handler()
	var gen, calls atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" || r.URL.Path == "/v1/chat/completions" {
			gen.Add(1)
		}
		if r.Method == http.MethodPost {
			calls.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	defer front.Close()
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{{Name: "e0", URL: front.URL, Ready: true}}), nil)
	for _, c := range []struct {
		name, body string
		status     int
	}{
		{"unknown model", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404},
		{"bad max_tokens", `{"model":"vllm-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":-3}`, 400},
		{"over-long prompt", `{"model":"vllm-sim","prompt":"` + strings.Repeat("ab", 3000) + `"}`, 400},
	} {
		calls.Store(0)
		a := postJSON(t, rt.api.URL+"/v1/"+map[bool]string{true: "chat/completions", false: "completions"}[strings.Contains(c.body, "messages")], c.body)
		if a.status != c.status || !strings.Contains(string(a.body), `"error"`) {
			t.Errorf("%s: %d %s", c.name, a.status, a.body)
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("%s: %d engine calls, want the one render", c.name, n)
		}
	}
	if gen.Load() != 0 || testutil.ToFloat64(rt.s.met.TokenizeFailures) != 0 || rt.s.tok.Stats().Failures != 0 {
		t.Fatalf("forwarded %d, tokenize failures %v / %d", gen.Load(), testutil.ToFloat64(rt.s.met.TokenizeFailures), rt.s.tok.Stats().Failures)
	}
}

// A 401 from render is the router's credentials, not the client's request: the tokenization
// fails and the request is routed by load.
func TestRenderAuthFailureDegrades(t *testing.T) {
	sim := startSim(t, vllmsim.Config{KVEventsPort: 0})
	h := sim.Handler()
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/render") || r.URL.Path == "/tokenize" {
			w.WriteHeader(401)
			_, _ = w.Write([]byte(`{"error":{"message":"Unauthorized","type":"Unauthorized","param":null,"code":401}}`))
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer front.Close()
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{{Name: "e0", URL: front.URL, Ready: true}}), noHealthLoop)
	t0 := time.Now()
	rt.s.healthTick(t0)
	a := postJSON(t, rt.api.URL+"/v1/chat/completions", `{"model":"vllm-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	if a.status != 200 || testutil.ToFloat64(rt.s.met.TokenizeFailures) != 1 {
		t.Fatalf("%d %s, failures %v", a.status, a.body, testutil.ToFloat64(rt.s.met.TokenizeFailures))
	}
	// The degradation itself: the replica is tokenizer-failing at the next sample, the detail
	// naming the refusal, on /debug/engines and /metrics.
	rt.s.healthTick(t0.Add(5 * time.Second))
	var detail string
	for _, st := range rt.s.Degraded()["e0/0"] {
		if st.Reason == degraded.TokenizerFailing {
			detail = st.Detail
		}
	}
	if !strings.Contains(detail, "401") {
		t.Fatalf("degraded %+v: want tokenizer-failing naming the 401", rt.s.Degraded())
	}
	if ri := rt.s.Engines()[0].Ranks[0]; len(ri.Degraded) != 1 || ri.Degraded[0].Reason != degraded.TokenizerFailing {
		t.Fatalf("/debug/engines degraded %+v", ri.Degraded)
	}
	if body := scrape(t, rt); !strings.Contains(body, `kvroute_router_replica_degraded{engine="e0",rank="0",reason="tokenizer-failing"} 1`) {
		t.Fatalf("/metrics:\n%s", grepLines(body, "replica_degraded"))
	}
}

// Before the first discovery snapshot /readyz says so and a request waits for it instead of
// getting a 503; afterwards it is served.
func TestNoErrorsBeforeFirstSnapshot(t *testing.T) {
	sim := startSim(t, vllmsim.Config{KVEventsPort: 0})
	src := &pushSource{ch: make(chan []discovery.Engine, 1)}
	s, err := New(Options{Config: config.Default(), Source: src, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// entered closes when the completion reaches the router: the snapshot is sent only then.
	entered := make(chan struct{})
	h := s.APIHandler()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			close(entered)
		}
		h.ServeHTTP(w, r)
	}))
	defer api.Close()
	resp, err := http.Get(api.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(b), "no engine discovered yet") {
		t.Fatalf("readyz before discovery: %d %s", resp.StatusCode, b)
	}
	got := make(chan answer, 1)
	go func() {
		got <- postJSON(t, api.URL+"/v1/completions", `{"model":"vllm-sim","prompt":"hi","max_tokens":2}`)
	}()
	<-entered
	src.ch <- []discovery.Engine{simEngine("e0", sim)}
	if a := <-got; a.status != 200 {
		t.Fatalf("request sent before discovery: %d %s", a.status, a.body)
	}
	resp, _ = http.Get(api.URL + "/readyz")
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("readyz after discovery: %d", resp.StatusCode)
	}
}

// With no snapshot at all within the wait, the 503 says why.
func TestNoEngineDiscoveredYet(t *testing.T) {
	src := &pushSource{ch: make(chan []discovery.Engine, 1)}
	s, err := New(Options{Config: config.Default(), Source: src, DiscoveryWait: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(s.APIHandler())
	defer api.Close()
	a := postJSON(t, api.URL+"/v1/completions", `{"model":"m","prompt":"hi"}`)
	if a.status != 503 || !strings.Contains(string(a.body), "no engine discovered yet") {
		t.Fatalf("%d %s", a.status, a.body)
	}
}

// Wrong methods are 405 with Allow; unknown paths 404; a body that is not JSON by its
// Content-Type is refused as vLLM refuses it; every error has vLLM's and OpenAI's four keys.
func TestMethodsMediaTypesAndErrorShape(t *testing.T) {
	sim := startSim(t, vllmsim.Config{KVEventsPort: 0})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("e0", sim)}), nil)
	shape := func(name string, b []byte, status int) {
		t.Helper()
		var e struct {
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("%s: %s", name, b)
		}
		for _, k := range []string{"message", "type", "param", "code"} {
			if _, ok := e.Error[k]; !ok {
				t.Errorf("%s: error lacks %q: %s", name, k, b)
			}
		}
		if e.Error["code"] != float64(status) {
			t.Errorf("%s: code %v, want the status %d (vLLM's ErrorInfo.code)", name, e.Error["code"], status)
		}
	}
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/completions", "POST"}, {"PUT", "/v1/chat/completions", "POST"}, {"POST", "/v1/models", "GET, HEAD"},
	} {
		req, _ := http.NewRequest(c.method, rt.api.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d Allow %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"))
		}
		shape(c.method+" "+c.path, b, 405)
	}
	resp, _ := http.Get(rt.api.URL + "/v2/nothing")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("unknown path: %d", resp.StatusCode)
	}
	shape("404", b, 404)

	body := `{"model":"vllm-sim","prompt":"hi","max_tokens":2}`
	for ct, want := range map[string]int{"application/x-www-form-urlencoded": 400, "": 400, "text/plain": 400,
		"application/json; charset=utf-8": 200, "Application/JSON": 200} {
		req, _ := http.NewRequest("POST", rt.api.URL+"/v1/completions", strings.NewReader(body))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Content-Type %q: %d %s", ct, resp.StatusCode, b)
		}
		if want == 400 {
			shape("content type "+ct, b, 400)
		}
	}
}

// A pod that leaves takes its predictions, its policy windows and its metric series with it.
func TestRemovedPodLeavesNoState(t *testing.T) {
	a, b := startSim(t, vllmsim.Config{KVEventsPort: 0}), startSim(t, vllmsim.Config{KVEventsPort: 0})
	src := newPushSource([]discovery.Engine{simEngine("e0", a), simEngine("e1", b)})
	rt := startRouter(t, src, func(o *Options) { o.Config.Policy = "round-robin"; o.PredictedTTL = time.Hour })
	for i := range 4 {
		if r := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(110_000+i, 64, i, 1, 1)); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	scrape := func() string {
		resp, err := http.Get(rt.admin.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if !strings.Contains(scrape(), `engine="e1"`) || rt.s.ledger.Stats().Predicted != 4*4 {
		t.Fatalf("before removal: predicted %d", rt.s.ledger.Stats().Predicted)
	}
	src.ch <- []discovery.Engine{simEngine("e0", a)}
	testkit.WaitFor(t, waitBound, "e1 removed", func() bool { return len(rt.s.Engines()) == 1 })
	if m := scrape(); strings.Contains(m, `engine="e1"`) {
		t.Errorf("series of the removed engine still exported")
	}
	if n := rt.s.ledger.Stats().Predicted; n != 2*4 {
		t.Errorf("predicted side index holds %d entries, want e0's 8", n)
	}
	pol, err := score.New(rt.s.policy, score.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, ok := pol.(score.Forgetter)
	if rt.s.policy == "kv" && !ok {
		t.Error("the kv policy cannot forget a replica")
	}
}
