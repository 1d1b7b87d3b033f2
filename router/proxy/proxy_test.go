package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

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
	cfg.TimeScale = 50
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

func post(t *testing.T, url, body string) []byte {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

const streamBody = `{"model":"vllm-sim","prompt":"the quick brown fox jumps","max_tokens":5,"stream":true,"seed":1}`

// A stream through the proxy is byte-identical to the engine's, and its usage is read.
func TestStreamByteIdentical(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	body := strings.Replace(streamBody, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
	direct := post(t, sim.URL()+"/v1/completions", body)
	p := New(Options{})
	rec := httptest.NewRecorder()
	out := p.Do(context.Background(), rec, Target{URL: sim.URL(), Rank: 0}, &Request{
		Path: "/v1/completions", Body: []byte(body), Header: http.Header{}, Stream: true,
		SetHeaders: func(h http.Header) { h.Set("x-kvroute-engine", "e0") },
	})
	if out.Err != nil || !out.Started() || out.Status != 200 {
		t.Fatalf("outcome %+v", out)
	}
	// Request ids and timestamps differ between two calls; compare with them masked.
	if mask(rec.Body.Bytes()) != mask(direct) {
		t.Fatalf("proxied stream differs:\n%s\nvs direct\n%s", rec.Body.Bytes(), direct)
	}
	if out.Usage == nil || !out.Usage.HasCached || out.Usage.PromptTokens == 0 {
		t.Fatalf("usage %+v", out.Usage)
	}
	if rec.Header().Get("x-kvroute-engine") != "e0" || rec.Header().Get("x-vllm-sim-rank") != "0" {
		t.Fatalf("headers %v", rec.Header())
	}
}

func mask(b []byte) string {
	var out []string
	for line := range strings.Lines(string(b)) {
		if d, ok := strings.CutPrefix(line, "data: {"); ok {
			var m map[string]any
			_ = json.Unmarshal([]byte("{"+d), &m)
			delete(m, "id")
			delete(m, "created")
			j, _ := json.Marshal(m)
			line = "data: " + string(j) + "\n"
		}
		out = append(out, line)
	}
	return strings.Join(out, "")
}

// The router asks for usage; the client, who did not, sees no usage-only chunk.
func TestUsageChunkDropped(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	direct := post(t, sim.URL()+"/v1/completions", streamBody)
	rw := Rewrite{IncludeUsage: true}
	up, err := rw.Apply([]byte(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	out := New(Options{}).Do(context.Background(), rec, Target{URL: sim.URL(), Rank: -1}, &Request{
		Path: "/v1/completions", Body: up, Header: http.Header{}, Stream: true, DropUsageChunk: true})
	if out.Err != nil || out.Usage == nil || !out.Usage.HasCached {
		t.Fatalf("outcome %+v usage %+v", out, out.Usage)
	}
	if bytes.Contains(rec.Body.Bytes(), []byte(`"prompt_tokens"`)) {
		t.Fatalf("usage leaked to the client:\n%s", rec.Body.Bytes())
	}
	if mask(rec.Body.Bytes()) != mask(direct) {
		t.Fatalf("stream differs from what the client asked for:\n%s\nvs\n%s", rec.Body.Bytes(), direct)
	}
}

func TestRankHeaderAndAuthorization(t *testing.T) {
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		_, _ = w.Write([]byte(`{"usage":{"prompt_tokens":3}}`))
	}))
	defer srv.Close()
	rec := httptest.NewRecorder()
	out := New(Options{}).Do(context.Background(), rec, Target{URL: srv.URL, Rank: 1}, &Request{
		Path: "/v1/completions", Body: []byte(`{}`), Header: http.Header{"Authorization": {"Bearer k"}, "Cookie": {"x"}}})
	if got.Get(RankHeader) != "1" || got.Get("Authorization") != "Bearer k" || got.Get("Cookie") != "" {
		t.Fatalf("forwarded headers %v", got)
	}
	if out.Usage == nil || out.Usage.HasCached || out.Usage.PromptTokens != 3 {
		t.Fatalf("usage without details: %+v", out.Usage)
	}
}

// With an engine API key, the engine sees the router's key on every call the shared client
// makes — a forward that carried the client's own Authorization, a probe, a bare GET — and the
// caller's request is left as it was.
func TestEngineAPIKeyReplacesAuthorization(t *testing.T) {
	sim := startSim(t, vllmsim.Config{APIKeys: []string{"engine-key"}})
	p := New(Options{EngineAPIKey: "engine-key"})
	for _, client := range []string{"", "Bearer client-key", "Basic Zm9vOmJhcg=="} {
		h := http.Header{}
		if client != "" {
			h.Set("Authorization", client)
		}
		rec := httptest.NewRecorder()
		out := p.Do(context.Background(), rec, Target{URL: sim.URL(), Rank: -1}, &Request{
			Path: "/v1/completions", Body: []byte(`{"model":"vllm-sim","prompt":"hi","max_tokens":1}`), Header: h})
		if out.Status != 200 || out.Err != nil {
			t.Fatalf("client %q: %+v %s", client, out, rec.Body.Bytes())
		}
		if h.Get("Authorization") != client {
			t.Fatalf("the caller's header changed to %q", h.Get("Authorization"))
		}
	}
	if err := Probe(context.Background(), p.Client(), sim.URL(), time.Second); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, sim.URL()+"/v1/models", nil)
	resp, err := p.Client().Do(req)
	if err != nil || resp.StatusCode != 200 || req.Header.Get("Authorization") != "" {
		t.Fatalf("models: %v %v, caller header %q", resp, err, req.Header.Get("Authorization"))
	}
	resp.Body.Close()
	// Without a key the client's header is what the engine judges.
	rec := httptest.NewRecorder()
	out := New(Options{}).Do(context.Background(), rec, Target{URL: sim.URL(), Rank: -1}, &Request{
		Path: "/v1/completions", Body: []byte(`{"model":"vllm-sim","prompt":"hi","max_tokens":1}`),
		Header: http.Header{"Authorization": {"Bearer engine-key"}}})
	if out.Status != 200 {
		t.Fatalf("pass-through: %+v", out)
	}
}

