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
	"sync"
	"time"
)

// RankHeader pins a vLLM DP rank.
const RankHeader = "X-data-parallel-rank"

// Options configure a Proxy. Zero values take the defaults named.
type Options struct {
	// ConnectTimeout bounds dialling an engine (5s).
	ConnectTimeout time.Duration
	// FirstTokenTimeout bounds the wait for a stream's first token, the engine's response
	// headers included (10m: a long prefill behind a queue is slow but fine). A stream that
	// times out here is retried elsewhere. Non-streamed answers are bounded by the caller's
	// context only: vLLM sends them whole, when generation ends.
	FirstTokenTimeout time.Duration
	// IdleTimeout cuts a stream when no byte arrived for this long after its first token (5m).
	// Keep-alive comments count as bytes. The total is the caller's context.
	IdleTimeout time.Duration
	// MaxCaptureBytes bounds how much of a non-streamed answer is held before it is written
	// (8 MiB); within it a failed read is still retried elsewhere and the usage is read.
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
	if o.FirstTokenTimeout <= 0 {
		o.FirstTokenTimeout = 10 * time.Minute
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 5 * time.Minute
	}
	if o.MaxCaptureBytes <= 0 {
		o.MaxCaptureBytes = 8 << 20
	}
	tr := &http.Transport{
		DialContext: (&net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		// No ResponseHeaderTimeout: vLLM sends a non-streamed answer's headers only when the
		// generation is done, so they are bounded by the request's total timeout, and a
		// stream's by FirstTokenTimeout.
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
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
	// MayRetry: a 5xx answer, or an engine error event before the first token, is not written
	// to the client, so the caller can try another engine.
	MayRetry bool
	// SetHeaders adds the router's response headers just before the status is written.
	SetHeaders func(h http.Header)
	// API is the answer's dialect (APIOpenAI when unset).
	API API
	// OnFirstToken is called when the first token is about to reach the client: for a stream,
	// the first SSE `data:` event that carries a choice (comments, keep-alives and the
	// response headers are not it); for a non-streamed answer, the whole answer (vLLM sends it
	// when generation is done, so prefill and decode cannot be told apart from outside).
	OnFirstToken func()
}

// Usage is the engine-reported usage of one answer.
type Usage struct {
	PromptTokens int
	// CompletionTokens is usage.completion_tokens (the trace capture's output length).
	CompletionTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens; HasCached is false when the
	// engine does not report it (vLLM without --enable-prompt-tokens-details).
	CachedTokens int
	HasCached    bool
}

// Failure kinds (Outcome.Kind), also the reason label of the router's error metrics.
const (
	KindConnect           = "connect"             // the engine could not be reached
	KindReset             = "reset"               // the connection broke
	KindStatus            = "status"              // the engine answered 5xx
	KindEngineError       = "engine_error"        // the engine sent an in-stream error event
	KindEOF               = "eof"                 // the stream ended without [DONE]
	KindFirstTokenTimeout = "first_token_timeout" // no first token within FirstTokenTimeout
	KindIdleTimeout       = "idle_timeout"        // a started stream went silent
	KindRequestTimeout    = "request_timeout"     // the caller's context hit its deadline
	KindClientGone        = "client_gone"
	KindEngineAuth        = "engine_auth" // the engine refused the router's own API key (401/403)
)

// Phase is how far an attempt got before it ended. The caller's next step follows from it:
// retry elsewhere (Unsent, Refused), answer the client itself (Failed), or nothing more
// (Answered), or abort the connection (Cut).
type Phase uint8

const (
	// Unsent: the engine never answered: no connection, a reset, a stream that ended or went
	// past the first-token timeout before its first token. Nothing reached the client; another
	// engine may succeed.
	Unsent Phase = iota
	// Refused: the engine answered with a failure the proxy held back because the caller may
	// retry (Request.MayRetry): a 5xx, an error event before the first token, a 401/403 to the
	// router's own key. Nothing reached the client.
	Refused
	// Failed: the attempt failed before anything reached the client and may not be retried
	// (the client left, the request's deadline passed, or the caller may not retry): the caller
	// answers the client itself, if it is still there.
	Failed
	// Answered: the engine's answer reached the client whole, whatever its status.
	Answered
	// Cut: the answer reached the client in part, then broke off. For a stream the proxy has
	// written an OpenAI-shaped SSE error event (unless the client is the one gone); the caller
	// must abort the connection (panic(http.ErrAbortHandler)) so that no clean end reaches it.
	Cut
)

var phaseNames = [...]string{Unsent: "unsent", Refused: "refused", Failed: "failed", Answered: "answered", Cut: "cut"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "phase(" + strconv.Itoa(int(p)) + ")"
}

// Outcome is what happened to one attempt: the phase it ended in and why.
type Outcome struct {
	// Phase is how far the attempt got.
	Phase Phase
	// Status is the engine's status (0 when none came).
	Status int
	// Kind is the failure kind (Kind*), "" on success.
	Kind string
	// EngineError is the message of an in-stream error event the engine sent.
	EngineError string
	// Usage is set when the answer carried one.
	Usage *Usage
	// Err is the failure ("" kinds have none).
	Err error
	// HeadersAfter is the time to the engine's response headers (not a first byte of the answer): for a vLLM stream that is its
	// acceptance, not its first token.
	HeadersAfter time.Duration
	// TTFT is the time to the first token (see Request.OnFirstToken); 0 when none came.
	TTFT time.Duration
	// ResponseID is the id of a Responses answer (its body, or the stream's response.created),
	// "" when none was seen.
	ResponseID string
}

// Started reports whether anything of the answer reached the client: no retry is possible.
func (o Outcome) Started() bool { return o.Phase >= Answered }

// Retryable reports whether nothing reached the client and another engine may succeed.
func (o Outcome) Retryable() bool { return o.Phase == Unsent || o.Phase == Refused }

// PodDown reports whether the failure is the engine's HTTP server, shared by all its DP ranks
// (a refused dial, a broken connection, a stream ended before its first token), not one rank.
func (o Outcome) PodDown() bool {
	return o.Phase == Unsent && (o.Kind == KindConnect || o.Kind == KindReset || o.Kind == KindEOF)
}

// ClientGone reports whether the client disconnected (its context was cancelled).
func (o Outcome) ClientGone() bool { return o.Kind == KindClientGone }

// AuthRejected reports whether the engine answered 401/403 to the router's own engine API key.
// Nothing was copied to the client (a 401 would tell it its key is wrong when the router's is);
// Err is ErrEngineAuth. It is Refused when the caller may retry, since during a key rotation
// another engine may still take the old key, Failed otherwise.
func (o Outcome) AuthRejected() bool { return o.Kind == KindEngineAuth }

// EngineTook reports whether the engine took the request, or may have (the client left
// first): the request's load ends as served, not taken back.
func (o Outcome) EngineTook() bool { return o.Started() || o.Err == nil || o.ClientGone() }

// ErrFirstTokenTimeout and ErrIdleTimeout are the causes of the timeouts the proxy enforces.
var (
	ErrFirstTokenTimeout = errors.New("proxy: no first token within the first-token timeout")
	ErrIdleTimeout       = errors.New("proxy: the stream went silent past the idle timeout")
)

// ErrRequestTimeout is the cause callers give their context's deadline for the whole request,
// so that the proxy can tell it from a client that went away.
var ErrRequestTimeout = errors.New("the request took longer than the request timeout")

// forwarded request headers: the client's identity and content negotiation, nothing hop-by-hop.
var forwardHeaders = []string{"Authorization", "Accept", "Content-Type", "OpenAI-Organization",
	"OpenAI-Project", "X-Request-Id", "Traceparent", "Tracestate", "User-Agent",
	// vLLM's session header (its request-level session_id, echoed on BlockStored events) and
	// the Messages API's version header.
	"X-Session-Id", "Anthropic-Version"}

// hop-by-hop response headers (RFC 9110 7.6.1) and the length, which the copy may change.
var dropResponse = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Transfer-Encoding": true, "Upgrade": true, "Te": true, "Trailer": true}

// Do makes one attempt and copies the answer to w. ctx is the client's request context: when
// it ends the upstream request is cancelled (give it the cause ErrRequestTimeout for the
// request's total timeout).
//
// Nothing is written to w before the first token (Request.OnFirstToken): the engine's headers,
// its keep-alive comments and any failure until then stay here, so the caller may retry
// elsewhere and the client sees one clean answer. After it, a failure becomes an SSE error
// event and Outcome.Cut.
func (p *Proxy) Do(ctx context.Context, w http.ResponseWriter, t Target, r *Request) Outcome {
	start := time.Now()
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
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
	var ft *time.Timer
	if r.Stream {
		ft = time.AfterFunc(p.o.FirstTokenTimeout, func() { cancel(ErrFirstTokenTimeout) })
		defer ft.Stop()
	}
	resp, err := p.client.Do(req)
	if err != nil {
		out := failed(parent, ctx, KindReset, err)
		if out.Kind == KindReset && isDialError(err) {
			out.Kind = KindConnect
		}
		return out
	}
	defer resp.Body.Close()
	out := Outcome{Status: resp.StatusCode, HeadersAfter: time.Since(start)}
	if p.o.EngineAPIKey != "" && IsAuthStatus(resp.StatusCode) {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		out.Kind, out.Err, out.Phase = KindEngineAuth, ErrEngineAuth, Failed
		if r.MayRetry {
			out.Phase = Refused
		}
		return out
	}
	if resp.StatusCode >= 500 && r.MayRetry {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		out.Phase, out.Kind = Refused, KindStatus
		out.Err = fmt.Errorf("engine answered %d", resp.StatusCode)
		return out
	}
	if !r.Stream || resp.StatusCode != http.StatusOK {
		return p.whole(parent, ctx, w, r, resp, start, out)
	}
	return p.stream(parent, ctx, cancel, ft, w, r, resp, start, out)
}

// failed classifies an error before anything reached the client: Unsent, or Failed when the
// client left or the request's deadline passed.
func failed(parent, ctx context.Context, kind string, err error) Outcome {
	out := Outcome{Phase: Unsent, Kind: kind, Err: err}
	switch {
	case parent.Err() != nil:
		out.Phase = Failed
		out.Err = context.Cause(parent)
		if errors.Is(out.Err, context.Canceled) {
			out.Kind = KindClientGone
		} else {
			out.Kind = KindRequestTimeout
		}
	case errors.Is(context.Cause(ctx), ErrFirstTokenTimeout):
		out.Kind, out.Err = KindFirstTokenTimeout, ErrFirstTokenTimeout
	}
	return out
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func (p *Proxy) writeHead(w http.ResponseWriter, r *Request, resp *http.Response, stream bool) {
	h := w.Header()
	for k, vs := range resp.Header {
		if !dropResponse[k] {
			h[k] = vs
		}
	}
	if stream && r.DropUsageChunk {
		h.Del("Content-Length")
	}
	if r.SetHeaders != nil {
		r.SetHeaders(h)
	}
	w.WriteHeader(resp.StatusCode)
}

// whole answers a non-streamed request (or an error status): it is read before anything is
// written, up to MaxCaptureBytes, so a broken read can still be retried.
func (p *Proxy) whole(parent, ctx context.Context, w http.ResponseWriter, r *Request, resp *http.Response, start time.Time, out Outcome) Outcome {
	buf, err := io.ReadAll(io.LimitReader(resp.Body, int64(p.o.MaxCaptureBytes)+1))
	if err != nil {
		f := failed(parent, ctx, KindReset, err)
		f.Status, f.HeadersAfter = out.Status, out.HeadersAfter
		if f.Phase == Unsent && !r.MayRetry && resp.StatusCode >= 500 {
			f.Phase = Failed // the engine's own failure answer could not be read, and no retry may hide it
		}
		return f
	}
	if resp.StatusCode == http.StatusOK {
		out.TTFT = time.Since(start)
		if r.OnFirstToken != nil {
			r.OnFirstToken()
		}
	}
	p.writeHead(w, r, resp, false)
	out.Phase = Answered
	if _, err := w.Write(buf); err != nil {
		out.Err, out.Kind, out.Phase = err, KindClientGone, Cut
		return out
	}
	if len(buf) > p.o.MaxCaptureBytes {
		if _, err := io.Copy(w, resp.Body); err != nil {
			f := failed(parent, ctx, KindReset, err)
			out.Err, out.Kind, out.Phase = f.Err, f.Kind, Cut
		}
		return out
	}
	var id string
	out.Usage, id, _ = ReadAnswer(buf, r.API)
	if resp.StatusCode == http.StatusOK {
		out.ResponseID = id
	}
	return out
}

// stream answers a streamed request: events are held until the first one that carries a
// choice, then written through one by one, unchanged (the usage-only chunk may be dropped).
func (p *Proxy) stream(parent, ctx context.Context, cancel context.CancelCauseFunc, ft *time.Timer, w http.ResponseWriter,
	r *Request, resp *http.Response, start time.Time, out Outcome) Outcome {
	idle := &idleReader{r: resp.Body, d: p.o.IdleTimeout, cancel: cancel}
	defer idle.stop()
	er := &eventReader{br: bufio.NewReaderSize(idle, 32<<10)}
	rc := http.NewResponseController(w)
	var held []byte
	for !out.Started() {
		ev, err := er.next()
		if len(ev) > 0 {
			c := classify(ev, r.API)
			if c.responseID != "" {
				out.ResponseID = c.responseID
			}
			switch c.kind {
			case evComment:
				// keep-alives before the first token stay here: the client has no headers yet
			case evError:
				out.Kind, out.EngineError = KindEngineError, c.message
				out.Err = fmt.Errorf("engine error event before the first token: %s", c.message)
				if r.MayRetry {
					out.Phase = Refused
					return out
				}
				// Nothing was written: answer with the error as an HTTP error, the status
				// the engine would have given it before the headers.
				status := c.code
				if status < 400 || status > 599 {
					status = http.StatusBadGateway
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				_, _ = w.Write(c.errorJSON)
				out.Phase = Answered
				return out
			case evData:
				if c.usage != nil {
					out.Usage = mergeUsage(out.Usage, c.usage)
				}
				held = append(held, ev...)
			default: // a choice, or [DONE]: the answer has begun
				ft.Stop()
				out.TTFT = time.Since(start)
				if r.OnFirstToken != nil {
					r.OnFirstToken()
				}
				p.writeHead(w, r, resp, true)
				out.Phase = Answered
				if c.usage != nil {
					out.Usage = mergeUsage(out.Usage, c.usage)
				}
				if c.kind == evDone {
					er.done = true
				}
				if _, werr := w.Write(append(held, ev...)); werr != nil {
					out.Err, out.Kind, out.Phase = werr, KindClientGone, Cut
					return out
				}
				_ = rc.Flush()
			}
		}
		if err != nil && !out.Started() {
			kind := KindReset
			if errors.Is(err, io.EOF) {
				kind, err = KindEOF, errors.New("the engine closed the stream before its first token")
			}
			f := failed(parent, ctx, kind, err)
			f.Status, f.HeadersAfter = out.Status, out.HeadersAfter
			return f
		}
		if err != nil {
			return p.endStream(parent, ctx, w, rc, er, out, err, r.API)
		}
	}
	idle.arm()
	for {
		ev, err := er.next()
		if err != nil && !complete(ev) {
			ev = nil // a torn event is not forwarded: the error event below must parse on its own
		}
		if len(ev) > 0 {
			c := classify(ev, r.API)
			if c.usage != nil {
				out.Usage = mergeUsage(out.Usage, c.usage)
			}
			if c.responseID != "" && out.ResponseID == "" {
				out.ResponseID = c.responseID
			}
			switch {
			case c.kind == evError:
				// The engine's own error after the first token: forwarded as it is (vLLM's
				// OpenAI shape), then the connection is aborted like any other cut.
				out.Kind, out.EngineError, out.Phase = KindEngineError, c.message, Cut
				out.Err = fmt.Errorf("engine error event: %s", c.message)
				_, _ = w.Write(ev)
				_ = rc.Flush()
				return out
			case c.kind == evDone:
				er.done = true
			case r.DropUsageChunk && c.usageOnly:
				continue
			}
			if _, werr := w.Write(ev); werr != nil {
				out.Err, out.Kind, out.Phase = werr, KindClientGone, Cut
				return out
			}
			_ = rc.Flush()
		}
		if err != nil {
			return p.endStream(parent, ctx, w, rc, er, out, err, r.API)
		}
	}
}

// endStream settles a started stream whose body ended (err is io.EOF or the read error).
func (p *Proxy) endStream(parent, ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, er *eventReader, out Outcome, err error, api API) Outcome {
	if errors.Is(err, io.EOF) {
		if er.done {
			return out
		}
		out.Kind, out.Err = KindEOF, errors.New("the engine's stream ended without [DONE]")
	} else {
		f := failed(parent, ctx, KindReset, err)
		out.Kind, out.Err = f.Kind, f.Err
		if errors.Is(context.Cause(ctx), ErrIdleTimeout) && parent.Err() == nil {
			out.Kind, out.Err = KindIdleTimeout, fmt.Errorf("no byte from the engine for %v", p.o.IdleTimeout)
		}
	}
	out.Phase = Cut
	if out.ClientGone() {
		return out
	}
	WriteStreamErrorFor(w, api, TypeInternal, "the engine's answer broke off: "+out.Err.Error(), http.StatusBadGateway)
	_ = rc.Flush()
	return out
}

// idleReader cancels the request when no byte arrives for the idle timeout once armed.
type idleReader struct {
	r      io.Reader
	d      time.Duration
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	t      *time.Timer
}

func (ir *idleReader) arm() {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	ir.t = time.AfterFunc(ir.d, func() { ir.cancel(ErrIdleTimeout) })
}

func (ir *idleReader) Read(b []byte) (int, error) {
	n, err := ir.r.Read(b)
	if n > 0 {
		ir.mu.Lock()
		if ir.t != nil {
			ir.t.Reset(ir.d)
		}
		ir.mu.Unlock()
	}
	return n, err
}

func (ir *idleReader) stop() {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	if ir.t != nil {
		ir.t.Stop()
	}
}

// eventReader splits an SSE body into events (the lines up to and including a blank line).
type eventReader struct {
	br   *bufio.Reader
	ev   []byte
	done bool // [DONE] was seen
}

// next returns the next event (possibly a partial last one with the error) and the read error.
// The returned bytes are valid until the next call.
func (e *eventReader) next() ([]byte, error) {
	e.ev = e.ev[:0]
	for {
		line, err := e.br.ReadSlice('\n')
		e.ev = append(e.ev, line...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		end := len(line) == 1 || (len(line) == 2 && line[0] == '\r')
		if err != nil || (end && len(e.ev) > 0) {
			return e.ev, err
		}
	}
}

// complete reports whether an event ends with its blank line.
func complete(ev []byte) bool {
	return bytes.HasSuffix(ev, []byte("\n\n")) || bytes.HasSuffix(ev, []byte("\r\n\r\n"))
}

type evKind int

const (
	evChoice  evKind = iota // a data event carrying at least one choice: a token
	evComment               // only comment (or empty) lines: keep-alives
	evError                 // data: {"error": ...}
	evDone                  // data: [DONE]
	evData                  // other data (no choices): held until the first token
)

type eventInfo struct {
	kind      evKind
	usage     *Usage
	usageOnly bool
	// responseID is a Responses event's response.id.
	responseID string
	// for evError
	message   string
	code      int
	errorJSON []byte
}

var (
	dataPrefix = []byte("data:")
	doneData   = []byte("[DONE]")
)

// classify reads one SSE event: its data lines joined (SSE joins them with newlines; JSON
// does not care).
func classify(ev []byte, api API) eventInfo {
	var data []byte
	hasData := false
	for line := range bytes.Lines(ev) {
		if d, ok := bytes.CutPrefix(line, dataPrefix); ok {
			hasData = true
			data = append(data, bytes.TrimSpace(d)...)
		}
	}
	if !hasData {
		return eventInfo{kind: evComment}
	}
	if bytes.Equal(data, doneData) {
		return eventInfo{kind: evDone}
	}
	if api != APIOpenAI {
		return classifyTyped(api, data)
	}
	var chunk struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   *usageJSON        `json:"usage"`
		Error   json.RawMessage   `json:"error"`
	}
	if json.Unmarshal(data, &chunk) != nil {
		return eventInfo{kind: evData}
	}
	if len(chunk.Error) > 0 && string(chunk.Error) != "null" {
		info := eventInfo{kind: evError, errorJSON: data}
		var e struct {
			Message string `json:"message"`
			Code    any    `json:"code"`
		}
		if json.Unmarshal(chunk.Error, &e) == nil {
			info.message = e.Message
			if f, ok := e.Code.(float64); ok {
				info.code = int(f)
			}
		}
		if info.message == "" {
			info.message = string(chunk.Error)
		}
		return info
	}
	info := eventInfo{kind: evData}
	if len(chunk.Choices) > 0 {
		info.kind = evChoice
	}
	if chunk.Usage != nil {
		info.usage = chunk.Usage.usage()
		info.usageOnly = len(chunk.Choices) == 0
	}
	return info
}

// usageJSON reads the three usage shapes vLLM writes: OpenAI's (prompt_tokens,
// prompt_tokens_details.cached_tokens), the Responses API's (input_tokens,
// input_tokens_details.cached_tokens) and the Messages API's (input_tokens,
// cache_read_input_tokens).
type usageJSON struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	PromptTokensDetails *cachedDetail `json:"prompt_tokens_details"`
	InputTokens         int           `json:"input_tokens"`
	OutputTokens        int           `json:"output_tokens"`
	InputTokensDetails  *cachedDetail `json:"input_tokens_details"`
	CacheReadTokens     *int          `json:"cache_read_input_tokens"`
}

type cachedDetail struct {
	CachedTokens *int `json:"cached_tokens"`
}

func (u *usageJSON) usage() *Usage {
	out := &Usage{PromptTokens: u.PromptTokens + u.InputTokens, CompletionTokens: u.CompletionTokens + u.OutputTokens}
	for _, c := range []*int{cached(u.PromptTokensDetails), cached(u.InputTokensDetails), u.CacheReadTokens} {
		if c != nil {
			out.CachedTokens, out.HasCached = *c, true
		}
	}
	return out
}

func cached(d *cachedDetail) *int {
	if d == nil {
		return nil
	}
	return d.CachedTokens
}
