package tokens

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/zeebo/xxh3"
	"golang.org/x/sync/singleflight"

	"github.com/kvroute/kvroute/router/engine"
)

// Source says where a request's tokens came from.
type Source int

const (
	// FromIDs: the prompt was token ids.
	FromIDs Source = iota
	// FromCache: an earlier render of the same prompt fields.
	FromCache
	// FromEngine: a render or tokenize call to the engine.
	FromEngine
)

func (s Source) String() string {
	return [...]string{"ids", "cache", "engine"}[s]
}

// Options configure a Tokenizer. Zero values take the defaults named.
type Options struct {
	// Client makes the render calls (a client with a 2s-dial transport).
	Client *http.Client
	// Timeout bounds one tokenization, render and fallback together (2s).
	Timeout time.Duration
	// CacheEntries is the render cache size in prompts (4096).
	CacheEntries int
	// MaxCacheTokens: renders longer than this are not cached (262144).
	MaxCacheTokens int
	// Kind is the engines' family: which routes give a prompt's token ids (vLLM when unset).
	Kind engine.Kind
	// RenderURL is a GPU-less render server of the same model (`vllm launch render`,
	// vllm/entrypoints/cli/launch.py at vllm-project/vllm 02c1119c5782: the serving parser, the
	// render routes, no engine), asked before the serving engines so their API servers spend
	// nothing on the router's renders; "" renders on the engines. A render server that fails
	// (down, 5xx, timeout, a bad answer) is counted and the engine renders instead.
	RenderURL string
}

// Tokenizer tokenizes requests through the engines. Safe for concurrent use.
type Tokenizer struct {
	client    *http.Client
	timeout   time.Duration
	maxTokens int
	cache     *lru.Cache[uint64, []uint32]
	group     singleflight.Group
	prof      engine.Profile
	renderURL string

	hits, misses, renders, failures atomic.Uint64
	// renderServer: renders the render server answered; renderFallbacks: those it failed,
	// rendered on the engine instead.
	renderServer, renderFallbacks atomic.Uint64
}

// Stats are a Tokenizer's counters.
type Stats struct {
	CacheHits, CacheMisses, EngineCalls, Failures uint64
	CacheLen                                      int
	// RenderServer and RenderFallbacks: renders the render server (Options.RenderURL) answered,
	// and those it failed that the engine rendered instead.
	RenderServer, RenderFallbacks uint64 `json:",omitempty"`
}

// New returns a Tokenizer.
func New(o Options) *Tokenizer {
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.CacheEntries <= 0 {
		o.CacheEntries = 4096
	}
	if o.MaxCacheTokens <= 0 {
		o.MaxCacheTokens = 262144
	}
	c, _ := lru.New[uint64, []uint32](o.CacheEntries) // only fails for a size <= 0
	return &Tokenizer{client: o.Client, timeout: o.Timeout, maxTokens: o.MaxCacheTokens, cache: c, prof: o.Kind.Profile(),
		renderURL: strings.TrimRight(o.RenderURL, "/")}
}

// Stats returns the counters.
func (t *Tokenizer) Stats() Stats {
	return Stats{CacheHits: t.hits.Load(), CacheMisses: t.misses.Load(), EngineCalls: t.renders.Load(),
		Failures: t.failures.Load(), CacheLen: t.cache.Len(), RenderServer: t.renderServer.Load(), RenderFallbacks: t.renderFallbacks.Load()}
}

