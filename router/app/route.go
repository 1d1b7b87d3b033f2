package app

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/fleet"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/route"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/router/server"
	"github.com/kvroute/kvroute/router/tokens"
)

// decision is one routing decision and what it was based on. Its memory is reused from one
// request to the next (newDecision, release): the ledger's Record of the request lives in rec,
// and the policy's inputs (route.Decision: keys, candidates) are the ledger's and the
// observers' until the request ends.
type decision struct {
	route.Decision
	reps   []*replica
	chosen int
	took   time.Duration
	// id is the request's ledger entry (0: not routed, a dry run, or ended).
	id load.ID
	// rec is the ledger's Record of the request (load.Ledger.DecideInto).
	rec load.Record
	// views and tried are buffers the next decision reuses.
	views []route.Replica
	tried []bool
}

// newDecision is an empty decision, a released one when there is one.
func (s *Router) newDecision() *decision {
	if d, ok := s.decisions.Get().(*decision); ok {
		return d
	}
	return new(decision)
}

// release hands back a decision once its request is over: the ledger has ended it (Done or
// Failed) and nothing reads it any more. One still in the ledger is left to the garbage
// collector instead, so a missed end costs an allocation, never a live record.
func (s *Router) release(d *decision) {
	if d == nil || d.id != 0 {
		return
	}
	d.reps, d.rec = nil, load.Record{} // drop what the pool would keep alive
	s.decisions.Put(d)
}

// views is the decision's read-only view of every replica at now: one atomic load of each
// replica's fleet.View, no lock. It also returns the fleet's block size from the same views.
// It writes into out when out has the capacity.
func (s *Router) views(reps []*replica, now time.Time, out []route.Replica) ([]route.Replica, int) {
	if cap(out) < len(reps) {
		out = make([]route.Replica, len(reps))
	}
	out = out[:len(reps)]
	var bs fleet.BlockSizeVote
	for i, r := range reps {
		v := r.View()
		bs.Add(v)
		exact := v.Exact
		if s.exactHook != nil {
			exact = s.exactHook(r)
		}
		out[i] = route.Replica{Name: r.Name, ID: r.ID, Ready: v.Ready, Healthy: r.Eng.Health.Healthy(now),
			Approximate: !exact, WarmupCredit: s.warmupCredit(v.WarmupUntil, now), Queue: v.Figures.Waiting, KVUtil: v.Figures.KVUsage,
			Peer: s.peerLoad(r)} // what the other router replicas have in flight there
	}
	size, _ := bs.Result(s.o.Config.BlockSize)
	return out, size
}

// decide scores every replica for the prompt (route.Decide) and, when commit is set, routes
// the request through the ledger (the policy picks, the ledger records the load and the
// predicted blocks in one step). tried marks replicas this request already failed on. A dry
// run (commit unset: /debug/route) changes no state: it asks the policy to explain itself and
// takes the cheapest candidate, or, for a policy without explanations, asks for its pick
// without recording it. unkeyed, when set, says why the request must not be keyed.
func (s *Router) decide(toks []uint32, id blockkey.Identity, session, unkeyed string, reps []*replica, tried map[*replica]bool, commit bool) (*decision, []score.Explanation, error) {
	t0 := time.Now()
	now := s.now()
	d := s.newDecision()
	d.reps, d.chosen, d.took, d.id = reps, 0, 0, 0
	views, bs := s.views(reps, now, d.views)
	d.views = views
	in := route.Input{Tokens: toks, Identity: id, Session: session, Unkeyed: unkeyed, BlockSize: bs, NowNs: now.UnixNano()}
	if len(tried) > 0 {
		d.tried = slices.Grow(d.tried[:0], len(reps))[:len(reps)]
		for i, r := range reps {
			d.tried[i] = tried[r]
		}
		in.Tried = d.tried
	}
	err := d.Decision.Decide(in, views, s.ix, s.ledger)
	if err != nil {
		s.release(d)
		return nil, nil, err
	}
	if d.Unkeyed != "" && commit {
		s.met.UnkeyedRequests.WithLabelValues(d.Unkeyed).Inc()
		s.logLimited("unkeyed:"+d.Unkeyed, "request routed by load without keys; counted in kvroute_router_unkeyed_requests_total",
			"reason", d.Unkeyed)
	}
	if !commit {
		ex := s.ledger.Explain(&d.Req, d.Cands)
		i := route.Cheapest(d.Cands, ex)
		if ex == nil {
			i, err = s.ledger.Pick(&d.Req, d.Cands)
		} else if i < 0 {
			err = score.ErrNoCandidate
		}
		d.took = time.Since(t0)
		d.chosen = i
		return d, ex, err
	}
	// The candidates were built outside the ledger's lock; the ledger re-reads what siblings
	// routed since then changed under it (route.Decision.Refresh), or concurrent siblings
	// would scatter.
	lid, _, err := s.ledger.DecideInto(&d.rec, &d.Decision, views, func(i int) load.Routing {
		// Outside the measured decision, still under the ledger's lock: a sibling decided right
		// after this one must already see it in the predicted side index.
		d.took = time.Since(t0)
		d.chosen = i
		return load.Routing{Replica: reps[i].Load, Keys: d.Req.Keys, Approximate: d.Cands[i].Approximate,
			Uncached: d.Uncached(i), Held: d.Req.Tokens, Cached: d.Cached[i],
			Tokens: toks, Identity: id, Multimodal: unkeyed == unkeyedMultimodal}
	})
	if err != nil {
		d.took = time.Since(t0)
		return d, nil, err
	}
	d.id = lid
	rep := reps[d.chosen]
	rep.C.Routed.Add(1)
	if d.Unkeyed == unkeyedMultimodal {
		rep.C.MultimodalRouted.Add(1)
	}
	return d, nil, nil
}

