package app

// The Gateway API Inference Extension front end: the router as an endpoint picker. A gateway
// streams each request through router/extproc, which drives the Picker below; the Picker drives
// the request pipeline (pipeline.go) like the proxy does: prepare keys the body, book decides
// and books the pick, the response phases the gateway streams back give FirstToken and the
// outcome End settles. Nothing here decides, books or releases on its own.
//
// What the picker cannot know as the proxy does: the gateway forwards the request, so a
// fallback the gateway used is learnt from the served endpoint it reports (the first booking is
// taken back and the request booked where it went), and a stream the gateway closes
// mid-answer is a client that left (Envoy closes it alike for a downstream reset and an
// upstream one; Envoy's own outlier detection sees the upstream).

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/router/extproc"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/router/server"
	"github.com/kvroute/kvroute/router/tokens"
)

// maxFallbacks bounds the fallback endpoints sent after the pick: the next best candidates
// the gateway tries, in order, when the pick fails.
const maxFallbacks = 3

// Failure kinds only the picker sees (the reason label of kvroute_router_errors_total).
const (
	// kindGatewayFallback: the gateway served the request from a fallback, not the pick.
	kindGatewayFallback = "gateway_fallback"
	// kindGatewayUnsent: the gateway never had the pick (the answer to it could not be sent).
	kindGatewayUnsent = "gateway_unsent"
	// kindPrefillUnseen: a prefill leg named for the decode pod's sidecar whose decode leg
	// never gave a first token: whether the sidecar ran it is unknown; its booking is taken
	// back.
	kindPrefillUnseen = "prefill_unseen"
)

var (
	errGatewayFallback = errors.New("the gateway could not use the pick and served the request from a fallback")
	errGatewayUnsent   = errors.New("the pick never reached the gateway")
	errAnswerCut       = errors.New("the answer broke off")
	errPrefillUnseen   = errors.New("the decode leg gave no first token; the prefill leg named to the sidecar is not known to have run")
)

// Picker is the router as an endpoint picker, for router/extproc.
func (s *Router) Picker() extproc.Picker { return picker{s} }

type picker struct{ s *Router }

// pickRequest is a prepared request (extproc.Prepared).
type pickRequest struct {
	p       *prepared
	reps    []*replica
	body    []byte
	dropUse bool
	rq      requestRecord
	// ctx carries the request's span (tracing on) to the pick.
	ctx context.Context
	// owner, when set, is the engine holding a stored Responses answer that a GET or cancel
	// names: the request goes there, unbooked, as the proxy forwards it (StoredResponse).
	owner *engine
}

func (r *pickRequest) Stream() bool         { return r.p.tr.Stream }
func (r *pickRequest) Body() []byte         { return r.body }
func (r *pickRequest) DropUsageChunk() bool { return r.dropUse }
func (r *pickRequest) API() proxy.API       { return apiFor(r.p.kind) }

// pickKind is the request kind a POST to path is, as the proxy's API routes them (router/server).
func pickKind(path string) (tokens.Kind, bool) {
	switch path {
	case "/v1/chat/completions":
		return tokens.Chat, true
	case "/v1/completions":
		return tokens.Completion, true
	case "/v1/responses":
		return tokens.Responses, true
	case "/v1/messages":
		return tokens.Messages, true
	}
	if slices.Contains(server.PoolingPaths, path) {
		return tokens.Pooling, true
	}
	return 0, false
}

// storedResponse reads GET /v1/responses/{id} and POST /v1/responses/{id}/cancel: the id.
func storedResponse(method, path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/v1/responses/")
	if !ok || rest == "" {
		return "", false
	}
	if id, ok := strings.CutSuffix(rest, "/cancel"); ok && method == http.MethodPost && id != "" && !strings.Contains(id, "/") {
		return id, true
	}
	if (method == http.MethodGet || method == "") && !strings.Contains(rest, "/") {
		return rest, true
	}
	return "", false
}

// refusalFor is the proxy's answer to the client, as it would write it, for the gateway.
func refusalFor(f *refusal) *extproc.Refusal {
	rec := httptest.NewRecorder()
	f.write(rec)
	return &extproc.Refusal{Status: rec.Code, Body: rec.Body.Bytes()}
}

