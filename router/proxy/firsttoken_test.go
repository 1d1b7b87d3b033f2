package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim/vllmsim"
)

// sseEngine answers with status 200 and its headers at once (as vLLM does), then writes the
// given events with a pause before each, then ends (cleanly: the handler returns).
func sseEngine(t *testing.T, pause time.Duration, events ...string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		for _, e := range events {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(pause):
			}
			_, _ = w.Write([]byte(e))
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func doStream(p *Proxy, url string, mayRetry bool, onFirst func()) (Outcome, *httptest.ResponseRecorder) {
	rec := httptest.NewRecorder()
	out := p.Do(context.Background(), rec, Target{URL: url, Rank: -1}, &Request{Path: "/v1/completions",
		Body: []byte(`{}`), Header: http.Header{}, Stream: true, MayRetry: mayRetry, OnFirstToken: onFirst})
	return out, rec
}

const tok = "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"

// Headers and keep-alive comments are not the first token: nothing reaches the client until a
// data event with a choice does, and TTFT is measured to it, HeadersAfter to the headers.
func TestFirstTokenIsFirstChoice(t *testing.T) {
	url := sseEngine(t, 60*time.Millisecond, ": keep-alive\n\n", ": keep-alive\n\n", tok, "data: [DONE]\n\n")
	var firstAt time.Duration
	t0 := time.Now()
	out, rec := doStream(New(Options{}), url, true, func() { firstAt = time.Since(t0) })
	if out.Err != nil || !out.Started() || (out.Phase == Cut) {
		t.Fatalf("outcome %+v", out)
	}
	if firstAt < 150*time.Millisecond || out.TTFT < 150*time.Millisecond || out.TTFT-out.HeadersAfter < 100*time.Millisecond {
		t.Fatalf("first token at %v (TTFT %v, headers after %v): headers or comments counted as the first token", firstAt, out.TTFT, out.HeadersAfter)
	}
	if rec.Body.String() != tok+"data: [DONE]\n\n" {
		t.Fatalf("client saw %q", rec.Body.String())
	}
}

// Every failure before the first token leaves the client untouched and is retryable: an
// in-stream error event, an end without a token, a reset, a first-token timeout, a refused dial.
func TestFailuresBeforeFirstTokenRetryable(t *testing.T) {
	errEv := `data: {"error":{"message":"engine dead","type":"InternalServerError","param":null,"code":500}}` + "\n\n"
	cases := map[string]struct {
		url  string
		p    *Proxy
		kind string
	}{
		"error event":  {sseEngine(t, time.Millisecond, ": keep-alive\n\n", errEv, "data: [DONE]\n\n"), New(Options{}), KindEngineError},
		"no token":     {sseEngine(t, time.Millisecond, ": keep-alive\n\n"), New(Options{}), KindEOF},
		"slow prefill": {sseEngine(t, 2*time.Second, tok), New(Options{FirstTokenTimeout: 100 * time.Millisecond}), KindFirstTokenTimeout},
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	cases["refused"] = struct {
		url  string
		p    *Proxy
		kind string
	}{dead.URL, New(Options{}), KindConnect}
	dead.Close()
	for name, c := range cases {
		out, rec := doStream(c.p, c.url, true, func() { t.Errorf("%s: first token reported", name) })
		if !out.Retryable() || out.Started() || out.Kind != c.kind || rec.Body.Len() != 0 || len(rec.Header()) != 0 {
			t.Errorf("%s: outcome %+v, client saw %d %q", name, out, rec.Code, rec.Body.String())
		}
		if (c.kind == KindConnect || c.kind == KindEOF) != out.PodDown() {
			t.Errorf("%s: PodDown %v", name, out.PodDown())
		}
	}
	// The last attempt turns an error event before the first token into an HTTP error with the
	// engine's status and body.
	out, rec := doStream(New(Options{}), cases["error event"].url, false, nil)
	if !out.Started() || rec.Code != 500 || !strings.Contains(rec.Body.String(), `"engine dead"`) {
		t.Fatalf("last attempt: %+v %d %q", out, rec.Code, rec.Body.String())
	}
}

// After the first token a failure is an OpenAI-shaped error event and Cut (the caller aborts
// the connection): an engine that stops without [DONE], and the engine's own error event.
func TestFailureAfterFirstTokenCuts(t *testing.T) {
	for name, c := range map[string]struct {
		events []string
		kind   string
		msg    string
	}{
		"killed":      {[]string{tok, tok}, KindEOF, "ended without [DONE]"},
		"torn":        {[]string{tok, tok, `data: {"choices":[{"te`}, KindEOF, "ended without [DONE]"},
		"engine said": {[]string{tok, `data: {"error":{"message":"oom","type":"InternalServerError","param":null,"code":500}}` + "\n\n", "data: [DONE]\n\n"}, KindEngineError, "oom"},
	} {
		out, rec := doStream(New(Options{}), sseEngine(t, time.Millisecond, c.events...), true, nil)
		body := rec.Body.String()
		if !(out.Phase == Cut) || out.Retryable() || out.Kind != c.kind || !strings.HasPrefix(body, tok+tok) && c.kind == KindEOF {
			t.Errorf("%s: outcome %+v body %q", name, out, body)
		}
		last := body[strings.LastIndex(strings.TrimSuffix(body, "\n\n"), "\n\n")+2:]
		if !strings.HasPrefix(last, `data: {"error":{"message":`) || !strings.Contains(last, c.msg) || !strings.Contains(last, `"param":null`) ||
			strings.Contains(body, "data: [DONE]") {
			t.Errorf("%s: the client's stream ends %q", name, last)
		}
	}
}

// Against vllm-sim with and without headers at acceptance, a stream's first token is the same
// event and the client's bytes are the engine's.
func TestSimBothHeaderModes(t *testing.T) {
	for _, at := range []bool{false, true} {
		sim := startPinnedSim(t, vllmsim.Config{HoldHeaders: !at, SSEKeepAliveInterval: time.Millisecond, PrefillTokensPerS: 2000})
		direct := post(t, sim.URL()+"/v1/completions", streamBody)
		var first bool
		rec := httptest.NewRecorder()
		out := New(Options{}).Do(context.Background(), rec, Target{URL: sim.URL(), Rank: -1}, &Request{
			Path: "/v1/completions", Body: []byte(streamBody), Header: http.Header{}, Stream: true, OnFirstToken: func() { first = true }})
		if out.Err != nil || !first || (out.Phase == Cut) {
			t.Fatalf("at=%v: %+v", at, out)
		}
		strip := func(s string) string { // keep-alives are timing, not content
			return strings.ReplaceAll(s, ": keep-alive\n\n", "")
		}
		if strip(mask(rec.Body.Bytes())) != strip(mask(direct)) {
			t.Fatalf("at=%v: proxied %q vs direct %q", at, rec.Body.String(), direct)
		}
	}
}