// accessLog logs one routed request in Options.AccessLogSample with the breakdown of its
// decision and the policy's explanation: each candidate's cost terms and the guard that
// excluded it, as /debug/route shows them. The explanation reads the decision's own candidates
// (the snapshot the pick saw, windows and load included) at the decision's time, so it is the
// decision's; it allocates, which only sampled decisions pay.
func (s *Router) accessLog(d *decision, p *prepared) {
	n := s.o.AccessLogSample
	if n <= 0 || s.routedCount.Add(1)%uint64(n) != 0 {
		return
	}
	s.log.Info("routed", "sample_every", n, "decision", s.routeAnswer(d, s.ledger.Explain(&d.Req, d.Cands), p))
}

// rollback takes back a decision for an attempt that failed before the engine took the
// request (load.Ledger.Failed).
func (s *Router) rollback(d *decision) {
	if d.id == 0 {
		return
	}
	if _, err := s.ledger.Failed(d.id); err != nil {
		s.log.Error("routed request missing from the ledger", "replica", d.reps[d.chosen].Name, "err", err)
	}
	d.id = 0
}

// identity is what changes KV content besides tokens: a LoRA adapter and the cache salt.
func (s *Router) identity(tr *tokens.Request, e *engine) blockkey.Identity {
	id := blockkey.Identity{CacheSalt: tr.CacheSalt}
	if e != nil && tr.Model != e.Model && (e.Adapters[tr.Model] || e.Model != "") {
		id.LoRAName = tr.Model
	}
	return id
}

// tokenizer picks the engine that renders a request: the healthy ready engines in turn.
func (s *Router) tokenizerEngine(reps []*replica) *engine {
	now := s.now()
	var es []*engine
	for _, r := range reps {
		if r.Rank == 0 && r.Eng.Discovery().Ready && r.Eng.Health.Healthy(now) {
			es = append(es, r.Eng)
		}
	}
	if len(es) == 0 {
		return nil
	}
	return es[s.rr.Add(1)%uint64(len(es))]
}

// prepared is a parsed, tokenized request.
type prepared struct {
	tr       *tokens.Request
	body     []byte
	toks     []uint32
	id       blockkey.Identity
	session  string
	degraded bool
	// unkeyed is why the request is routed without keys (unkeyedMultimodal), "" to key it.
	unkeyed string
}