// Tokens returns the prompt token ids of r (parsed from body) as engineURL's model renders
// them. The returned slice is shared with the cache: callers must not modify it.
//
// Cache safety: the cache is keyed by a hash of the model and every request field that can
// change the rendered prompt (messages, tools, template and its kwargs, generation-prompt
// switches), so a hit is exactly what the engine would render again. Reusing turn N's tokens as
// a prefix of turn N+1 is deliberately not done: chat templates are free to render earlier
// messages differently once more follow (Qwen3 drops earlier reasoning, some templates move
// the system prompt or stamp the last turn), so a spliced prefix could differ from the engine's
// render and the router would predict hits the engine cannot serve. Identical concurrent
// renders (siblings, retries) share one engine call.
func (t *Tokenizer) Tokens(ctx context.Context, engineURL string, r *Request, body []byte) ([]uint32, Source, error) {
	if r.HasIDs {
		return r.PromptIDs, FromIDs, nil
	}
	if !t.prof.CanTokenize(r.Kind.ChatRendered()) {
		return nil, FromEngine, &NoRouteError{Kind: t.prof.Kind, Reason: noRouteReason(t.prof)}
	}
	// Every replica of the model renders alike, so the engine is not part of the key.
	h := xxh3.Hash(r.renderKey)
	if toks, ok := t.cache.Get(h); ok {
		t.hits.Add(1)
		return toks, FromCache, nil
	}
	t.misses.Add(1)
	v, err, _ := t.group.Do(strconv.FormatUint(h, 16), func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.timeout)
		defer cancel()
		toks, err := t.render(ctx, engineURL, r, body)
		if err != nil {
			return nil, err
		}
		if len(toks) <= t.maxTokens {
			t.cache.Add(h, toks)
		}
		return toks, nil
	})
	if err != nil {
		if !IsClientError(err) {
			t.failures.Add(1)
		}
		return nil, FromEngine, err
	}
	return v.([]uint32), FromEngine, nil
}

// ClientError is the engine refusing the request itself (bad max_tokens, unknown model, a
// prompt over the context length): the answer the client would get from the engine, to be
// returned as it is, not a tokenizer failure.
type ClientError struct {
	Status int
	Body   []byte
}

func (e *ClientError) Error() string {
	return fmt.Sprintf("tokens: the engine refused the request (%d): %s", e.Status, bytes.TrimSpace(e.Body))
}

// IsClientError reports whether err is a *ClientError.
func IsClientError(err error) bool {
	var ce *ClientError
	return errors.As(err, &ce)
}

// clientStatus: a 4xx that is about the request, not about the router or the engine's state.
// 401/403 are the router's credentials, 408/429 the engine's load; they fail the tokenization
// (the request is routed by load) instead.
func clientStatus(status int) bool {
	return status >= 400 && status < 500 && status != http.StatusUnauthorized && status != http.StatusForbidden &&
		status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
}

// vllmError reports whether body is an error vLLM wrote (its ErrorResponse, {"error": {...}},
// or the older flat {"object": "error", ...}), as opposed to the web framework's own 404/405
// for a route the engine does not have ({"detail": "Not Found"}).
func vllmError(body []byte) bool {
	var e struct {
		Error  json.RawMessage `json:"error"`
		Object string          `json:"object"`
	}
	return json.Unmarshal(body, &e) == nil && ((len(e.Error) > 0 && e.Error[0] == '{') || e.Object == "error")
}

// errNoRender is an engine without the render endpoints (vLLM before 0.15).
var errNoRender = errors.New("no render endpoint")

// EngineError is an engine answering a render or tokenize call with an unexpected status.
type EngineError struct {
	URL    string
	Status int
	Body   string // the first 512 bytes, trimmed
}

func (e *EngineError) Error() string {
	return fmt.Sprintf("tokens: %s answered %d: %s", e.URL, e.Status, e.Body)
}

// IsEngineAuth reports whether err is an engine refusing the call's credentials (401 or 403).
// The router's render calls are its own, so this is the router's misconfiguration (no engine
// API key, or the wrong one), never the client's: vLLM's --api-key guards the render
// endpoints (under /v1) but not /tokenize, and a 401 is deliberately not taken as "no render
// endpoint" — falling back would hide the misconfiguration behind slower, partial service.
func IsEngineAuth(err error) bool {
	var ee *EngineError
	return errors.As(err, &ee) && (ee.Status == http.StatusUnauthorized || ee.Status == http.StatusForbidden)
}