// Prepare parses and keys a request (pipeline prepare) and rewrites its body as the proxy does
// (usage asked for, the KV report mode held). The paths are the proxy's: completions, chat,
// Responses and Messages keyed, the pooling paths by load, a stored response's GET and cancel
// sent to the engine holding it.
func (pk picker) Prepare(ctx context.Context, r *extproc.Request) (extproc.Prepared, *extproc.Refusal) {
	s := pk.s
	ctx, rq := s.startRequest(ctx, r.Header, time.Time{})
	rq.outcome = outcomeClientError
	if id, ok := storedResponse(r.Method, r.Path); ok {
		owner, ref := s.responseOwner(ctx, r.Header, id)
		if ref != nil {
			rq.end()
			return nil, refusalFor(ref)
		}
		q, _ := url.ParseQuery(r.Query)
		rq.outcome = outcomeOK
		return &pickRequest{p: &prepared{tr: &tokens.Request{Stream: q.Get("stream") == "true"}, kind: tokens.Responses},
			reps: s.reps(), rq: rq, ctx: ctx, owner: owner}, nil
	}
	kind, ok := pickKind(r.Path)
	if !ok || (r.Method != "" && r.Method != http.MethodPost) {
		s.met.Errors.WithLabelValues("", s.policy, "not_found").Inc()
		rq.end()
		return nil, &extproc.Refusal{Status: http.StatusNotFound, Body: extproc.ErrorJSON(http.StatusNotFound, proxy.TypeInvalidRequest,
			"the endpoint picker routes POST to the completions, chat, Responses, Messages and pooling paths and GET of a stored response, not "+
				r.Method+" "+r.Path)}
	}
	reps := s.reps()
	endTokenize := s.childSpan(ctx, "kvroute.tokenize")
	p, refused := s.prepare(ctx, r.Header, kind, r.Body, reps)
	endTokenize()
	if refused != nil {
		rq.end()
		return nil, refusalFor(refused)
	}
	rq.stream = p.tr.Stream
	up, rw, err := s.upstreamBody(p)
	if err != nil {
		rq.end()
		return nil, &extproc.Refusal{Status: http.StatusBadRequest, Body: extproc.ErrorJSON(http.StatusBadRequest, proxy.TypeInvalidRequest, err.Error())}
	}
	rq.outcome = outcomeOK
	return &pickRequest{p: p, reps: reps, body: up, dropUse: rw.IncludeUsage, rq: rq, ctx: ctx}, nil
}

