package tokens

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// counted fronts a vllm-sim with a proxy that counts its render calls.
func counted(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	sim := startSim(t)
	u, _ := url.Parse(sim.URL())
	var n atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/render") || r.URL.Path == "/tokenize" {
			n.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &n
}

// With a render server (`vllm launch render`; a vllm-sim stands in for it: the same render
// routes) the serving engine renders nothing: measured before and after on 10 distinct chats
// and 10 completions, the engine's render calls go from 20 to 0 and the tokens are the same.
// A render server that is down or fails falls back to the engine, counted; one that refuses
// the request (a 4xx about it) is the engine's answer and is not retried there.
func TestRenderServerSparesTheEngines(t *testing.T) {
	engineURL, engineCalls := counted(t)
	renderURL, renderCalls := counted(t)
	bodies := func(k int) (out [][]byte, kinds []Kind) {
		for i := range 10 {
			out = append(out, fmt.Appendf(nil, `{"model":"vllm-sim","messages":[{"role":"user","content":"question %d of round %d"}]}`, i, k))
			kinds = append(kinds, Chat)
			out = append(out, fmt.Appendf(nil, `{"model":"vllm-sim","prompt":"text %d of round %d"}`, i, k))
			kinds = append(kinds, Completion)
		}
		return out, kinds
	}
	run := func(tk *Tokenizer, k int) [][]uint32 {
		t.Helper()
		bs, kinds := bodies(k)
		var out [][]uint32
		for i, b := range bs {
			r, err := Parse(kinds[i], b)
			if err != nil {
				t.Fatal(err)
			}
			toks, _, err := tk.Tokens(context.Background(), engineURL, r, b)
			if err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			out = append(out, toks)
		}
		return out
	}
	before := run(New(Options{}), 0)
	if e, r := engineCalls.Load(), renderCalls.Load(); e != 20 || r != 0 {
		t.Fatalf("before: engine %d render calls, render server %d; want 20, 0", e, r)
	}
	engineCalls.Store(0)
	tk := New(Options{RenderURL: renderURL + "/"})
	after := run(tk, 0)
	if e, r := engineCalls.Load(), renderCalls.Load(); e != 0 || r != 20 {
		t.Fatalf("after: engine %d render calls, render server %d; want 0, 20", e, r)
	}
	for i := range before {
		if !slices.Equal(before[i], after[i]) {
			t.Fatalf("prompt %d renders differently on the render server: %v vs %v", i, after[i], before[i])
		}
	}
	if st := tk.Stats(); st.RenderServer != 20 || st.RenderFallbacks != 0 {
		t.Fatalf("stats %+v", st)
	}

	// The render server down: every render falls back to the engine, counted.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	engineCalls.Store(0)
	tk = New(Options{RenderURL: deadURL})
	run(tk, 1)
	if st := tk.Stats(); st.RenderFallbacks != 20 || st.RenderServer != 0 || engineCalls.Load() != 20 {
		t.Fatalf("render server down: stats %+v, engine calls %d", st, engineCalls.Load())
	}
	// A 5xx from it: the engine renders, counted.
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"message":"boom","type":"InternalServerError","code":500}}`, http.StatusInternalServerError)
	}))
	t.Cleanup(failing.Close)
	tk = New(Options{RenderURL: failing.URL})
	run(tk, 2)
	if st := tk.Stats(); st.RenderFallbacks != 20 {
		t.Fatalf("render server 500: stats %+v", st)
	}
	// Its refusal of the request itself is the answer: not rendered again on the engine.
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"message":"too long","type":"BadRequestError","code":400}}`))
	}))
	t.Cleanup(refusing.Close)
	engineCalls.Store(0)
	tk = New(Options{RenderURL: refusing.URL})
	b := []byte(`{"model":"vllm-sim","messages":[{"role":"user","content":"x"}]}`)
	r, _ := Parse(Chat, b)
	if _, _, err := tk.Tokens(context.Background(), engineURL, r, b); !IsClientError(err) || engineCalls.Load() != 0 {
		t.Fatalf("refusal: err %v, engine calls %d", err, engineCalls.Load())
	}
}
