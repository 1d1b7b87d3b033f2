package app

// The OpenAI-compatible front end: the router as a proxy. It drives the request pipeline
// (pipeline.go) and forwards each attempt through router/proxy, retrying elsewhere while no
// token has reached the client.

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/server"
	"github.com/kvroute/kvroute/router/tokens"
)

// Generate serves one generation request (server.Router): prepare, then book an attempt,
// forward it and end it, again elsewhere while no token has reached the client.
func (s *Router) Generate(ctx context.Context, w http.ResponseWriter, r *http.Request, kind tokens.Kind, body []byte) {
	ctx, rq := s.startRequest(ctx, r.Header, server.Accepted(ctx))
	// Deferred so that an answer cut after its first token (the handler aborts by panicking)
	// is measured too; by then every byte the client gets has been written.
	defer rq.end()
	reps, held := s.admit(ctx)
	if held != nil {
		rq.outcome = outcomeNoEngine
		held.api = apiFor(kind)
		held.write(w)
		return
	}
	endTokenize := s.childSpan(ctx, "kvroute.tokenize")
	p, refused := s.prepare(ctx, r.Header, kind, body, reps)
	endTokenize()
	if refused != nil {
		rq.outcome = outcomeClientError
		refused.write(w)
		return
	}
	rq.stream = p.tr.Stream
	api := apiFor(kind)
	upBody, rw, err := s.upstreamBody(p)
	if err != nil {
		rq.outcome = outcomeClientError
		proxy.WriteErrorFor(w, api, http.StatusBadRequest, err.Error())
		return
	}
	if pre, dec := pools(reps); len(pre) > 0 && len(dec) > 0 && p.pinned == "" && kind != tokens.Pooling {
		if s.disaggregate(ctx, w, r, &rq, p, pre, dec, upBody, rw) {
			return
		}
		reps = dec // decode-only: the whole request on a decode replica
	}
	a, out, tried := s.attempts(ctx, w, r, p, reps, upBody, rw, nil)
	s.answer(w, &rq, api, a, out, tried)
}

// attempts books and forwards attempts of p over reps, elsewhere after each retryable failure,
// up to MaxAttempts. It returns the attempt whose outcome ended the request (nil when every
// attempt failed or none could be booked), that outcome (the last failure's when a is nil) and
// how many attempts were booked. first, when set, is the first attempt, booked already (a split
// request's decode pick, disagg.go); the retries book what it booked: a decode leg that pulls
// its prompt, or the whole request.
func (s *Router) attempts(ctx context.Context, w http.ResponseWriter, r *http.Request, p *prepared, reps []*replica,
	body []byte, rw proxy.Rewrite, first *attempt) (*attempt, proxy.Outcome, int) {
	excluded := map[*replica]bool{}
	lg := legWhole
	if first != nil && first.d.pulled {
		lg = legDecode
	}
	var last proxy.Outcome
	for n := 0; n < s.o.MaxAttempts; n++ {
		a := first
		if n > 0 || a == nil {
			endDecide := s.childSpan(ctx, "kvroute.decide")
			var err error
			a, err = s.bookLeg(p, reps, excluded, lg)
			if err != nil {
				endDecide()
				return nil, last, n
			}
			s.endDecideSpan(endDecide, a)
		}
		out := s.forward(ctx, w, r, a, body, rw, n < s.o.MaxAttempts-1 && a.OthersHealthy())
		a.End(out, excluded)
		if out.Retryable() {
			last = out
			continue
		}
		return a, out, n + 1
	}
	return nil, last, s.o.MaxAttempts
}

// answer finishes a request from what attempts returned: the client already has the answer
// of an attempt that reached it; otherwise it gets the router's error.
func (s *Router) answer(w http.ResponseWriter, rq *requestRecord, api proxy.API, a *attempt, out proxy.Outcome, tried int) {
	if a == nil {
		if tried == 0 {
			rq.outcome = outcomeNoEngine
			s.met.Errors.WithLabelValues("", s.policy, "no_engine").Inc()
			proxy.WriteErrorFor(w, api, http.StatusServiceUnavailable, "no healthy engine")
			return
		}
		rq.outcome = outcomeEngineError
		s.allFailed(w, api, out)
		return
	}
	rq.outcome = requestOutcome(out)
	if out.Phase == proxy.Failed && !out.ClientGone() {
		if out.Kind == proxy.KindRequestTimeout {
			proxy.WriteErrorFor(w, api, http.StatusGatewayTimeout, out.Err.Error())
		} else {
			proxy.WriteErrorFor(w, api, http.StatusBadGateway, "engine "+a.rep.Name+": "+out.Err.Error())
		}
	}
	if out.Phase == proxy.Cut {
		// The client already has the status and some tokens: the proxy wrote an SSE error
		// event; aborting the connection keeps the chunked terminator (or the rest of a
		// Content-Length) from reaching it, so no client can take the answer as complete.
		panic(http.ErrAbortHandler)
	}
}