func (t *Tokenizer) render(ctx context.Context, engineURL string, r *Request, body []byte) ([]uint32, error) {
	t.renders.Add(1)
	if !t.prof.Render {
		// An engine without vLLM's render routes (SGLang): text through its tokenize route;
		// Tokens already refused what it cannot tokenize.
		return t.tokenizeText(ctx, engineURL, r)
	}
	if r.Kind.ChatRendered() && r.chatBody != nil {
		body = r.chatBody
	}
	if t.renderURL != "" {
		// Half the budget, so a render server that hangs leaves the engine time to render.
		rctx, cancel := context.WithTimeout(ctx, t.timeout/2)
		ids, err := t.renderRoute(rctx, t.renderURL, r, body)
		cancel()
		if err == nil || IsClientError(err) {
			// The render server's own refusal is the engine's: same parser, same template.
			t.renderServer.Add(1)
			return ids, err
		}
		t.renderFallbacks.Add(1)
	}
	return t.engineRender(ctx, engineURL, r, body)
}

// renderRoute is one call to base's render route for r: chat or text.
func (t *Tokenizer) renderRoute(ctx context.Context, base string, r *Request, body []byte) ([]uint32, error) {
	if r.Kind.ChatRendered() {
		return t.postIDs(ctx, base+"/v1/chat/completions/render", body, "token_ids", false)
	}
	return t.postIDs(ctx, base+"/v1/completions/render", body, "token_ids", true)
}

// engineRender renders on the serving engine, through /tokenize on one without the render
// routes.
func (t *Tokenizer) engineRender(ctx context.Context, engineURL string, r *Request, body []byte) ([]uint32, error) {
	if r.Kind.ChatRendered() {
		ids, err := t.renderRoute(ctx, engineURL, r, body)
		if errors.Is(err, errNoRender) {
			return t.tokenizeChat(ctx, engineURL, body)
		}
		return ids, err
	}
	// One GenerateRequest per prompt; the router routes by the first.
	ids, err := t.renderRoute(ctx, engineURL, r, body)
	if errors.Is(err, errNoRender) {
		return t.tokenizeText(ctx, engineURL, r)
	}
	return ids, err
}

// tokenizeChat is the /tokenize chat form (same renderer as chat completions).
func (t *Tokenizer) tokenizeChat(ctx context.Context, engineURL string, body []byte) ([]uint32, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, err
	}
	req := map[string]json.RawMessage{}
	for _, k := range []string{"model", "messages", "tools", "chat_template", "chat_template_kwargs",
		"add_generation_prompt", "continue_final_message", "add_special_tokens", "mm_processor_kwargs"} {
		if v, ok := top[k]; ok {
			req[k] = v
		}
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("tokens: rendering the /tokenize body: %w", err)
	}
	return t.postIDs(ctx, engineURL+"/tokenize", b, "tokens", false)
}

// tokenizeText is the /tokenize completion form (add_special_tokens defaults to true there as in
// completions).
func (t *Tokenizer) tokenizeText(ctx context.Context, engineURL string, r *Request) ([]uint32, error) {
	b, err := json.Marshal(map[string]any{"model": r.Model, "prompt": r.PromptText})
	if err != nil {
		return nil, fmt.Errorf("tokens: rendering the /tokenize body: %w", err)
	}
	return t.postIDs(ctx, engineURL+cmp.Or(t.prof.TokenizePath, "/tokenize"), b, "tokens", false)
}

// NoRouteError is an engine kind that serves no route giving a request's prompt token ids (SGLang's
// and trtllm-serve's tokenize routes take text only): the request is routed by
// load without keys, under Reason, and nothing failed.
type NoRouteError struct {
	Kind   engine.Kind
	Reason string
}

func (e *NoRouteError) Error() string {
	return fmt.Sprintf("tokens: %s engines serve no route that gives this request's token ids (%s)", e.Kind, e.Reason)
}

