package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// RankHeader pins a vLLM DP rank.
const RankHeader = "X-data-parallel-rank"

// Options configure a Proxy. Zero values take the defaults named.
type Options struct {
	// ConnectTimeout bounds dialling an engine (5s).
	ConnectTimeout time.Duration
	// FirstByteTimeout bounds the wait for the engine's response headers (10m: a long prefill
	// behind a queue is slow but fine).
	FirstByteTimeout time.Duration
	// IdleTimeout cuts an answer when no byte arrived for this long (5m). There is no total
	// timeout: a long stream that keeps producing is never cut.
	IdleTimeout time.Duration
	// MaxCaptureBytes bounds how much of a non-streamed answer is kept to read its usage (8 MiB).
	MaxCaptureBytes int
	// EngineAPIKey, when set, is the router's credential for the engines (vLLM --api-key):
	// every request the client makes — render, tokenize, /v1/models, /health probes and the
	// forwarded generation — carries "Authorization: Bearer <key>", replacing a client's own
	// Authorization (see docs/router.md, "Engine API key"). Empty: the client's Authorization
	// is forwarded unchanged on generation requests and the router's own calls carry none.
	EngineAPIKey string
}

// Proxy forwards requests to engines. Safe for concurrent use.
type Proxy struct {
	o      Options
	client *http.Client
}

// New returns a Proxy with its own connection pool.
func New(o Options) *Proxy {
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	if o.FirstByteTimeout <= 0 {
		o.FirstByteTimeout = 10 * time.Minute
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 5 * time.Minute
	}
	if o.MaxCaptureBytes <= 0 {
		o.MaxCaptureBytes = 8 << 20
	}
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ResponseHeaderTimeout: o.FirstByteTimeout,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		// Engines answer plain HTTP/1.1; compression would hide chunk boundaries from the stream
		// copy and cost CPU for no gain on a cluster network.
		DisableCompression: true,
	}
	var rt http.RoundTripper = tr
	if o.EngineAPIKey != "" {
		rt = &engineAuth{base: tr, value: "Bearer " + o.EngineAPIKey}
	}
	return &Proxy{o: o, client: &http.Client{Transport: rt}}
}

// engineAuth sets the router's engine credential on every request. It sits in the transport,
// not at each call site, so no request to an engine can go out without it: the tokenizer,
// model discovery, probes and the proxy all share this client.
type engineAuth struct {
	base  http.RoundTripper
	value string
}

func (a *engineAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	// A RoundTripper must not change the caller's request: change a shallow copy's header.
	r2 := new(http.Request)
	*r2 = *r
	r2.Header = r.Header.Clone()
	if r2.Header == nil {
		r2.Header = http.Header{}
	}
	r2.Header.Set("Authorization", a.value)
	return a.base.RoundTrip(r2)
}

// ErrEngineAuth is an engine refusing the router's engine API key (401 or 403 while one is
// configured): the router's configuration is wrong, not the client's request.
var ErrEngineAuth = errors.New("the engine refused the router's engine API key (401/403): it differs from the engines' --api-key")

// IsAuthStatus reports whether an engine status means "credentials missing or refused".
func IsAuthStatus(code int) bool {
	return code == http.StatusUnauthorized || code == http.StatusForbidden
}

// Client is the proxy's HTTP client (for probes and tokenization, sharing the pool).
func (p *Proxy) Client() *http.Client { return p.client }

// Target is where one attempt goes.
type Target struct {
	URL string
	// Rank is the DP rank to pin; < 0 sends no rank header.
	Rank int
}

// Request is one attempt.
type Request struct {
	// Path is the engine path, e.g. /v1/chat/completions.
	Path string
	Body []byte
	// Header is the client's request header; Authorization and a few others are forwarded.
	Header http.Header
	// Stream is whether the answer is an SSE stream (the request's "stream").
	Stream bool
	// DropUsageChunk drops the usage-only final chunk of a stream (the router, not the client,
	// asked for usage).
	DropUsageChunk bool
	// MayRetry: a 5xx answer is not written to the client, so the caller can try another engine.
	MayRetry bool
	// SetHeaders adds the router's response headers just before the status is written.
	SetHeaders func(h http.Header)
	// OnFirstByte is called when the engine's answer begins (its prefill is done for a stream).
	OnFirstByte func()
}