// Pick books the request (pipeline book) on the policy's pick within the gateway's subset,
// with the next best candidates as fallbacks. The router sheds nothing, so it never answers
// extproc.ErrShed.
func (pk picker) Pick(_ context.Context, pp extproc.Prepared, sub extproc.Subset) (extproc.Booking, error) {
	s := pk.s
	r := pp.(*pickRequest)
	excluded := map[*replica]bool{}
	if sub.Set {
		in := 0
		for _, rep := range r.reps {
			if inSubset(endpointOf(rep), sub.Endpoints) {
				in++
			} else {
				excluded[rep] = true
			}
		}
		if in == 0 {
			s.met.Errors.WithLabelValues("", s.policy, "no_engine_in_subset").Inc()
			r.rq.outcome = outcomeNoEngine
			r.rq.end()
			return nil, extproc.ErrNoEndpoint
		}
	}
	if r.owner != nil {
		return s.pickOwner(r, excluded)
	}
	endDecide := s.childSpan(r.ctx, "kvroute.decide")
	// With both pools, a completions or chat request goes to a decode replica, with a prefill
	// replica named for its sidecar unless it is decode-only (disagg.go, as the proxy splits).
	// The decode pick comes first, booked with the conditional choice (legChoose), as the
	// proxy's disaggregate books it; a pick that pulls its prompt gets a prefill leg.
	dest, lg, prefillPool := r.reps, legWhole, []*replica(nil)
	if k := r.p.kind; (k == tokens.Completion || k == tokens.Chat) && r.p.pinned == "" {
		if ps, ds := pools(r.reps); len(ps) > 0 && len(ds) > 0 {
			dest, lg, prefillPool = ds, legChoose, ps
		}
	}
	a, err := s.bookLeg(r.p, dest, excluded, lg)
	if err != nil {
		endDecide()
		s.met.Errors.WithLabelValues("", s.policy, "no_engine").Inc()
		r.rq.outcome = outcomeNoEngine
		r.rq.end()
		return nil, extproc.ErrNoEndpoint
	}
	var pre *attempt
	switch {
	case lg != legChoose:
	case !a.d.pulled:
		s.met.DisaggRequests.WithLabelValues(disaggDecodeOnly, a.d.whole).Inc()
	default:
		if pre = s.pickPrefill(r.p, prefillPool); pre == nil {
			// No prefill replica: the sidecar sends the request whole (no header), so the
			// decode replica computes the prompt itself and is booked for it.
			a.withdraw()
			if a, err = s.bookLeg(r.p, dest, excluded, legWhole); err != nil {
				endDecide()
				s.met.Errors.WithLabelValues("", s.policy, "no_engine").Inc()
				r.rq.outcome = outcomeNoEngine
				r.rq.end()
				return nil, extproc.ErrNoEndpoint
			}
		}
	}
	s.endDecideSpan(endDecide, a)
	b := &booking{s: s, r: r, a: a, pre: pre, eps: []string{endpointOf(a.rep)}, reps: []*replica{a.rep}}
	s.fallbacks(b, excluded)
	b.startServe()
	return b, nil
}

// pickOwner sends a stored response's GET or cancel to the engine holding it (rank 0, where its
// HTTP server is), unbooked as the proxy forwards it; no fallback (another engine would answer
// 404).
func (s *Router) pickOwner(r *pickRequest, excluded map[*replica]bool) (extproc.Booking, error) {
	for _, rep := range r.reps {
		if rep.Eng == r.owner && rep.Rank == 0 && !excluded[rep] {
			b := &booking{s: s, r: r, eps: []string{endpointOf(rep)}, reps: []*replica{rep}}
			b.startServe()
			return b, nil
		}
	}
	s.met.Errors.WithLabelValues("", s.policy, "no_engine_in_subset").Inc()
	r.rq.outcome = outcomeNoEngine
	r.rq.end()
	return nil, extproc.ErrNoEndpoint
}

// fallbacks adds the next best candidates to b, by the policy's cost (its explanation; by the
// predicted cached tokens for a policy without one; those a balance guard kept from the pick
// last, since a fallback serves only when the pick failed), each a different endpoint on which the
// pick's rank header holds: the same DP rank of an engine of several, or an engine of one.
func (s *Router) fallbacks(b *booking, excluded map[*replica]bool) {
	d := b.a.d
	ex := s.ledger.Explain(&d.Req, d.Cands)
	rank := b.a.Target().Rank
	type cand struct {
		i       int
		guarded bool // a balance guard kept it from being the pick: a fallback after the others
		cost    float64
	}
	var cs []cand
	for i, rep := range d.reps {
		if i == d.chosen || excluded[rep] || len(d.Guards[i]) > 0 || !d.Cands[i].Healthy {
			continue
		}
		if (rank < 0 && rep.Eng.Discovery().Ranks() != 1) || (rank >= 0 && rep.Rank != rank) {
			continue
		}
		c := cand{i: i, cost: -float64(d.Cached[i])}
		if ex != nil {
			if ex[i].Excluded == score.GuardUnhealthy {
				continue
			}
			c.cost, c.guarded = ex[i].Cost, ex[i].Excluded != ""
		}
		cs = append(cs, c)
	}
	slices.SortStableFunc(cs, func(x, y cand) int {
		switch {
		case x.guarded != y.guarded:
			if y.guarded {
				return -1
			}
			return 1
		case x.cost < y.cost:
			return -1
		case x.cost > y.cost:
			return 1
		}
		return 0
	})
	for _, c := range cs {
		if len(b.eps) > maxFallbacks {
			break
		}
		ep := endpointOf(d.reps[c.i])
		if ep == "" || slices.Contains(b.eps, ep) {
			continue
		}
		b.eps, b.reps = append(b.eps, ep), append(b.reps, d.reps[c.i])
	}
}

