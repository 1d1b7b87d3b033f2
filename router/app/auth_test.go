package app

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// postAuth posts with an Authorization header ("" for none).
func postAuth(t *testing.T, url, body, auth string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) answer {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return answer{resp.StatusCode, resp.Header, b.Bytes()}
}

// lockedBuf collects logs from concurrent goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// Engines started with --api-key: with the key the router renders (text and chat), reads the
// models and adapters, probes and forwards, so routing is exact with no tokenizer failure,
// whatever the client sent as its own Authorization (the router replaces it).
func TestEngineAPIKeyEveryCall(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{APIKeys: []string{"engine-key"}, LoRAAdapters: []string{"ad1"}})
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) { o.EngineAPIKey = "engine-key" })
	rt.waitStreams(t, "exact")
	for _, e := range rt.s.Engines() {
		if e.Model != "vllm-sim" {
			t.Fatalf("engine %s model %q: /v1/models not read with the key", e.Name, e.Model)
		}
	}
	warm := `{"model":"vllm-sim","max_tokens":1,"prompt":"` + strings.Repeat("shared prefix text ", 40) + `first"}`
	if a := postAuth(t, f.sims[2].URL()+"/v1/completions", warm, "Bearer engine-key"); a.status != 200 {
		t.Fatalf("warm-up: %d %s", a.status, a.body)
	}
	testkit.WaitFor(t, waitBound, "the prefix indexed", func() bool { return rt.s.Engines()[2].Ranks[0].Blocks["GPU"] >= 20 })
	next := strings.Replace(warm, "first", "second", 1)
	for _, client := range []string{"", "Bearer some-gateway-key", "Basic dXNlcjpwdw=="} {
		a := postAuth(t, rt.api.URL+"/v1/completions", next, client)
		if a.status != 200 || a.header.Get("x-kvroute-engine") != "e2" {
			t.Fatalf("client auth %q: %d to %q: %s", client, a.status, a.header.Get("x-kvroute-engine"), a.body)
		}
		if pred := a.header.Get("x-kvroute-predicted-cached-tokens"); pred == "0" || pred != itoa(a.cachedTokens(t)) {
			t.Fatalf("predicted %s, engine cached %d", pred, a.cachedTokens(t))
		}
	}
	chat := `{"model":"ad1","max_tokens":1,"messages":[{"role":"user","content":"hello through the key"}]}`
	if a := postAuth(t, rt.api.URL+"/v1/chat/completions", chat, ""); a.status != 200 {
		t.Fatalf("chat on the adapter: %d %s", a.status, a.body)
	}
	// The adapter was discovered through the guarded /v1/models: its requests carry the LoRA
	// identity.
	var ans RouteAnswer
	if a := postJSON(t, rt.admin.URL+"/debug/route", chat); a.status != 200 || json.Unmarshal(a.body, &ans) != nil || ans.LoRA != "ad1" {
		t.Fatalf("debug route %d %s", a.status, a.body)
	}
	req, _ := http.NewRequest(http.MethodGet, rt.api.URL+"/v1/models", nil)
	if a := do(t, req); a.status != 200 || !bytes.Contains(a.body, []byte(`"ad1"`)) {
		t.Fatalf("GET /v1/models: %d %s", a.status, a.body)
	}
	if n := testutil.ToFloat64(rt.s.met.TokenizeFailures); n != 0 {
		t.Fatalf("%v tokenizer failures", n)
	}
	for _, c := range authCalls {
		if n := testutil.ToFloat64(rt.s.met.EngineAuth.WithLabelValues(c)); n != 0 {
			t.Fatalf("%v auth failures on %s", n, c)
		}
	}
}

// Without an engine key the client's Authorization is forwarded unchanged (a platform may
// hand clients the engine key); the router's own calls carry none, so against guarded
// engines its renders fail: counted as the router's misconfiguration (once in the log),
// never returned to the client as an error.
func TestNoEngineKeyPassesClientAuthorization(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{APIKeys: []string{"engine-key"}})
	var logs lockedBuf
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	body := `{"model":"vllm-sim","max_tokens":1,"prompt":"text needs a render"}`
	for range 3 {
		if a := postAuth(t, rt.api.URL+"/v1/completions", body, "Bearer engine-key"); a.status != 200 {
			t.Fatalf("client holding the engine key: %d %s", a.status, a.body)
		}
	}
	// The engine, not the router, judges a client without the key.
	if a := postAuth(t, rt.api.URL+"/v1/completions", body, ""); a.status != 401 || string(bytes.TrimSpace(a.body)) != `{"error":"Unauthorized"}` {
		t.Fatalf("client without a key: %d %s", a.status, a.body)
	}
	if n := testutil.ToFloat64(rt.s.met.EngineAuth.WithLabelValues(callTokenize)); n < 1 {
		t.Fatalf("tokenize auth failures %v", n)
	}
	// At least once per engine when added (and again each time a probe tries to read them).
	if n := testutil.ToFloat64(rt.s.met.EngineAuth.WithLabelValues(callModels)); n < 2 {
		t.Fatalf("models auth failures %v, want one per engine at least", n)
	}
	if n := testutil.ToFloat64(rt.s.met.Errors.WithLabelValues("", "kv", "bad_request")); n != 0 {
		t.Fatalf("counted as a client error %v times", n)
	}
	if got := strings.Count(logs.String(), "call=tokenize"); got != 1 {
		t.Fatalf("tokenize auth failure logged %d times:\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), "the router has none") {
		t.Fatalf("the log does not say what to fix:\n%s", logs.String())
	}
}

