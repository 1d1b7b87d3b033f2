package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func doAPI(p *Proxy, url string, api API, onFirst func()) (Outcome, *httptest.ResponseRecorder) {
	rec := httptest.NewRecorder()
	out := p.Do(context.Background(), rec, Target{URL: url, Rank: -1}, &Request{Path: "/v1/x",
		Body: []byte(`{}`), Header: http.Header{}, Stream: true, API: api, OnFirstToken: onFirst})
	return out, rec
}

// A Responses stream: the first token is the first delta event (not response.created), the id
// comes from response.created, usage from response.completed, which also ends the stream (it
// has no [DONE]).
func TestResponsesStreamEvents(t *testing.T) {
	created := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_7\",\"status\":\"in_progress\"}}\n\n"
	delta := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n"
	done := "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_7\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1,\"input_tokens_details\":{\"cached_tokens\":8}}}}\n\n"
	url := sseEngine(t, 0, created, delta, done)
	firsts := 0
	out, rec := doAPI(New(Options{}), url, APIResponses, func() { firsts++ })
	if out.Err != nil || out.Phase != Answered || firsts != 1 || out.ResponseID != "resp_7" {
		t.Fatalf("outcome %+v, first tokens %d", out, firsts)
	}
	if u := out.Usage; u == nil || u.PromptTokens != 12 || u.CachedTokens != 8 || !u.HasCached || u.CompletionTokens != 1 {
		t.Fatalf("usage %+v", out.Usage)
	}
	if rec.Body.String() != created+delta+done {
		t.Fatalf("client saw %q", rec.Body.String())
	}
	// Held until the first delta: an error event before it is retryable, nothing written.
	url = sseEngine(t, 0, created, "event: error\ndata: {\"type\":\"error\",\"code\":\"x\",\"message\":\"boom\",\"param\":null}\n\n")
	rec = httptest.NewRecorder()
	out = New(Options{}).Do(context.Background(), rec, Target{URL: url, Rank: -1}, &Request{Path: "/v1/responses",
		Body: []byte(`{}`), Header: http.Header{}, Stream: true, API: APIResponses, MayRetry: true})
	if !out.Retryable() || out.EngineError != "boom" || rec.Body.Len() != 0 {
		t.Fatalf("error before the first delta: %+v, client saw %q", out, rec.Body.String())
	}
}

// A Messages stream: the first token is content_block_delta, usage merged from message_start
// (input) and message_delta (output), the end at message_stop (vLLM also sends [DONE]).
func TestMessagesStreamEvents(t *testing.T) {
	start := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":20,\"output_tokens\":0}}}\n\n"
	ping := "event: ping\ndata: {\"type\":\"ping\"}\n\n"
	delta := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n"
	md := "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":0,\"output_tokens\":3}}\n\n"
	stop := "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	url := sseEngine(t, 0, start, ping, delta, md, stop)
	firsts := 0
	out, rec := doAPI(New(Options{}), url, APIMessages, func() { firsts++ })
	if out.Err != nil || (out.Phase == Cut) || firsts != 1 {
		t.Fatalf("outcome %+v, first tokens %d", out, firsts)
	}
	if u := out.Usage; u == nil || u.PromptTokens != 20 || u.CompletionTokens != 3 {
		t.Fatalf("usage %+v", out.Usage)
	}
	if rec.Body.String() != start+ping+delta+md+stop {
		t.Fatalf("client saw %q", rec.Body.String())
	}
	// Cut after the first token: the error event is the Messages API's.
	url = sseEngine(t, 0, start, delta)
	out, rec = doAPI(New(Options{}), url, APIMessages, nil)
	body := rec.Body.String()
	if !(out.Phase == Cut) || !strings.Contains(body, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"InternalServerError\"") {
		t.Fatalf("cut %+v, client saw %q", out, body)
	}
}

// A non-streamed Responses answer: its id and usage are read from the body.
func TestResponsesWholeAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"id":"resp_9","object":"response","usage":{"input_tokens":5,"output_tokens":2,"input_tokens_details":{"cached_tokens":0}}}`))
	}))
	t.Cleanup(srv.Close)
	rec := httptest.NewRecorder()
	out := New(Options{}).Do(context.Background(), rec, Target{URL: srv.URL, Rank: -1}, &Request{Path: "/v1/responses",
		Body: []byte(`{}`), Header: http.Header{}, API: APIResponses})
	if out.ResponseID != "resp_9" || out.Usage == nil || out.Usage.PromptTokens != 5 || !out.Usage.HasCached {
		t.Fatalf("outcome %+v usage %+v", out, out.Usage)
	}
}

func TestErrorShapes(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, http.StatusBadRequest, "bad")
	if rec.Body.String() != `{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`+"\n" {
		t.Fatalf("openai %s", rec.Body.String())
	}
	rec = httptest.NewRecorder()
	WriteErrorFor(rec, APIMessages, http.StatusServiceUnavailable, "none")
	if rec.Body.String() != `{"type":"error","error":{"type":"Service Unavailable","message":"none"}}`+"\n" || rec.Code != 503 {
		t.Fatalf("messages %d %s", rec.Code, rec.Body.String())
	}
	if got := string(OpenAIErrorAsMessages([]byte(`{"error":{"message":"m","type":"NotFoundError","param":"model","code":404}}`))); got != `{"type":"error","error":{"type":"NotFoundError","message":"m"}}` {
		t.Fatalf("translated %s", got)
	}
}

// ReadAnswer reads a whole answer's usage in each dialect, a Responses answer's id, an error
// body's message, and the usage of an answer whose id is not a string.
func TestReadAnswer(t *testing.T) {
	for _, c := range []struct {
		api           API
		body          string
		prompt, cache int
		id, err       string
	}{
		{APIOpenAI, `{"id":"cmpl-1","usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":8}}}`, 9, 8, "", ""},
		{APIResponses, `{"id":"resp_1","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":8}}}`, 9, 8, "resp_1", ""},
		{APIMessages, `{"id":"msg_1","usage":{"input_tokens":9,"cache_read_input_tokens":8}}`, 9, 8, "", ""},
		{APIResponses, `{"id":7,"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":8}}}`, 9, 8, "", ""},
		{APIOpenAI, `{"error":{"message":"bad max_tokens","code":400}}`, -1, -1, "", "bad max_tokens"},
	} {
		u, id, msg := ReadAnswer([]byte(c.body), c.api)
		if c.prompt < 0 {
			if u != nil || msg != c.err {
				t.Errorf("%s: usage %+v message %q", c.body, u, msg)
			}
			continue
		}
		if u == nil || u.PromptTokens != c.prompt || u.CachedTokens != c.cache || !u.HasCached || id != c.id || msg != c.err {
			t.Errorf("%s: usage %+v id %q message %q", c.body, u, id, msg)
		}
	}
}