// An engine refusing the router's own key is the router's misconfiguration: nothing reaches
// the client (which would read a 401 as its own key being wrong), the outcome says why, and
// it may be retried elsewhere (mid-rotation, another engine may take the key).
func TestEngineRefusingRouterKey(t *testing.T) {
	sim := startSim(t, vllmsim.Config{APIKeys: []string{"new-key"}})
	p := New(Options{EngineAPIKey: "old-key"})
	for _, mayRetry := range []bool{true, false} {
		rec := httptest.NewRecorder()
		out := p.Do(context.Background(), rec, Target{URL: sim.URL(), Rank: -1}, &Request{
			Path: "/v1/completions", Body: []byte(`{"model":"vllm-sim","prompt":"hi","max_tokens":1}`), Header: http.Header{},
			MayRetry: mayRetry})
		if !out.AuthRejected() || out.Status != 401 || out.Started() || out.Retryable() != mayRetry || !errors.Is(out.Err, ErrEngineAuth) {
			t.Fatalf("mayRetry %v: %+v", mayRetry, out)
		}
		if rec.Body.Len() != 0 || rec.Code != 200 || len(rec.Header()) != 0 { // 200: the recorder's untouched default
			t.Fatalf("written to the client: %d %v %s", rec.Code, rec.Header(), rec.Body.Bytes())
		}
	}
	if err := Probe(context.Background(), p.Client(), sim.URL(), time.Second); err != nil {
		t.Fatalf("/health is open in vLLM, whatever the key: %v", err)
	}
	req, _ := http.NewRequest(http.MethodGet, sim.URL()+"/v1/models", nil)
	resp, err := p.Client().Do(req)
	if err != nil || resp.StatusCode != 401 {
		t.Fatalf("models with the old key: %v %v", resp, err)
	}
	resp.Body.Close()
}

func TestRetryableBeforeFirstByte(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	p := New(Options{})
	rec := httptest.NewRecorder()
	out := p.Do(context.Background(), rec, Target{URL: srv.URL, Rank: -1}, &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}, MayRetry: true})
	if !out.Retryable() || out.Started() || rec.Body.Len() != 0 {
		t.Fatalf("a 503 with MayRetry must not reach the client: %+v %q", out, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	out = p.Do(context.Background(), rec, Target{URL: srv.URL, Rank: -1}, &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}})
	if out.Retryable() || !out.Started() || rec.Code != 503 {
		t.Fatalf("the last attempt forwards the 503: %+v", out)
	}
	ln := httptest.NewServer(http.NotFoundHandler())
	dead := ln.URL
	ln.Close()
	out = p.Do(context.Background(), httptest.NewRecorder(), Target{URL: dead, Rank: -1}, &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}})
	if !out.Retryable() || out.Err == nil || out.Started() {
		t.Fatalf("a refused connection is retryable: %+v", out)
	}
}