// Usage is the engine-reported usage of one answer.
type Usage struct {
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens; HasCached is false when the
	// engine does not report it (vLLM without --enable-prompt-tokens-details).
	CachedTokens int
	HasCached    bool
}

// Outcome is what happened to one attempt.
type Outcome struct {
	// Status is the engine's status (0 when none came).
	Status int
	// Started: bytes (or at least the status) reached the client; no retry is possible.
	Started bool
	// Retryable: nothing reached the client and another engine may succeed (connect error,
	// 5xx with MayRetry).
	Retryable bool
	// Usage is set when the answer carried one.
	Usage *Usage
	// Err is a transport or copy error (the client going away included).
	Err error
	// ClientGone: the client disconnected (its context ended).
	ClientGone bool
	// TTFB is the time to the engine's first answer byte (headers).
	TTFB time.Duration
	// AuthRejected: the engine answered 401/403 to the router's own engine API key. Nothing
	// was copied to the client (a 401 would tell it its key is wrong when the router's is);
	// Err is ErrEngineAuth and Retryable follows MayRetry, since during a key rotation another
	// engine may still take the old key.
	AuthRejected bool
}

// forwarded request headers: the client's identity and content negotiation, nothing hop-by-hop.
var forwardHeaders = []string{"Authorization", "Accept", "Content-Type", "OpenAI-Organization",
	"OpenAI-Project", "X-Request-Id", "Traceparent", "Tracestate", "User-Agent"}

// hop-by-hop response headers (RFC 9110 7.6.1) and the length, which the copy may change.
var dropResponse = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Transfer-Encoding": true, "Upgrade": true, "Te": true, "Trailer": true}

// Do makes one attempt and copies the answer to w. ctx is the client's request context: when
// the client goes away the upstream request is cancelled.
func (p *Proxy) Do(ctx context.Context, w http.ResponseWriter, t Target, r *Request) Outcome {
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL+r.Path, bytes.NewReader(r.Body))
	if err != nil {
		return Outcome{Err: err}
	}
	for _, k := range forwardHeaders {
		if v := r.Header.Values(k); len(v) > 0 {
			req.Header[k] = v
		}
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if t.Rank >= 0 {
		req.Header.Set(RankHeader, strconv.Itoa(t.Rank))
	}
	resp, err := p.client.Do(req)
	if err != nil {
		gone := ctx.Err() != nil && context.Cause(ctx) == context.Canceled
		return Outcome{Err: err, Retryable: !gone, ClientGone: gone}
	}
	defer resp.Body.Close()
	out := Outcome{Status: resp.StatusCode, TTFB: time.Since(start)}
	if p.o.EngineAPIKey != "" && IsAuthStatus(resp.StatusCode) {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		out.AuthRejected, out.Retryable, out.Err = true, r.MayRetry, ErrEngineAuth
		return out
	}
	if resp.StatusCode >= 500 && r.MayRetry {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		out.Retryable = true
		return out
	}
	if r.OnFirstByte != nil {
		r.OnFirstByte()
	}
	h := w.Header()
	for k, vs := range resp.Header {
		if !dropResponse[k] {
			h[k] = vs
		}
	}
	stream := r.Stream && resp.StatusCode == http.StatusOK
	if stream && r.DropUsageChunk {
		h.Del("Content-Length")
	}
	if r.SetHeaders != nil {
		r.SetHeaders(h)
	}
	w.WriteHeader(resp.StatusCode)
	out.Started = true
	rc := http.NewResponseController(w)
	_ = rc.Flush()

	body := newIdleReader(resp.Body, p.o.IdleTimeout, cancel)
	defer body.stop()
	if stream {
		out.Usage, out.Err = copyStream(w, rc, body, r.DropUsageChunk)
	} else {
		out.Usage, out.Err = copyWhole(w, body, p.o.MaxCaptureBytes)
	}
	if out.Err != nil && body.timedOut.Load() {
		out.Err = fmt.Errorf("proxy: no byte from the engine for %v: %w", p.o.IdleTimeout, out.Err)
	}
	if out.Err != nil && ctx.Err() != nil && !body.timedOut.Load() {
		out.ClientGone = true
	}
	return out
}

