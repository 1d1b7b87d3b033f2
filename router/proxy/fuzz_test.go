package proxy

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

// Without dropping, the SSE copy is the identity on any byte stream; with dropping, the output
// is the input minus whole events. Neither may panic on malformed events.
func FuzzCopyStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[{}]}\r\n\r\n: comment\n\nnot sse at all"))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":\"x\"}}}\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		rec := httptest.NewRecorder()
		if _, err := copyStream(rec, http.NewResponseController(rec), bytes.NewReader(in), false); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rec.Body.Bytes(), in) {
			t.Fatalf("copy changed the stream:\n%q\n%q", in, rec.Body.Bytes())
		}
		rec = httptest.NewRecorder()
		_, _ = copyStream(rec, http.NewResponseController(rec), bytes.NewReader(in), true)
		if rec.Body.Len() > len(in) {
			t.Fatal("dropping grew the stream")
		}
	})
}