func TestIdleTimeoutCutsSilentStream(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("data: {\"choices\":[{}]}\n\n"))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer srv.Close()
	rec := httptest.NewRecorder()
	t0 := time.Now()
	out := New(Options{IdleTimeout: 100 * time.Millisecond}).Do(context.Background(), rec, Target{URL: srv.URL, Rank: -1},
		&Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}, Stream: true})
	if out.Err == nil || !(out.Phase == Cut) || out.Kind != KindIdleTimeout || time.Since(t0) > 3*time.Second ||
		!strings.HasPrefix(rec.Body.String(), "data: {\"choices\":[{}]}\n\ndata: {\"error\":{") {
		t.Fatalf("outcome %+v after %v, body %q", out, time.Since(t0), rec.Body.String())
	}
}

func TestRewriteMerges(t *testing.T) {
	b, err := Rewrite{IncludeUsage: true, FullReport: true}.Apply([]byte(`{"a":1,"stream_options":{"x":2},"vllm_xargs":{"y":"z"}}`))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		A  int
		SO map[string]any `json:"stream_options"`
		XA map[string]any `json:"vllm_xargs"`
	}
	if err := json.Unmarshal(b, &m); err != nil || m.A != 1 || m.SO["x"] != 2.0 || m.SO["include_usage"] != true ||
		m.XA["y"] != "z" || m.XA["kv_cache_report_mode"] != "full" {
		t.Fatalf("%s", b)
	}
	if _, err := (Rewrite{IncludeUsage: true}).Apply([]byte(`{"stream_options":3}`)); err == nil {
		t.Fatal("a non-object stream_options must be an error")
	}
}

// The rewrite splices: the client's bytes, key order and spacing are kept, only the keys it
// sets change.
func TestRewriteKeepsTheClientsBytes(t *testing.T) {
	for in, want := range map[string]string{
		`{"z": 1, "model":"m",  "n": 1.50}`:                                 `{"z": 1, "model":"m",  "n": 1.50,"stream_options":{"include_usage":true},"vllm_xargs":{"kv_cache_report_mode":"full"}}`,
		`{"stream_options": {"z":true, "include_usage":false}, "a":[1, 2]}`: `{"stream_options": {"z":true, "include_usage":true}, "a":[1, 2],"vllm_xargs":{"kv_cache_report_mode":"full"}}`,
		`{"stream_options":null,"vllm_xargs":{ }}`:                          `{"stream_options":{"include_usage":true},"vllm_xargs":{"kv_cache_report_mode":"full"}}`,
		`{}`: `{"stream_options":{"include_usage":true},"vllm_xargs":{"kv_cache_report_mode":"full"}}`,
	} {
		got, err := Rewrite{IncludeUsage: true, FullReport: true}.Apply([]byte(in))
		if err != nil || string(got) != want {
			t.Errorf("%s:\n got %s %v\nwant %s", in, got, err, want)
		}
		if !json.Valid(got) {
			t.Errorf("%s: invalid JSON %s", in, got)
		}
	}
	for _, bad := range []string{`[1]`, `{"a":1} x`, `{"a":`} {
		if _, err := (Rewrite{IncludeUsage: true}).Apply([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestHealthPassiveBackoff(t *testing.T) {
	h := &Health{Threshold: 2, Backoff: time.Second, MaxBackoff: 4 * time.Second}
	now := time.Unix(1000, 0)
	h.Failure(now, "x")
	if !h.Healthy(now) {
		t.Fatal("one failure is below the threshold")
	}
	h.Failure(now, "x")
	h.ProbedAt(now, nil)
	if h.Healthy(now) || !h.Healthy(now.Add(time.Second)) {
		t.Fatal("two failures: down for 1s")
	}
	h.Failure(now, "x")
	h.Failure(now, "x")
	h.ProbedAt(now, nil)
	if h.Healthy(now.Add(time.Second)) || !h.Healthy(now.Add(2*time.Second)) {
		t.Fatal("second trip: backoff doubles to 2s")
	}
	h.Success()
	if !h.Healthy(now) {
		t.Fatal("success clears")
	}
	h.Probed(io.EOF)
	if h.Healthy(now) {
		t.Fatal("a failed probe takes it out")
	}
}

// A client that goes away cancels the engine request (the engine stops generating).
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	cancelled, serving := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("data: {}\n\n"))
		w.(http.Flusher).Flush()
		close(serving)
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(5 * time.Second):
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	rec := httptest.NewRecorder()
	done := make(chan Outcome)
	go func() {
		done <- New(Options{}).Do(ctx, rec, Target{URL: srv.URL, Rank: -1}, &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}, Stream: true})
	}()
	<-serving // the engine is streaming the request when the client goes
	cancel()
	select {
	case <-cancelled:
	case <-time.After(3 * time.Second):
		t.Fatal("the engine request outlived the client")
	}
	if out := <-done; !out.ClientGone() || out.Retryable() {
		t.Fatalf("outcome %+v", out)
	}
}