// endpointOf is a replica's endpoint as a gateway names it: the engine's host:port.
func endpointOf(rep *replica) string {
	u, err := url.Parse(rep.Eng.Discovery().URL)
	if err != nil {
		return ""
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// inSubset reports whether an endpoint is in a subset hint (ip:port entries, or a bare ip for
// every port of the address).
func inSubset(ep string, subset []string) bool {
	host, _, _ := net.SplitHostPort(ep)
	for _, e := range subset {
		e = strings.TrimSpace(e)
		if e == ep {
			return true
		}
		if _, _, err := net.SplitHostPort(e); err != nil && strings.Trim(e, "[]") == host {
			return true
		}
	}
	return false
}

// booking is one picked request (extproc.Booking): its attempt, in flight until End.
type booking struct {
	s *Router
	r *pickRequest
	// a is the attempt, nil once a fallback the router could not book served the request.
	a *attempt
	// pre is the prefill leg named to the decode pod's sidecar (PrefillHeader), in flight
	// until the decode leg's first token (the prefill answer came before it), nil for none.
	pre  *attempt
	eps  []string
	reps []*replica // reps[k] is at eps[k]
	// span is the serve span (tracing on): from the pick to the answer's end, as the proxy's
	// forward span; traceparent puts the engine's spans under it.
	span        trace.Span
	traceparent string
}

// startServe starts the serve span with tracing on: the proxy's forward span, for an attempt
// the gateway forwards.
func (b *booking) startServe() {
	tr := b.s.o.Tracer
	if tr == nil {
		return
	}
	ctx, span := tr.Start(b.r.ctx, "kvroute.serve", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("kvroute.endpoint", b.eps[0])))
	b.span = span
	hdr := http.Header{}
	tracePropagator.Inject(ctx, propagation.HeaderCarrier(hdr))
	b.traceparent = hdr.Get("Traceparent")
}

func (b *booking) Endpoints() []string { return b.eps }

// Headers pin the DP rank of an engine of several (the rank's of the pick; fallbacks share it)
// and, with tracing on, give the engine the serve span's trace context.
func (b *booking) Headers() map[string]string {
	h := map[string]string{}
	if b.traceparent != "" {
		h["traceparent"] = b.traceparent
	}
	if b.a != nil {
		if t := b.a.Target(); t.Rank >= 0 {
			h[strings.ToLower(proxy.RankHeader)] = strconv.Itoa(t.Rank)
		}
	}
	if b.pre != nil {
		h[PrefillHeader] = endpointOf(b.pre.rep)
	}
	return h
}

// Served moves the booking to the fallback the gateway used instead of the pick: the pick's
// attempt ends as never taken (a failure of that engine), and the request is booked where it
// went, so its load and predicted blocks are that engine's.
func (b *booking) Served(ep string) {
	if ep == "" || b.a == nil || sameEndpoint(ep, b.eps[0]) {
		return
	}
	s := b.s
	var to *replica
	for k, e := range b.eps[1:] {
		if sameEndpoint(ep, e) {
			to = b.reps[k+1]
		}
	}
	lg := legWhole
	if b.a.d.pulled {
		lg = legDecode
	}
	b.a.End(proxy.Outcome{Phase: proxy.Unsent, Kind: kindGatewayFallback, Err: errGatewayFallback}, map[*replica]bool{})
	b.a = nil
	if to == nil {
		s.met.Errors.WithLabelValues("", s.policy, "served_unknown").Inc()
		s.logLimited("served-unknown", "the gateway served a request from an endpoint the picker did not name; it is not booked, counted in kvroute_router_errors_total",
			"served", ep, "picked", strings.Join(b.eps, ","))
		return
	}
	only := map[*replica]bool{}
	for _, rep := range b.r.reps {
		if rep != to {
			only[rep] = true
		}
	}
	a, err := s.bookLeg(b.r.p, b.r.reps, only, lg)
	if err != nil {
		s.met.Errors.WithLabelValues("", s.policy, "served_unbooked").Inc()
		s.logLimited("served-unbooked", "the gateway served a request from a fallback the router no longer routes to; it is not booked, counted in kvroute_router_errors_total",
			"served", ep, "err", err)
		return
	}
	b.a = a
}

// sameEndpoint compares two endpoints as host:port.
func sameEndpoint(a, b string) bool {
	if a == b {
		return true
	}
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	return err1 == nil && err2 == nil && pa == pb && net.ParseIP(ha).Equal(net.ParseIP(hb)) && net.ParseIP(ha) != nil
}

// FirstToken: the engine's first token passed the gateway (pipeline FirstToken).
func (b *booking) FirstToken() {
	if b.span != nil {
		b.span.AddEvent("first_token")
	}
	if b.pre != nil {
		// The sidecar had the prefill answer before the decode leg began: the prefill leg is
		// over. Its answer went to the sidecar, not through the gateway: no usage is seen
		// (attempt.answerElsewhere).
		b.pre.End(proxy.Outcome{Phase: proxy.Answered, Status: http.StatusOK}, map[*replica]bool{})
		b.pre = nil
	}
	if b.a != nil {
		b.a.FirstToken()
	}
}

// End settles the attempt from what the gateway streamed back (pipeline End).
func (b *booking) End(res extproc.Result) {
	out := outcomeOf(res)
	if b.span != nil {
		b.span.SetAttributes(attribute.String("kvroute.served", res.Served), attribute.Int("kvroute.status", res.Status),
			attribute.String("kvroute.phase", res.Phase.String()))
		b.span.End()
	}
	if b.pre != nil {
		b.s.logLimited("prefill-unseen", "a prefill leg named to the decode pod's sidecar is taken back: the decode leg gave no first token; counted in kvroute_router_errors_total{reason=\"prefill_unseen\"}",
			"prefill", b.pre.rep.Name, "phase", res.Phase.String())
		b.pre.End(proxy.Outcome{Phase: proxy.Failed, Kind: kindPrefillUnseen, Err: errPrefillUnseen}, map[*replica]bool{})
		b.pre = nil
	}
	if b.a != nil {
		b.a.End(out, map[*replica]bool{})
		b.a = nil
	}
	b.r.rq.outcome = requestOutcome(out)
	b.r.rq.end()
}

// outcomeOf is the proxy's outcome for what the gateway reported: the request ended where the
// gateway sent it, so nothing is retried here (the gateway's fallbacks are its retries).
func outcomeOf(res extproc.Result) proxy.Outcome {
	out := proxy.Outcome{Status: res.Status, EngineError: res.EngineError, TTFT: res.TTFT, HeadersAfter: res.HeadersAfter,
		Usage: res.Usage, ResponseID: res.ResponseID}
	started := proxy.Failed
	if res.Status > 0 {
		started = proxy.Cut
	}
	switch res.Phase {
	case extproc.Complete, extproc.Refused:
		out.Phase = proxy.Answered
	case extproc.Cut:
		out.Phase, out.Kind, out.Err = proxy.Cut, proxy.KindEOF, errAnswerCut
		if res.EngineError != "" {
			out.Kind, out.Err = proxy.KindEngineError, errors.New(res.EngineError)
		}
		if res.Reason != "" {
			// The gateway closed the stream mid-answer: a client that left, as far as the
			// picker can tell.
			out.Kind, out.Err = proxy.KindClientGone, context.Canceled
		}
		if res.Reason == "stream_timeout" {
			out.Kind, out.Err = proxy.KindRequestTimeout, proxy.ErrRequestTimeout
		}
	case extproc.Abandoned:
		out.Phase, out.Kind, out.Err = started, proxy.KindClientGone, context.Canceled
		if res.Reason == "stream_timeout" {
			out.Kind, out.Err = proxy.KindRequestTimeout, proxy.ErrRequestTimeout
		}
	default: // Unsent
		out.Phase, out.Kind, out.Err = proxy.Failed, kindGatewayUnsent, errGatewayUnsent
	}
	return out
}
