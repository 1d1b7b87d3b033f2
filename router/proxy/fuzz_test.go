package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The stream path never panics on malformed events, and a well-formed stream (a choice first,
// every event whole) comes out byte-identical. A torn last event (bytes after the last blank
// line, e.g. after [DONE]) is not an event and is not forwarded: the client's SSE parser would
// drop it too.
func FuzzStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[{}]}\r\n\r\n: comment\n\nnot sse at all"))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":\"x\"}}}\n\n"))
	f.Add([]byte("data: {\"error\":{\"message\":\"x\",\"code\":\"y\"}}\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		first, _ := (&eventReader{br: bufio.NewReader(bytes.NewReader(in))}).next()
		wellFormed := classify(first, APIOpenAI).kind == evChoice && complete(in)
		for _, drop := range []bool{false, true} {
			rec := httptest.NewRecorder()
			ctx, cancel := context.WithCancelCause(context.Background())
			resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(in))}
			p := New(Options{})
			out := p.stream(context.Background(), ctx, cancel, time.NewTimer(time.Hour), rec,
				&Request{Stream: true, DropUsageChunk: drop}, resp, time.Now(), Outcome{Status: 200})
			cancel(nil)
			if !drop && out.Started() && !(out.Phase == Cut) && wellFormed && !bytes.Equal(rec.Body.Bytes(), in) {
				t.Fatalf("copy changed the stream:\n%q\n%q", in, rec.Body.Bytes())
			}
		}
	})
}

// A rewrite of any JSON object is valid JSON that decodes to the object with the keys set.
func FuzzRewrite(f *testing.F) {
	f.Add([]byte(`{"a":1,"stream_options":{"x":null}}`))
	f.Add([]byte(`{"stream_options":null}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		var m map[string]any
		if json.Unmarshal(in, &m) != nil {
			return
		}
		out, err := Rewrite{IncludeUsage: true, FullReport: true}.Apply(in)
		if err != nil {
			return // a non-object stream_options or vllm_xargs
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%q -> invalid %q", in, out)
		}
		so, _ := got["stream_options"].(map[string]any)
		xa, _ := got["vllm_xargs"].(map[string]any)
		if so["include_usage"] != true || xa["kv_cache_report_mode"] != "full" || len(got) < len(m) {
			t.Fatalf("%q -> %q", in, out)
		}
	})
}
