package tokens

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/kvroute/kvroute/sim/vllmsim"
)

func startSim(t *testing.T) *vllmsim.Sim {
	t.Helper()
	sim, err := vllmsim.New(vllmsim.Config{})
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

func TestChatRenderedByEngineAndCached(t *testing.T) {
	sim := startSim(t)
	tk := New(Options{})
	body := []byte(`{"model":"vllm-sim","messages":[{"role":"user","content":"hello there"}],"max_tokens":3}`)
	r, err := Parse(Chat, body)
	if err != nil {
		t.Fatal(err)
	}
	got, src, err := tk.Tokens(context.Background(), sim.URL(), r, body)
	if err != nil || src != FromEngine {
		t.Fatalf("src %v err %v", src, err)
	}
	want := vllmsim.Tokenize("<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n")
	if !slices.Equal(got, want) {
		t.Fatalf("tokens %v, want the ChatML render %v", got, want)
	}
	// Same messages, other sampling fields: a cache hit, no engine call.
	body2 := []byte(`{"model":"vllm-sim","messages":[{"role":"user","content":"hello there"}],"max_tokens":9,"stream":true}`)
	r2, _ := Parse(Chat, body2)
	got2, src2, err := tk.Tokens(context.Background(), sim.URL(), r2, body2)
	if err != nil || src2 != FromCache || !slices.Equal(got2, want) {
		t.Fatalf("second: src %v err %v", src2, err)
	}
	// Another turn is another key.
	body3 := []byte(`{"model":"vllm-sim","messages":[{"role":"user","content":"hello there"},{"role":"assistant","content":"hi"},{"role":"user","content":"more"}]}`)
	r3, _ := Parse(Chat, body3)
	got3, src3, err := tk.Tokens(context.Background(), sim.URL(), r3, body3)
	if err != nil || src3 != FromEngine || !slices.Equal(got3[:len(want)-len(vllmsim.Tokenize("<|im_start|>assistant\n"))], want[:len(want)-len(vllmsim.Tokenize("<|im_start|>assistant\n"))]) {
		t.Fatalf("third: src %v err %v", src3, err)
	}
	if st := tk.Stats(); st.EngineCalls != 2 || st.CacheHits != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCompletionTextAndIDs(t *testing.T) {
	sim := startSim(t)
	tk := New(Options{})
	body := []byte(`{"model":"vllm-sim","prompt":"abcdefgh"}`)
	r, err := Parse(Completion, body)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := tk.Tokens(context.Background(), sim.URL(), r, body)
	if err != nil || !slices.Equal(got, vllmsim.Tokenize("abcdefgh")) {
		t.Fatalf("got %v err %v", got, err)
	}
	for _, b := range []string{`{"model":"m","prompt":[5,6,7]}`, `{"model":"m","prompt":[[5,6,7],[1]]}`} {
		r, err := Parse(Completion, []byte(b))
		if err != nil {
			t.Fatal(err)
		}
		ids, src, err := tk.Tokens(context.Background(), "http://127.0.0.1:1", r, []byte(b))
		if err != nil || src != FromIDs || !slices.Equal(ids, []uint32{5, 6, 7}) {
			t.Fatalf("%s: %v %v %v", b, ids, src, err)
		}
	}
}

// An engine without render endpoints (vLLM < 0.15) is asked through /tokenize.
func TestFallbackToTokenize(t *testing.T) {
	sim := startSim(t)
	h := sim.Handler()
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions/render" || r.URL.Path == "/v1/chat/completions/render" {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer old.Close()
	tk := New(Options{})
	body := []byte(`{"model":"vllm-sim","prompt":"xyz!"}`)
	r, _ := Parse(Completion, body)
	got, _, err := tk.Tokens(context.Background(), old.URL, r, body)
	if err != nil || !slices.Equal(got, vllmsim.Tokenize("xyz!")) {
		t.Fatalf("completion fallback: %v %v", got, err)
	}
	cb := []byte(`{"model":"vllm-sim","messages":[{"role":"user","content":"q"}]}`)
	cr, _ := Parse(Chat, cb)
	got, _, err = tk.Tokens(context.Background(), old.URL, cr, cb)
	if err != nil || !slices.Equal(got, vllmsim.Tokenize("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")) {
		t.Fatalf("chat fallback: %v %v", got, err)
	}
}

func TestEngineErrorIsAnError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer srv.Close()
	tk := New(Options{})
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"q"}]}`)
	r, _ := Parse(Chat, body)
	if _, _, err := tk.Tokens(context.Background(), srv.URL, r, body); err == nil {
		t.Fatal("a 500 from the engine must be an error")
	}
	if tk.Stats().Failures != 1 {
		t.Fatal("failure not counted")
	}
}

// Concurrent identical renders share one engine call. The engine is the same handler served
// in memory inside a synctest bubble, so the test can wait until all eight siblings are blocked
// (one in the engine call, the others joined to its flight) before the engine answers.
func TestSiblingsShareOneRender(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		calls := 0
		release := make(chan struct{})
		engine := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			calls++
			mu.Unlock()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			_, _ = w.Write([]byte(`{"token_ids":[1,2,3]}`))
		})
		tk := New(Options{Client: &http.Client{Transport: handlerTransport{engine}}})
		body := []byte(`{"model":"m","messages":[{"role":"user","content":"q"}]}`)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				r, _ := Parse(Chat, body)
				ids, _, err := tk.Tokens(context.Background(), "http://engine", r, body)
				if err == nil && !slices.Equal(ids, []uint32{1, 2, 3}) {
					t.Errorf("ids %v", ids)
				}
				errs <- err
			})
		}
		synctest.Wait() // every sibling is in the engine call or waiting on one
		if n := tk.Stats().CacheMisses; n != 8 {
			t.Fatalf("%d cache misses before the engine answered, want 8", n)
		}
		close(release)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if calls != 1 {
			t.Fatalf("%d engine calls for 8 identical siblings, want 1", calls)
		}
	})
}

// handlerTransport serves each request with h in memory, on the caller's goroutine.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, req)
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	return rec.Result(), nil
}

func TestParseRejects(t *testing.T) {
	cases := []struct {
		kind Kind
		body string
	}{
		{Chat, `{`},
		{Chat, `[]`},
		{Chat, `{"messages":[{"role":"user","content":"x"}]}`},
		{Chat, `{"model":"m"}`},
		{Chat, `{"model":"m","messages":[]}`},
		{Chat, `{"model":"m","messages":"hi"}`},
		{Chat, `{"model":"m","messages":[{}],"stream":"yes"}`},
		{Completion, `{"model":"m"}`},
		{Completion, `{"model":"m","prompt":[]}`},
		{Completion, `{"model":"m","prompt":[-1]}`},
		{Completion, `{"model":"m","prompt":[1.5]}`},
		{Completion, `{"model":"m","prompt":{"a":1}}`},
		{Completion, `{"model":7,"prompt":"x"}`},
		{Completion, `{"model":"m","prompt":"x"} {}`},
	}
	for _, c := range cases {
		if _, err := Parse(c.kind, []byte(c.body)); err == nil || !IsBadRequest(err) {
			t.Errorf("%s %s: err %v, want a bad request", c.kind, c.body, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":[1,2]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, k := range []Kind{Chat, Completion} {
			if _, err := Parse(k, b); err != nil && !IsBadRequest(err) {
				t.Fatalf("non-400 error %v", err)
			}
		}
	})
}

func TestParseIDs(t *testing.T) {
	for in, want := range map[string][]uint32{
		`[1,2,3]`: {1, 2, 3}, ` [ 0 , 2147483647 ] `: {0, 2147483647}, `[]`: {},
		`[2147483648,4294967295]`: {1 << 31, 1<<32 - 1}, `[-0]`: {0},
	} {
		got, err := parseIDs([]byte(in))
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %v %v", in, got, err)
		}
	}
	// Not a token-id array: the caller tries the other prompt forms.
	for _, in := range []string{`[1,]`, `[01]`, `[1.0]`, `[1e3]`, `[4294967296.0]`, `[1 2]`, `[1]x`, `["a"]`, `[`, ``, `[-]`, `[-a]`, `[--1]`} {
		if _, err := parseIDs([]byte(in)); err != errNotIDs {
			t.Errorf("%s: err %v, want errNotIDs", in, err)
		}
	}
	// Integers out of range: a bad request naming the id.
	for in, lit := range map[string]string{
		`[4294967296]`:                      "4294967296",
		`[1, -1]`:                           "-1",
		`[-4294967296]`:                     "-4294967296",
		`[18446744073709551616]`:            "18446744073709551616",
		`[` + strings.Repeat("9", 60) + `]`: strings.Repeat("9", 37) + "...",
	} {
		_, err := parseIDs([]byte(in))
		if !IsBadRequest(err) || !strings.Contains(err.Error(), "token id "+lit+" is out of range") || !strings.Contains(err.Error(), "0..4294967295") {
			t.Errorf("%s: err %v", in, err)
		}
	}
}

// One rule for token ids on every path: 0..2^32-1 accepted, 2^32 and negatives refused with a
// message that says so; the request parser's ids, the engine's render and the KV events agree.
func TestTokenIDRangeInRequests(t *testing.T) {
	for _, c := range []struct {
		prompt string
		want   []uint32 // nil: a bad request mentioning the range
	}{
		{`[4294967295, 0]`, []uint32{1<<32 - 1, 0}},
		{`[[2147483648, 1], [2]]`, []uint32{1 << 31, 1}},
		{`[4294967296]`, nil},
		{`[[4294967296]]`, nil},
		{`[-1]`, nil},
		{`[[1, -2]]`, nil},
	} {
		r, err := Parse(Completion, []byte(`{"model":"m","prompt":`+c.prompt+`}`))
		if c.want == nil {
			if !IsBadRequest(err) || !strings.Contains(err.Error(), "out of range") {
				t.Errorf("%s: err %v, want a bad request about the range", c.prompt, err)
			}
			continue
		}
		if err != nil || !r.HasIDs || !slices.Equal(r.PromptIDs, c.want) {
			t.Errorf("%s: %+v %v", c.prompt, r, err)
		}
	}
}

func TestTokenIDRangeFromEngine(t *testing.T) {
	for _, c := range []struct {
		answer string
		want   []uint32 // nil: an error
	}{
		{`[{"token_ids":[0,2147483648,4294967295]}]`, []uint32{0, 1 << 31, 1<<32 - 1}},
		{`[{"token_ids":[4294967296]}]`, nil},
		{`[{"token_ids":[1,-1]}]`, nil},
		{`[{"token_ids":[18446744073709551616]}]`, nil},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(c.answer))
		}))
		tk := New(Options{})
		body := []byte(`{"model":"m","prompt":"x"}`)
		r, _ := Parse(Completion, body)
		got, _, err := tk.Tokens(context.Background(), srv.URL, r, body)
		srv.Close()
		if c.want == nil {
			if err == nil {
				t.Errorf("%s: accepted as %v", c.answer, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v %v", c.answer, got, err)
		}
	}
	if _, err := engineIDs([]byte(`{"token_ids":[1,4294967296]}`), "token_ids", false); err == nil || !strings.Contains(err.Error(), "token id 4294967296 at position 1, outside 0..4294967295") {
		t.Errorf("engineIDs error %v", err)
	}
}

// An engine started with --api-key refuses the render endpoints (under /v1) to a caller
// without the key. That is reported as an auth error, not as "no render endpoint": the
// tokenizer does not fall back to /tokenize (open in vLLM), which would hide the router's
// misconfiguration and only half work (the router's generation requests are refused too).
func TestRenderRefusedWithoutKey(t *testing.T) {
	sim, err := vllmsim.New(vllmsim.Config{APIKeys: []string{"k"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = sim.Close() })
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	tokenizeCalls := 0
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			tokenizeCalls++
		}
		sim.Handler().ServeHTTP(w, r)
	}))
	defer front.Close()
	for _, c := range []struct {
		kind Kind
		body string
	}{
		{Completion, `{"model":"vllm-sim","prompt":"hello","max_tokens":1}`},
		{Chat, `{"model":"vllm-sim","messages":[{"role":"user","content":"hello"}]}`},
	} {
		r, err := Parse(c.kind, []byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = New(Options{}).Tokens(context.Background(), front.URL, r, []byte(c.body))
		if !IsEngineAuth(err) {
			t.Fatalf("%v: err %v, want an engine auth error", c.kind, err)
		}
	}
	if tokenizeCalls != 0 {
		t.Fatalf("fell back to /tokenize %d times", tokenizeCalls)
	}
	if IsEngineAuth(&EngineError{Status: 500}) || !IsEngineAuth(&EngineError{Status: 403}) {
		t.Fatal("IsEngineAuth misreads statuses")
	}
}

// A 4xx with vLLM's error body is the client's request refused (returned as is, not a
// failure); a 404 without one is a missing route (the /tokenize fallback); 401 is a failure.
func TestClientErrorsAreNotFailures(t *testing.T) {
	status, body := 0, ""
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	cb := []byte(`{"model":"m","messages":[{"role":"user","content":"q"}]}`)
	cr, _ := Parse(Chat, cb)
	for _, c := range []struct {
		status int
		body   string
		client bool
		calls  int
	}{
		{404, `{"error":{"message":"The model ` + "`m`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}}`, true, 1},
		{400, `{"object":"error","message":"max_tokens must be at least 1","type":"BadRequestError","param":null,"code":400}`, true, 1},
		{404, `{"detail":"Not Found"}`, false, 2},
		{401, `{"error":{"message":"Unauthorized","type":"Unauthorized","param":null,"code":401}}`, false, 1},
	} {
		status, body, calls = c.status, c.body, 0
		tk := New(Options{})
		_, _, err := tk.Tokens(context.Background(), srv.URL, cr, cb)
		var ce *ClientError
		if isCE := errors.As(err, &ce); isCE != c.client || (isCE && (ce.Status != c.status || string(ce.Body) != c.body)) {
			t.Errorf("%d %s: err %v", c.status, c.body, err)
		}
		if (tk.Stats().Failures == 0) != c.client || calls != c.calls {
			t.Errorf("%d %s: failures %d, engine calls %d", c.status, c.body, tk.Stats().Failures, calls)
		}
	}
}