// Passive health takes an engine out and keeps it out until a probe that started after the
// failure succeeded, not merely until the backoff ends; a refused connection trips it at once.
func TestHealthWaitsForTheProbe(t *testing.T) {
	h := &Health{Threshold: 3, Backoff: time.Second}
	now := time.Unix(1000, 0)
	h.ProbedAt(now, nil)
	h.Unreachable(now, "refused")
	if h.Healthy(now) {
		t.Fatal("a refused connection must take the engine out at once")
	}
	if h.Healthy(now.Add(time.Hour)) {
		t.Fatal("the backoff ended but no probe has seen the engine since")
	}
	h.ProbedAt(now.Add(-time.Millisecond), nil) // a probe that started before the failure
	if h.Healthy(now.Add(time.Hour)) {
		t.Fatal("a probe older than the failure put the engine back")
	}
	h.ProbedAt(now.Add(500*time.Millisecond), nil)
	if h.Healthy(now.Add(700*time.Millisecond)) || !h.Healthy(now.Add(time.Second)) {
		t.Fatal("after a fresh probe the engine is back once the backoff ended")
	}
	h.Success()
	for range 3 {
		h.Failure(now, "5xx")
	}
	if h.Healthy(now.Add(time.Hour)) {
		t.Fatal("threshold failures: out until probed")
	}
}

// holdHeadersEnv=1 runs every in-process vllm-sim whose test does not pin its timing with the
// simulator's old timing (HoldHeaders: a stream's headers wait for its first token); the default
// is vLLM's (headers at acceptance). `make test` runs the request-path suites both ways.
const holdHeadersEnv = "VLLMSIM_HOLD_HEADERS"

// Outside full mode the router's index counts each BlockStored as a copy, so a client's own
// "full" report mode (which re-announces prefix hits) must not reach the engine.
func TestRewritePinsAClientsReportMode(t *testing.T) {
	rw := Rewrite{PinIncremental: true}
	cases := []struct {
		in, want  string
		overrides bool
	}{
		{`{"prompt":"x","vllm_xargs":{"kv_cache_report_mode":"full","k":1}}`, `{"prompt":"x","vllm_xargs":{"kv_cache_report_mode":"incremental","k":1}}`, true},
		{`{"prompt":"x","vllm_xargs":{"kv_cache_report_mode":"incremental"}}`, `{"prompt":"x","vllm_xargs":{"kv_cache_report_mode":"incremental"}}`, false},
		{`{"prompt":"kv_cache_report_mode"}`, `{"prompt":"kv_cache_report_mode"}`, false},
		{`{"prompt":"x","vllm_xargs":{"k":1}}`, `{"prompt":"x","vllm_xargs":{"k":1}}`, false},
	}
	for _, c := range cases {
		if got := rw.OverridesClientMode([]byte(c.in)); got != c.overrides {
			t.Errorf("OverridesClientMode(%s) = %v, want %v", c.in, got, c.overrides)
		}
		out, err := rw.Apply([]byte(c.in))
		if err != nil {
			t.Fatalf("Apply(%s): %v", c.in, err)
		}
		if string(out) != c.want {
			t.Errorf("Apply(%s) = %s, want %s", c.in, out, c.want)
		}
	}
	// The router's own full mode wins over a client's value either way.
	out, err := Rewrite{FullReport: true, PinIncremental: true}.Apply([]byte(`{"vllm_xargs":{"kv_cache_report_mode":"incremental"}}`))
	if err != nil || string(out) != `{"vllm_xargs":{"kv_cache_report_mode":"full"}}` {
		t.Errorf("full mode: %s, %v", out, err)
	}
}