// A wrong engine key: every engine refuses the router; the client gets a 502 that says so,
// never the engine's 401 (which would blame the client's own key).
func TestWrongEngineKeyIsNotTheClientsFault(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{APIKeys: []string{"new-key"}})
	var logs lockedBuf
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) {
		o.EngineAPIKey = "old-key"
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	a := postAuth(t, rt.api.URL+"/v1/completions", idsPrompt(5, 32, 1, 3, 1), "Bearer new-key")
	if a.status != http.StatusBadGateway || !bytes.Contains(a.body, []byte("engine API key")) {
		t.Fatalf("%d %s", a.status, a.body)
	}
	if n := testutil.ToFloat64(rt.s.met.EngineAuth.WithLabelValues(callGenerate)); n != 2 {
		t.Fatalf("generate auth failures %v, want one per engine tried", n)
	}
	req, _ := http.NewRequest(http.MethodGet, rt.api.URL+"/v1/models", nil)
	if a := do(t, req); a.status != http.StatusBadGateway {
		t.Fatalf("GET /v1/models with the wrong key: %d %s", a.status, a.body)
	}
	if !strings.Contains(logs.String(), "differs from theirs") {
		t.Fatalf("the log does not say what to fix:\n%s", logs.String())
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// An SGLang fleet started with --api-key (the operator renders it from
// spec.engine.apiKeySecretRef): SGLang guards every path but /health and /metrics, its
// /tokenize and /v1/models included, so the router's key must reach each call for the routing
// to stay exact; the client's own Authorization is replaced.
func TestEngineAPIKeySGLang(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{EngineKind: "sglang", APIKeys: []string{"engine-key"}})
	// The engine itself refuses a call without the key, /tokenize included.
	if a := postAuth(t, f.sims[0].URL()+"/tokenize", `{"prompt":"x"}`, ""); a.status != http.StatusUnauthorized {
		t.Fatalf("SGLang-shaped engine answered /tokenize without the key: %d", a.status)
	}
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) {
		o.Config.EngineKind = "sglang"
		o.EngineAPIKey = "engine-key"
	})
	rt.waitStreams(t, "exact")
	for _, e := range rt.s.Engines() {
		if e.Model != "vllm-sim" {
			t.Fatalf("engine %s model %q: /v1/models not read with the key", e.Name, e.Model)
		}
	}
	prompt := `{"model":"vllm-sim","max_tokens":1,"prompt":"` + strings.Repeat("shared prefix text ", 40) + `%s"}`
	for i, client := range []string{"", "Bearer some-gateway-key", ""} {
		a := postAuth(t, rt.api.URL+"/v1/completions", strings.Replace(prompt, "%s", itoa(i), 1), client)
		if a.status != 200 {
			t.Fatalf("client auth %q: %d %s", client, a.status, a.body)
		}
		got := a.cachedTokens(t)
		if pred := a.header.Get("x-kvroute-predicted-cached-tokens"); pred != itoa(got) || (i > 0 && got == 0) {
			t.Fatalf("request %d: predicted %s, engine cached %d", i, pred, got)
		}
		testkit.WaitFor(t, waitBound, "the prompt indexed", func() bool {
			n, c := 0, 0
			for _, e := range rt.s.Engines() {
				for _, r := range e.Ranks {
					n += r.Blocks["GPU"]
				}
			}
			for _, s := range f.sims {
				for _, r := range s.CacheState().Ranks {
					c += len(r.Hashes)
				}
			}
			return n == c && c > 0
		})
	}
	if n := testutil.ToFloat64(rt.s.met.TokenizeFailures); n != 0 {
		t.Fatalf("%v tokenizer failures", n)
	}
	if n := testutil.ToFloat64(rt.s.met.TokenizeSource.WithLabelValues("engine")); n == 0 {
		t.Fatal("no prompt tokenized through SGLang's guarded /tokenize")
	}
}