// Unkeyed reasons of NoRouteError.
const (
	ReasonNoChatRender = "engine_no_chat_render"
	ReasonNoTokenize   = "engine_no_tokenize"
)

func noRouteReason(p engine.Profile) string {
	if p.TokenizePath == "" && !p.Render {
		return ReasonNoTokenize
	}
	return ReasonNoChatRender
}

// post sends body to url and decodes the engine's answer into into.
func (t *Tokenizer) post(ctx context.Context, url string, body []byte, into any) error {
	answer, err := t.call(ctx, url, body)
	if err != nil {
		return err
	}
	defer putAnswer(answer)
	// A decoder, not Unmarshal: what follows the answer's first value is ignored, as before.
	if err := json.NewDecoder(bytes.NewReader(answer.Bytes())).Decode(into); err != nil {
		return fmt.Errorf("tokens: %s: bad answer: %w", url, err)
	}
	return nil
}

// postIDs sends body to url and returns the token ids under key in the answer (engineIDs).
func (t *Tokenizer) postIDs(ctx context.Context, url string, body []byte, key string, first bool) ([]uint32, error) {
	answer, err := t.call(ctx, url, body)
	if err != nil {
		return nil, err
	}
	defer putAnswer(answer)
	ids, err := engineIDs(answer.Bytes(), key, first)
	var bad badAnswer
	if errors.As(err, &bad) {
		return nil, fmt.Errorf("tokens: %s: bad answer: %w", url, bad.error)
	}
	return ids, err
}

// call sends body to url and returns the engine's 200 answer in a pooled buffer (putAnswer), or
// the error its status means.
func (t *Tokenizer) call(ctx context.Context, url string, body []byte) (*bytes.Buffer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		switch {
		case clientStatus(resp.StatusCode) && vllmError(msg):
			return nil, &ClientError{Status: resp.StatusCode, Body: msg}
		case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed:
			return nil, errNoRender
		case clientStatus(resp.StatusCode):
			return nil, &ClientError{Status: resp.StatusCode, Body: msg}
		}
		// 401/403 (IsEngineAuth), 408, 429 and 5xx: the engine's fault or the router's, never the client's.
		return nil, &EngineError{URL: url, Status: resp.StatusCode, Body: string(bytes.TrimSpace(msg[:min(len(msg), 512)]))}
	}
	answer, err := readAnswer(resp.Body, resp.ContentLength)
	if err != nil {
		return nil, fmt.Errorf("tokens: %s: bad answer: %w", url, err)
	}
	return answer, nil
}

// MaxDetokenize bounds the ids one Detokenize call sends (the audit sends a varying span,
// a few dozen ids).
const MaxDetokenize = 4096

// Detokenize returns the text of ids as engineURL's model decodes them: vLLM's POST
// /detokenize ({"model", "tokens"} -> {"prompt"}; DetokenizeRequest/DetokenizeResponse in
// vllm/entrypoints/openai/protocol.py, served by serving_tokenization.py). model may be "".
func (t *Tokenizer) Detokenize(ctx context.Context, engineURL, model string, ids []uint32) (string, error) {
	if len(ids) > MaxDetokenize {
		return "", fmt.Errorf("tokens: detokenize: %d ids over the limit of %d", len(ids), MaxDetokenize)
	}
	body, err := json.Marshal(struct {
		Model  string   `json:"model,omitempty"`
		Tokens []uint32 `json:"tokens"`
	}{model, ids})
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	var out struct {
		Prompt *string `json:"prompt"`
		Text   *string `json:"text"` // SGLang's DetokenizeResponse
	}
	if err := t.post(ctx, engineURL+"/detokenize", body, &out); err != nil {
		return "", err
	}
	if out.Prompt == nil {
		out.Prompt = out.Text
	}
	if out.Prompt == nil {
		return "", fmt.Errorf("tokens: %s/detokenize: answer has no prompt", engineURL)
	}
	return *out.Prompt, nil
}