// prepare reads, parses and tokenizes a request; a tokenization failure degrades it to
// load-only routing instead of failing it.
func (s *Router) prepare(w http.ResponseWriter, r *http.Request, kind tokens.Kind, body []byte, reps []*replica) (*prepared, bool) {
	tr, err := tokens.Parse(kind, body)
	if err != nil {
		s.met.Errors.WithLabelValues("", s.policy, "bad_request").Inc()
		proxy.WriteError(w, http.StatusBadRequest, proxy.TypeInvalidRequest, err.Error())
		return nil, false
	}
	p := &prepared{tr: tr, body: body, session: r.Header.Get("X-Session-Id")}
	if tokens.Multimodal(body) {
		p.unkeyed = unkeyedMultimodal
	}
	if p.session == "" {
		p.session = tr.User
	}
	te := s.tokenizerEngine(reps)
	p.id = s.identity(tr, te)
	if te == nil && !tr.HasIDs {
		return p, true // no engine: the decision fails with 503 below
	}
	t0 := time.Now()
	url := ""
	if te != nil {
		url = te.Discovery().URL
	}
	toks, src, err := s.tok.Tokens(r.Context(), url, tr, body)
	s.met.TokenizeSeconds.Observe(time.Since(t0).Seconds())
	var ce *tokens.ClientError
	if errors.As(err, &ce) {
		// The engine refused the request itself (bad max_tokens, unknown model, a prompt over
		// the context length): every engine would, so the client gets the engine's answer.
		s.met.Errors.WithLabelValues("", s.policy, "engine_refused").Inc()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(ce.Status)
		_, _ = w.Write(ce.Body)
		return nil, false
	}
	var nr *tokens.NoRouteError
	if errors.As(err, &nr) {
		p.unkeyed = nr.Reason // the engine kind gives no token ids for it: routed by load, counted
		return p, true
	}
	if err != nil {
		s.met.TokenizeFailures.Inc()
		s.tokenizeDegraded.Add(1)
		s.noteTokenizeFailure(te, err)
		if tokens.IsEngineAuth(err) {
			// The router's own call was refused: its configuration, not the client's request,
			// is wrong. The request still goes out (routed by load); it is not a client error.
			s.engineAuthFailure(callTokenize, te.Name, err)
		} else {
			s.logLimited("tokenize:"+te.Name, "tokenization failed; routing by load only, counted in kvroute_router_tokenize_failures_total",
				"engine", te.Name, "err", err)
		}
		p.degraded = true
		return p, true
	}
	s.met.TokenizeSource.WithLabelValues(src.String()).Inc()
	p.toks = toks
	return p, true
}