// idleReader cancels the request when no byte arrives for the idle timeout.
type idleReader struct {
	r        io.Reader
	d        time.Duration
	t        *time.Timer
	timedOut atomic.Bool
}

func newIdleReader(r io.Reader, d time.Duration, cancel context.CancelFunc) *idleReader {
	ir := &idleReader{r: r, d: d}
	ir.t = time.AfterFunc(d, func() { ir.timedOut.Store(true); cancel() })
	return ir
}

func (ir *idleReader) Read(b []byte) (int, error) {
	n, err := ir.r.Read(b)
	if n > 0 {
		ir.t.Reset(ir.d)
	}
	return n, err
}

func (ir *idleReader) stop() { ir.t.Stop() }

// copyStream copies SSE events one by one, flushing after each, and reads usage from the
// events that carry it. Bytes are written exactly as read, so the client's stream is
// byte-identical to the engine's except for a dropped usage-only chunk.
func copyStream(w io.Writer, rc *http.ResponseController, body io.Reader, dropUsage bool) (*Usage, error) {
	br := bufio.NewReaderSize(body, 32<<10)
	var ev []byte
	var usage *Usage
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			ev = append(ev, line...)
			continue
		}
		ev = append(ev, line...)
		end := err != nil || len(line) == 1 || (len(line) == 2 && line[0] == '\r')
		if end && len(ev) > 0 {
			u, usageOnly := inspectEvent(ev)
			if u != nil {
				usage = u
			}
			if !(dropUsage && usageOnly) {
				if _, werr := w.Write(ev); werr != nil {
					return usage, werr
				}
				_ = rc.Flush()
			}
			ev = ev[:0]
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return usage, nil
			}
			return usage, err
		}
	}
}

var usageMarker = []byte(`"usage"`)

// inspectEvent reads the usage of an SSE event and whether it is the usage-only final chunk
// (choices empty, usage set) that include_usage adds.
func inspectEvent(ev []byte) (u *Usage, usageOnly bool) {
	if !bytes.Contains(ev, usageMarker) {
		return nil, false
	}
	var data []byte
	for line := range bytes.Lines(ev) {
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = append(data, bytes.TrimSpace(d)...)
		}
	}
	var chunk struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   *usageJSON        `json:"usage"`
	}
	if json.Unmarshal(data, &chunk) != nil || chunk.Usage == nil {
		return nil, false
	}
	return chunk.Usage.usage(), len(chunk.Choices) == 0
}

type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *usageJSON) usage() *Usage {
	out := &Usage{PromptTokens: u.PromptTokens}
	if d := u.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		out.CachedTokens, out.HasCached = *d.CachedTokens, true
	}
	return out
}

// copyWhole copies a non-streamed answer, keeping up to limit bytes to read its usage.
func copyWhole(w io.Writer, body io.Reader, limit int) (*Usage, error) {
	capt := &capture{limit: limit}
	_, err := io.Copy(io.MultiWriter(w, capt), body)
	if err != nil || capt.over {
		return nil, err
	}
	var resp struct {
		Usage *usageJSON `json:"usage"`
	}
	if json.Unmarshal(capt.buf, &resp) != nil || resp.Usage == nil {
		return nil, nil
	}
	return resp.Usage.usage(), nil
}

type capture struct {
	buf   []byte
	limit int
	over  bool
}

func (c *capture) Write(b []byte) (int, error) {
	if !c.over {
		if len(c.buf)+len(b) > c.limit {
			c.over, c.buf = true, nil
		} else {
			c.buf = append(c.buf, b...)
		}
	}
	return len(b), nil
}