// upstreamBody is the body the engine gets: the client's, asking for the usage the router reads
// (cached_tokens) and holding vLLM's KV report mode to the router's.
func (s *Router) upstreamBody(p *prepared) ([]byte, proxy.Rewrite, error) {
	// The rewrite (usage in the stream, the KV report mode) is OpenAI's completions and chat
	// fields; the Responses and Messages APIs report usage themselves and take no vllm_xargs.
	var rw proxy.Rewrite
	if p.kind == tokens.Completion || p.kind == tokens.Chat {
		rw = proxy.Rewrite{IncludeUsage: p.tr.Stream && !p.tr.IncludeUsage, FullReport: s.o.FullReport, PinIncremental: !s.o.FullReport && s.fleet.Kind().Profile().ReportMode}
		// Only vLLM reads vllm_xargs (trtllm-serve refuses unknown fields): another kind's
		// bodies are not given one.
	}
	if rw.OverridesClientMode(p.body) {
		s.met.ReportModeOverrides.Inc()
		s.logLimited("report-mode-override", "a client's vllm_xargs.kv_cache_report_mode was set back to incremental; counted in kvroute_router_client_report_mode_overrides_total")
	}
	b, err := rw.Apply(p.body)
	return b, rw, err
}

// requestRecord is what a generation request's end reports: its duration (from the server's
// acceptance) under its outcome and stream, and its span when tracing is on.
type requestRecord struct {
	s       *Router
	start   time.Time
	span    trace.Span
	outcome string
	stream  bool
}

// startRequest starts a generation request's record (from start; the zero time: now) and, with
// tracing on, its span, parented on the trace context in the client's headers (for the picker,
// the gateway's request headers).
func (s *Router) startRequest(ctx context.Context, hdr http.Header, start time.Time) (context.Context, requestRecord) {
	rq := requestRecord{s: s, start: start, outcome: outcomeOK}
	if rq.start.IsZero() {
		rq.start = time.Now()
	}
	if tr := s.o.Tracer; tr != nil {
		ctx, rq.span = tr.Start(tracePropagator.Extract(ctx, propagation.HeaderCarrier(hdr)), "kvroute.request",
			trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(rq.start))
	}
	return ctx, rq
}

// end observes the request's duration and ends its span.
func (rq *requestRecord) end() {
	rq.s.met.RequestSeconds.WithLabelValues(rq.outcome, strconv.FormatBool(rq.stream)).Observe(time.Since(rq.start).Seconds())
	if rq.span != nil {
		rq.span.SetAttributes(attribute.String("kvroute.outcome", rq.outcome), attribute.Bool("kvroute.stream", rq.stream))
		rq.span.End()
	}
}

// endDecideSpan ends a decision's span with what was decided (nothing to do with tracing off).
func (s *Router) endDecideSpan(end func(...attribute.KeyValue), a *attempt) {
	if s.o.Tracer == nil {
		return
	}
	end(attribute.String("kvroute.replica", a.rep.Name), attribute.String("kvroute.mode", a.d.Mode(a.d.chosen)),
		attribute.Int("kvroute.predicted_cached_tokens", a.PredictedCached()))
}

// tracePropagator reads and writes W3C trace context (traceparent, tracestate).
var tracePropagator = propagation.TraceContext{}

// childSpan starts a span under the request's when tracing is on; the returned function ends
// it with the given attributes (a no-op when off).
func (s *Router) childSpan(ctx context.Context, name string) func(...attribute.KeyValue) {
	if s.o.Tracer == nil {
		return func(...attribute.KeyValue) {}
	}
	_, span := s.o.Tracer.Start(ctx, name)
	return func(kv ...attribute.KeyValue) {
		span.SetAttributes(kv...)
		span.End()
	}
}

// The outcomes of kvroute_router_request_duration_seconds, a closed set.
const (
	outcomeOK          = "ok"
	outcomeClientError = "client_error" // refused as the client's fault (4xx), by the router or an engine
	outcomeEngineError = "engine_error" // an engine failed it: 5xx, every attempt failed, an answer cut
	outcomeTimeout     = "timeout"      // the request deadline, the first-token or the idle timeout
	outcomeNoEngine    = "no_engine"    // no healthy engine to send it to
	outcomeCanceled    = "canceled"     // the client left first
)

