package vllmsim

import (
	"net/http"
	"testing"
)

// With --api-key the sim guards what vLLM guards (GUARDED_PREFIX in vLLM's
// vllm/entrypoints/serve/utils/server_utils.py): every path under /v1 — generation, the render
// endpoints, /v1/models — needs "Bearer <key>" and answers vLLM's bare {"error":"Unauthorized"}
// otherwise; /tokenize, /detokenize, /health and /metrics stay open.
func TestAPIKeyGuardsWhatVLLMGuards(t *testing.T) {
	cfg := fastConfig()
	cfg.APIKeys = []string{"k-one", "k-two"}
	s := startSim(t, cfg)
	comp := map[string]any{"model": "m", "prompt": "hi", "max_tokens": 1}
	guarded := []struct {
		method, path string
		body         any
	}{
		{"POST", "/v1/completions", comp},
		{"POST", "/v1/chat/completions", map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_tokens": 1}},
		{"POST", "/v1/completions/render", comp},
		{"POST", "/v1/chat/completions/render", map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": "hi"}}}},
		{"GET", "/v1/models", nil},
		{"GET", "/v1/no-such-thing", nil}, // the middleware runs before routing, as in vLLM
	}
	for _, g := range guarded {
		for _, auth := range []string{"", "Bearer nope", "Basic k-one", "k-one", "Bearer  k-one"} {
			res := request(t, s, g.method, g.path, g.body, auth)
			if res.status != http.StatusUnauthorized || string(res.body) != `{"error":"Unauthorized"}` ||
				res.header.Get("Content-Type") != "application/json" {
				t.Errorf("%s %s with %q: %d %q, want 401 {\"error\":\"Unauthorized\"}", g.method, g.path, auth, res.status, res.body)
			}
		}
		if g.path == "/v1/no-such-thing" {
			continue
		}
		for _, auth := range []string{"Bearer k-one", "bearer k-two", "BEARER k-one"} {
			if res := request(t, s, g.method, g.path, g.body, auth); res.status != http.StatusOK {
				t.Errorf("%s %s with %q: %d %s", g.method, g.path, auth, res.status, res.body)
			}
		}
	}
	open := []struct {
		method, path string
		body         any
	}{
		{"POST", "/tokenize", map[string]any{"model": "m", "prompt": "hi"}},
		{"POST", "/detokenize", map[string]any{"model": "m", "tokens": []int{300}}},
		{"GET", "/health", nil},
		{"GET", "/metrics", nil},
	}
	for _, o := range open {
		if res := request(t, s, o.method, o.path, o.body, ""); res.status != http.StatusOK {
			t.Errorf("%s %s without a key: %d %s, want 200 (vLLM leaves it open)", o.method, o.path, res.status, res.body)
		}
	}
	// CORS preflight is never checked (it reaches the mux, which has no OPTIONS route).
	if res := request(t, s, http.MethodOptions, "/v1/completions", nil, ""); res.status == http.StatusUnauthorized {
		t.Errorf("OPTIONS answered 401")
	}
}

func TestAPIKeyRejectsEmptyKey(t *testing.T) {
	cfg := fastConfig()
	cfg.APIKeys = []string{""}
	if _, err := New(cfg); err == nil {
		t.Fatal("an empty key was accepted")
	}
}

func request(t *testing.T, s *Sim, method, path string, body any, auth string) httpResult {
	t.Helper()
	if method == http.MethodPost {
		if auth == "" {
			return post(t, s, path, body)
		}
		return post(t, s, path, body, "Authorization", auth)
	}
	req, err := http.NewRequest(method, s.URL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	return do(t, req)
}