// Generate serves one generation request (server.Router): tokenize, decide, forward, retry
// elsewhere while no token has reached the client, account.
func (s *Router) Generate(ctx context.Context, w http.ResponseWriter, r *http.Request, kind tokens.Kind, body []byte) {
	ctx, rq := s.startRequest(ctx, r)
	// Deferred so that an answer cut after its first token (the handler aborts by panicking)
	// is measured too; by then every byte the client gets has been written.
	defer rq.end()
	reps := s.reps()
	endTokenize := s.childSpan(ctx, "kvroute.tokenize")
	p, ok := s.prepare(w, r, kind, body, reps)
	endTokenize()
	if !ok {
		rq.outcome = outcomeClientError
		return
	}
	rq.stream = p.tr.Stream
	// Only vLLM reads vllm_xargs (trtllm-serve refuses unknown fields): another kind's bodies
	// are not given one.
	rw := proxy.Rewrite{IncludeUsage: p.tr.Stream && !p.tr.IncludeUsage, FullReport: s.o.FullReport,
		PinIncremental: !s.o.FullReport && s.fleet.Kind().Profile().ReportMode}
	if rw.OverridesClientMode(p.body) {
		s.met.ReportModeOverrides.Inc()
		s.logLimited("report-mode-override", "a client's vllm_xargs.kv_cache_report_mode was set back to incremental; counted in kvroute_router_client_report_mode_overrides_total")
	}
	upBody, err := rw.Apply(p.body)
	if err != nil {
		rq.outcome = outcomeClientError
		proxy.WriteError(w, http.StatusBadRequest, proxy.TypeInvalidRequest, err.Error())
		return
	}
	path := "/v1/completions"
	if kind == tokens.Chat {
		path = "/v1/chat/completions"
	}
	excluded := map[*replica]bool{}
	var last proxy.Outcome
	for attempt := 0; attempt < s.o.MaxAttempts; attempt++ {
		endDecide := s.childSpan(ctx, "kvroute.decide")
		d, _, err := s.decide(p.toks, p.id, p.session, p.unkeyed, reps, excluded, true)
		if err != nil {
			endDecide()
			s.release(d)
			if attempt == 0 {
				rq.outcome = outcomeNoEngine
				s.met.Errors.WithLabelValues("", s.policy, "no_engine").Inc()
				proxy.WriteError(w, http.StatusServiceUnavailable, proxy.TypeUnavailable, "no healthy engine")
			} else {
				rq.outcome = outcomeEngineError
				s.allFailed(w, last)
			}
			return
		}
		s.met.DecisionSeconds.WithLabelValues(s.policy).Observe(d.took.Seconds())
		s.endDecideSpan(endDecide, d)
		s.accessLog(d, p)
		rep := d.reps[d.chosen]
		if d.Cands[d.chosen].Approximate {
			s.met.ApproxDecisions.WithLabelValues(rep.Eng.Name).Inc()
		}
		healthyLeft := 0
		for i := range d.Cands {
			if d.Cands[i].Healthy && i != d.chosen {
				healthyLeft++
			}
		}
		out := s.forward(ctx, w, r, d, p, path, upBody, rw, attempt < s.o.MaxAttempts-1 && healthyLeft > 0)
		if out.Retryable && !out.Started {
			why := out.Kind
			if out.Err != nil {
				why += ": " + out.Err.Error()
			}
			s.rollback(d)
			if out.PodDown {
				// The engine's HTTP server failed, which all its DP ranks share: no retry may land
				// on its other ranks. A refused connection takes it out of routing at once.
				if out.Kind == proxy.KindConnect {
					rep.Eng.Health.Unreachable(s.now(), why)
				} else {
					rep.Eng.Health.Failure(s.now(), why)
				}
				for _, r := range rep.Eng.Reps {
					excluded[r] = true
				}
			} else {
				rep.Eng.Health.Failure(s.now(), why)
				excluded[rep] = true
			}
			if !rep.Eng.Gone() {
				s.met.Retries.WithLabelValues(rep.Eng.Name).Inc()
			}
			rep.C.Retries.Add(1)
			s.logLimited("retry:"+rep.Name+":"+out.Kind, "engine attempt failed before the first token; retrying elsewhere, counted in kvroute_router_retries_total",
				"engine", rep.Name, "why", why)
			last = out
			s.release(d)
			continue
		}
		if !out.Started && out.Err != nil && !out.ClientGone {
			s.rollback(d)
		}
		s.release(d) // ended either way: by forward (Done) or just above
		rq.outcome = requestOutcome(out)
		if !out.Started && out.Err != nil {
			switch {
			case out.ClientGone:
			case out.Kind == proxy.KindRequestTimeout:
				proxy.WriteError(w, http.StatusGatewayTimeout, proxy.TypeServer, out.Err.Error())
			default:
				proxy.WriteError(w, http.StatusBadGateway, proxy.TypeServer, "engine "+rep.Name+": "+out.Err.Error())
			}
		}
		if out.Cut {
			// The client already has the status and some tokens: the proxy wrote an SSE error
			// event; aborting the connection keeps the chunked terminator (or the rest of a
			// Content-Length) from reaching it, so no client can take the answer as complete.
			panic(http.ErrAbortHandler)
		}
		return
	}
	rq.outcome = outcomeEngineError
	s.allFailed(w, last)
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

// startRequest starts a generation request's record and, with tracing on, its span, parented
// on the client's trace context.
func (s *Router) startRequest(ctx context.Context, r *http.Request) (context.Context, requestRecord) {
	rq := requestRecord{s: s, start: server.Accepted(ctx), outcome: outcomeOK}
	if rq.start.IsZero() {
		rq.start = time.Now()
	}
	if tr := s.o.Tracer; tr != nil {
		ctx, rq.span = tr.Start(tracePropagator.Extract(ctx, propagation.HeaderCarrier(r.Header)), "kvroute.request",
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
func (s *Router) endDecideSpan(end func(...attribute.KeyValue), d *decision) {
	if s.o.Tracer == nil {
		return
	}
	end(attribute.String("kvroute.replica", d.reps[d.chosen].Name), attribute.String("kvroute.mode", d.Mode(d.chosen)),
		attribute.Int("kvroute.predicted_cached_tokens", d.Cached[d.chosen]))
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
	case out.ClientGone:
		return outcomeCanceled
	case out.Kind == proxy.KindRequestTimeout || out.Kind == proxy.KindFirstTokenTimeout || out.Kind == proxy.KindIdleTimeout:
		return outcomeTimeout
	case out.Err != nil || out.Cut || out.EngineError != "" || out.Status >= 500:
		return outcomeEngineError
	case out.Status >= 400:
		return outcomeClientError
	}
	return outcomeOK
}

// allFailed answers a request whose every attempt failed before its first token.
func (s *Router) allFailed(w http.ResponseWriter, last proxy.Outcome) {
	s.met.Errors.WithLabelValues("", s.policy, "all_failed").Inc()
	msg := "every engine tried failed"
	if last.Err != nil {
		msg += ": " + last.Err.Error()
	}
	proxy.WriteError(w, http.StatusBadGateway, proxy.TypeServer, msg)
}

// forward sends one attempt to the decision's replica and accounts for it. The ledger moves the
// request's load from prefill to decode at its first token (proxy.Request.OnFirstToken: for a
// stream the first data event with a choice, for a non-streamed answer the answer itself), and
// ends it here once the engine took the request; an attempt the engine never took is the
// caller's to take back (rollback).
func (s *Router) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, d *decision, p *prepared, path string, body []byte, rw proxy.Rewrite, mayRetry bool) proxy.Outcome {
	rep := d.reps[d.chosen]
	dp := rep.Eng.Discovery()
	cached := d.Cached[d.chosen]
	rankLabel := strconv.Itoa(rep.Rank)
	if !rep.Eng.Gone() {
		s.met.InflightRequests.WithLabelValues(rep.Eng.Name, rankLabel).Inc()
	}
	firstToken := false
	engineHdr := rep.Eng.Name
	if dp.Ranks() > 1 {
		engineHdr += "/" + rankLabel
	}
	rank := rep.Rank
	if dp.Ranks() == 1 {
		rank = -1 // a single-rank engine needs no pin
	}
	hdr := r.Header
	var span trace.Span
	if tr := s.o.Tracer; tr != nil {
		ctx, span = tr.Start(ctx, "kvroute.forward", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("kvroute.replica", rep.Name)))
		defer span.End()
		// The engine's spans hang under this attempt, not under the client's span.
		hdr = r.Header.Clone()
		tracePropagator.Inject(ctx, propagation.HeaderCarrier(hdr))
	}
	out := s.px.Do(ctx, w, proxy.Target{URL: dp.URL, Rank: rank}, &proxy.Request{
		Path: path, Body: body, Header: hdr, Stream: p.tr.Stream, DropUsageChunk: rw.IncludeUsage,
		MayRetry: mayRetry,
		SetHeaders: func(h http.Header) {
			h.Set("x-kvroute-engine", engineHdr)
			h.Set("x-kvroute-predicted-cached-tokens", strconv.Itoa(cached))
		},
		OnFirstToken: func() {
			firstToken = true
			if span != nil {
				span.AddEvent("first_token")
			}
			if err := s.ledger.FirstToken(d.id); err != nil {
				s.log.Error("routed request missing from the ledger", "replica", rep.Name, "err", err)
			}
		},
	})
	if out.Started || out.Err == nil || out.ClientGone {
		// The engine took the request (or may have: the client left first): it ends here. The
		// other attempts are taken back by the caller.
		var u *load.Usage
		if out.Usage != nil {
			u = &load.Usage{PromptTokens: out.Usage.PromptTokens, CachedTokens: out.Usage.CachedTokens,
				HasCached: out.Usage.HasCached, CompletionTokens: out.Usage.CompletionTokens}
		}
		if _, err := s.ledger.Done(d.id, u); err != nil {
			s.log.Error("routed request missing from the ledger", "replica", rep.Name, "err", err)
		}
		d.id = 0
	}
	if rep.Eng.Gone() {
		return out // removed meanwhile: its series are deleted and stay so
	}
	s.met.InflightRequests.WithLabelValues(rep.Eng.Name, rankLabel).Dec()
	if out.AuthRejected {
		s.engineAuthFailure(callGenerate, rep.Eng.Name, out.Err)
	}
	if out.Status > 0 && !out.AuthRejected {
		s.met.EngineHeadersSeconds.WithLabelValues(rep.Eng.Name).Observe(out.HeadersAfter.Seconds())
	}
	if out.EngineError != "" {
		when := "before_first_token"
		if firstToken {
			when = "after_first_token"
		}
		s.met.EngineErrors.WithLabelValues(rep.Eng.Name, when).Inc()
		s.log.Warn("engine sent an in-stream error", "engine", rep.Name, "when", when, "message", out.EngineError)
	}
	if out.Retryable && !out.Started {
		return out
	}
	if p.tr.Stream && out.TTFT > 0 {
		s.met.FirstTokenSeconds.WithLabelValues(rep.Eng.Name).Observe(out.TTFT.Seconds())
	}
	switch {
	case out.ClientGone, out.Kind == proxy.KindRequestTimeout, out.AuthRejected:
	case out.Cut:
		rep.Eng.Health.Failure(s.now(), out.Kind+": "+out.Err.Error())
	case out.Status > 0 && out.Status < 500 && out.EngineError == "" && out.Err == nil:
		rep.Eng.Health.Success()
	}
	code := strconv.Itoa(out.Status)
	if out.Err != nil && !out.Started {
		code = "error"
	}
	s.met.Requests.WithLabelValues(rep.Eng.Name, s.policy, code).Inc()
	if out.Err != nil {
		reason := out.Kind
		if reason == "" {
			reason = "upstream"
		}
		s.met.Errors.WithLabelValues(rep.Eng.Name, s.policy, reason).Inc()
		if out.Cut {
			s.log.Warn("answer cut after its first token; the client gets an error event and an aborted connection",
				"engine", rep.Name, "kind", out.Kind, "err", out.Err)
		}
	}
	if out.Status == http.StatusOK && !out.Cut && out.Err == nil {
		s.account(rep, d.Req.Tokens, d.Req.BlockSize, cached, out.Usage, d.Mode(d.chosen))
	}
	return out
}

// account compares the prediction with the engine's reported cached tokens.
func (s *Router) account(rep *replica, promptTokens, blockSize, predicted int, u *proxy.Usage, mode string) {
	rep.C.Responses.Add(1)
	if u != nil && u.HasCached {
		pt := promptTokens
		if u.PromptTokens > 0 {
			pt = u.PromptTokens
		}
		s.fleet.Served(rep, pt, u.CachedTokens, blockSize)
	} else {
		s.fleet.Served(rep, promptTokens, predicted, blockSize)
	}
	name := rep.Eng.Name
	if u == nil || !u.HasCached {
		rep.C.NoUsage.Add(1)
		s.met.UsageMissing.WithLabelValues(name).Inc()
		return
	}
	if u.PromptTokens > 0 {
		promptTokens = u.PromptTokens
	}
	rep.C.WithUsage.Add(1)
	rep.C.PromptTokens.Add(uint64(promptTokens))
	rep.C.PredictedTokens.Add(uint64(predicted))
	rep.C.ActualTokens.Add(uint64(u.CachedTokens))
	diff := predicted - u.CachedTokens
	rep.C.AbsErr.Add(uint64(max(diff, -diff)))
	s.met.PromptTokens.WithLabelValues(name).Add(float64(promptTokens))
	s.met.PredictedCached.WithLabelValues(name).Add(float64(predicted))
	s.met.ActualCached.WithLabelValues(name).Add(float64(u.CachedTokens))
	s.accountMode(rep, mode, promptTokens, predicted, u.CachedTokens)
}

// Models forwards GET /v1/models to a healthy engine.
func (s *Router) Models(w http.ResponseWriter, r *http.Request) {
	reps := s.reps()
	e := s.tokenizerEngine(reps)
	if e == nil {
		proxy.WriteError(w, http.StatusServiceUnavailable, proxy.TypeUnavailable, "no healthy engine")
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
		e.Health.Failure(s.now(), err.Error())
		proxy.WriteError(w, http.StatusBadGateway, proxy.TypeServer, "engine "+e.Name+": "+err.Error())
		return
	}
	defer resp.Body.Close()
	if s.o.EngineAPIKey != "" && proxy.IsAuthStatus(resp.StatusCode) {
		s.engineAuthFailure(callModels, e.Name, proxy.ErrEngineAuth)
		proxy.WriteError(w, http.StatusBadGateway, proxy.TypeServer, "engine "+e.Name+": "+proxy.ErrEngineAuth.Error())
		return
	}
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