// requestOutcome classifies the last attempt of a request the router answered from an engine.
func requestOutcome(out proxy.Outcome) string {
	switch {
	case out.ClientGone():
		return outcomeCanceled
	case out.Kind == proxy.KindRequestTimeout || out.Kind == proxy.KindFirstTokenTimeout || out.Kind == proxy.KindIdleTimeout:
		return outcomeTimeout
	case out.Err != nil || out.Phase == proxy.Cut || out.EngineError != "" || out.Status >= 500:
		return outcomeEngineError
	case out.Status >= 400:
		return outcomeClientError
	}
	return outcomeOK
}

// allFailed answers a request whose every attempt failed before its first token.
func (s *Router) allFailed(w http.ResponseWriter, api proxy.API, last proxy.Outcome) {
	s.met.Errors.WithLabelValues("", s.policy, "all_failed").Inc()
	msg := "every engine tried failed"
	if last.Err != nil {
		msg += ": " + last.Err.Error()
	}
	proxy.WriteErrorFor(w, api, http.StatusBadGateway, msg)
}

// forward sends one attempt to its replica through the proxy and returns what came of it;
// the caller ends the attempt (attempt.End). The proxy calls the attempt's FirstToken when the
// first token is about to reach the client: for a stream the first data event with a choice,
// for a non-streamed answer the answer itself.
func (s *Router) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, a *attempt, body []byte, rw proxy.Rewrite, mayRetry bool) proxy.Outcome {
	hdr := r.Header
	var span trace.Span
	if tr := s.o.Tracer; tr != nil {
		ctx, span = tr.Start(ctx, "kvroute.forward", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("kvroute.replica", a.rep.Name)))
		defer span.End()
		// The engine's spans hang under this attempt, not under the client's span.
		hdr = r.Header.Clone()
		tracePropagator.Inject(ctx, propagation.HeaderCarrier(hdr))
	}
	engine, cached := a.EngineName(), strconv.Itoa(a.PredictedCached())
	return s.px.Do(ctx, w, a.Target(), &proxy.Request{
		Path: enginePath(a.p.kind, r), Body: body, Header: hdr, Stream: a.p.tr.Stream, DropUsageChunk: rw.IncludeUsage, API: apiFor(a.p.kind),
		MayRetry: mayRetry,
		SetHeaders: func(h http.Header) {
			h.Set("x-kvroute-engine", engine)
			h.Set("x-kvroute-predicted-cached-tokens", cached)
		},
		OnFirstToken: func() {
			if span != nil {
				span.AddEvent("first_token")
			}
			a.FirstToken()
		},
	})
}

// enginePath is where a request kind goes on the engine: the path it came in by (a pooling
// request's own).
func enginePath(kind tokens.Kind, r *http.Request) string {
	switch kind {
	case tokens.Chat:
		return "/v1/chat/completions"
	case tokens.Responses:
		return "/v1/responses"
	case tokens.Messages:
		return "/v1/messages"
	case tokens.Pooling:
		return r.URL.Path
	}
	return "/v1/completions"
}

// Models forwards GET /v1/models to a healthy engine.
func (s *Router) Models(w http.ResponseWriter, r *http.Request) {
	reps := s.reps()
	e := s.tokenizerEngine(reps)
	if e == nil {
		proxy.WriteError(w, http.StatusServiceUnavailable, "no healthy engine")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.Discovery().URL+"/v1/models", nil)
	// The same rule as generation: forwarded as is without an engine API key, replaced by
	// the router's key (in the client's transport) with one.
	if a := r.Header.Get("Authorization"); a != "" {
		req.Header.Set("Authorization", a)
	}
	resp, err := s.px.Client().Do(req)
	if err != nil {
		s.fleet.AttemptFailed(e, err.Error(), false)
		proxy.WriteError(w, http.StatusBadGateway, "engine "+e.Name+": "+err.Error())
		return
	}
	defer resp.Body.Close()
	if s.o.EngineAPIKey != "" && proxy.IsAuthStatus(resp.StatusCode) {
		s.engineAuthFailure(callModels, e.Name, proxy.ErrEngineAuth)
		proxy.WriteError(w, http.StatusBadGateway, "engine "+e.Name+": "+proxy.ErrEngineAuth.Error())
		return
	}
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
