package tokens

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute/router/engine"
)

// SGLang: a completion's text goes to its /tokenize (no render routes are tried), a chat
// request is refused with a reason and no engine call; TensorRT-LLM: text through its
// /_internal/tokenize, chat refused alike, prompt token ids used as given.
func TestTokenizeByEngineKind(t *testing.T) {
	var calls, renders atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path != "/tokenize" {
			renders.Add(1)
			http.NotFound(w, r)
			return
		}
		var req struct {
			Prompt string `json:"prompt"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": []int{len(req.Prompt), 7}, "count": 2, "max_model_len": 4096})
	}))
	defer srv.Close()
	ctx := context.Background()
	sgl := New(Options{Kind: engine.SGLang})
	body := []byte(`{"model":"m","prompt":"hello"}`)
	r, err := Parse(Completion, body)
	if err != nil {
		t.Fatal(err)
	}
	toks, _, err := sgl.Tokens(ctx, srv.URL, r, body)
	if err != nil || !slices.Equal(toks, []uint32{5, 7}) || renders.Load() != 0 {
		t.Fatalf("SGLang completion: %v, %v, %d render calls; want [5 7] from /tokenize alone", toks, err, renders.Load())
	}
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	cr, err := Parse(Chat, chat)
	if err != nil {
		t.Fatal(err)
	}
	before := calls.Load()
	var nr *NoRouteError
	if _, _, err := sgl.Tokens(ctx, srv.URL, cr, chat); !errors.As(err, &nr) || nr.Reason != ReasonNoChatRender || calls.Load() != before || EngineFault(err) {
		t.Fatalf("SGLang chat: %v (%d calls); want a no-route error naming %s, no call, no engine fault", err, calls.Load()-before, ReasonNoChatRender)
	}
	trt := New(Options{Kind: engine.TRTLLM})
	if _, _, err := trt.Tokens(ctx, srv.URL, r, body); err == nil || renders.Load() != 1 {
		t.Fatalf("TensorRT-LLM completion: %v, %d calls off /tokenize; want its /_internal/tokenize asked (404 here)", err, renders.Load())
	}
	if _, _, err := trt.Tokens(ctx, srv.URL, cr, chat); !errors.As(err, &nr) || nr.Reason != ReasonNoChatRender {
		t.Fatalf("TensorRT-LLM chat: %v; want %s", err, ReasonNoChatRender)
	}
	ids := []byte(`{"model":"m","prompt":[1,2,3]}`)
	ir, err := Parse(Completion, ids)
	if err != nil {
		t.Fatal(err)
	}
	if toks, src, err := trt.Tokens(ctx, srv.URL, ir, ids); err != nil || src != FromIDs || len(toks) != 3 {
		t.Fatalf("TensorRT-LLM ids: %v %v %v", toks, src, err)
	}
}
