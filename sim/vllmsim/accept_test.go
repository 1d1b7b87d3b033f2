package vllmsim

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"
)

// streamHead posts a streaming completion and returns the response once its headers arrived,
// and how long that took.
func streamHead(t *testing.T, s *Sim, body string) (*http.Response, time.Duration) {
	t.Helper()
	t0 := time.Now()
	resp, err := http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, time.Since(t0)
}

func readEvents(t *testing.T, resp *http.Response) []string {
	t.Helper()
	var evs []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); l != "" {
			evs = append(evs, l)
		}
	}
	return evs
}

// By default the status and headers come before the first token (vLLM's StreamingResponse);
// with HoldHeaders they wait for the first token.
func TestHeadersAtAcceptance(t *testing.T) {
	// A 4000-token prompt at 20000 tokens/s is a 200 ms prefill.
	body := `{"model":"m","stream":true,"max_tokens":2,"prompt":"` + strings.Repeat("ab", 4000) + `"}`
	for _, at := range []bool{false, true} {
		cfg := fastConfig()
		cfg.PrefillTokensPerS, cfg.HoldHeaders = 20000, !at
		s := startSim(t, cfg)
		resp, took := streamHead(t, s, body)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("at=%v: status %d %v", at, resp.StatusCode, resp.Header)
		}
		if at && took > 120*time.Millisecond {
			t.Errorf("headers at acceptance took %v, longer than the prefill", took)
		}
		if !at && took < 150*time.Millisecond {
			t.Errorf("held headers came after %v, before the prefill ended", took)
		}
		evs := readEvents(t, resp)
		if len(evs) < 2 || evs[len(evs)-1] != "data: [DONE]" {
			t.Fatalf("at=%v: events %q", at, evs)
		}
	}
}

// Keep-alive comments fill a silent prefill; an injected failure after acceptance is an
// in-stream error event under 200, then [DONE], as vLLM sends it.
func TestKeepAliveAndInStreamErrors(t *testing.T) {
	cfg := fastConfig()
	cfg.PrefillTokensPerS, cfg.SSEKeepAliveInterval = 20000, 30*time.Millisecond
	s := startSim(t, cfg)
	resp, _ := streamHead(t, s, `{"model":"m","stream":true,"max_tokens":2,"prompt":"`+strings.Repeat("ab", 4000)+`"}`)
	evs := readEvents(t, resp)
	if len(evs) < 2 || evs[0] != ": keep-alive" {
		t.Fatalf("no keep-alive before the first token: %q", evs)
	}

	cfg = fastConfig()
	cfg.FailRate = 1
	s = startSim(t, cfg)
	resp, _ = streamHead(t, s, `{"model":"m","stream":true,"max_tokens":2,"prompt":"hi"}`)
	evs = readEvents(t, resp)
	if resp.StatusCode != 200 || len(evs) != 2 || !strings.HasPrefix(evs[0], `data: {"error":{`) || evs[1] != "data: [DONE]" {
		t.Fatalf("injected failure after acceptance: %d %q", resp.StatusCode, evs)
	}
	for _, k := range []string{`"message"`, `"type"`, `"param":null`, `"code":500`} {
		if !strings.Contains(evs[0], k) {
			t.Errorf("error event %s lacks %s", evs[0], k)
		}
	}
	// With the headers held the same fault is an HTTP 500 before any byte.
	cfg.HoldHeaders = true
	s = startSim(t, cfg)
	resp, _ = streamHead(t, s, `{"model":"m","stream":true,"max_tokens":2,"prompt":"hi"}`)
	if resp.StatusCode != 500 {
		t.Fatalf("fault with held headers: %d", resp.StatusCode)
	}

	cfg = fastConfig()
	cfg.StreamErrorAfter = 3
	s = startSim(t, cfg)
	resp, _ = streamHead(t, s, `{"model":"m","stream":true,"max_tokens":10,"prompt":"hi"}`)
	evs = readEvents(t, resp)
	var data, errs int
	for _, e := range evs {
		switch {
		case strings.HasPrefix(e, `data: {"error"`):
			errs++
		case strings.HasPrefix(e, "data: {"):
			data++
		}
	}
	if data != 3 || errs != 1 || !bytes.Equal([]byte(evs[len(evs)-1]), []byte("data: [DONE]")) {
		t.Fatalf("stream-error-after 3: %d tokens, %d errors: %q", data, errs, evs)
	}
}

// --sse-keep-alive-interval as vLLM's with_sse_keep_alive writes it: ": keep-alive" exactly one
// interval after the last line sent (acceptance, a token or a comment), never on a fixed clock.
// With 500 ms decode steps and a 200 ms interval, each token is followed by comments at about
// +200 and +400 ms (a fixed 200 ms ticker would skip the first: a token was sent in its window).
func TestKeepAliveOneIntervalAfterTheLastLine(t *testing.T) {
	cfg := fastConfig()
	cfg.DecodeMsPerToken, cfg.SSEKeepAliveInterval = 500, 200*time.Millisecond
	s := startSim(t, cfg)
	t0 := time.Now()
	resp, _ := streamHead(t, s, `{"model":"m","stream":true,"max_tokens":3,"prompt":"hi"}`)
	type line struct {
		text string
		at   time.Duration
	}
	lines := []line{{"(headers)", time.Since(t0)}}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); l != "" {
			lines = append(lines, line{l, time.Since(t0)})
		}
	}
	comments, tokens := 0, 0
	for i := 1; i < len(lines); i++ {
		gap := lines[i].at - lines[i-1].at
		switch {
		case lines[i].text == ": keep-alive":
			comments++
			if gap < 190*time.Millisecond || gap > 350*time.Millisecond {
				t.Errorf("keep-alive %v after %q, want one interval (200 ms)", gap, lines[i-1].text)
			}
		case strings.HasPrefix(lines[i].text, "data: {"):
			tokens++
			if tokens > 1 && lines[i-1].text != ": keep-alive" {
				t.Errorf("no keep-alive in the 500 ms before token %d", tokens)
			}
		}
	}
	if tokens != 3 || comments < 4 {
		t.Fatalf("%d tokens, %d keep-alives: %v", tokens, comments, lines)
	}
}
