package app

// The request pipeline: one request's way through the router, whichever front end it came in
// by. Each front end (the OpenAI proxy in openai.go; any other that asks the router where a
// request goes) drives the same four steps and nothing else decides, books or releases:
//
//	admit     hold the request while no replica is ready (router/admission): a   -> []*replica
//	          model scaled to zero, or every replica restarting
//	prepare   parse the body and key it (render or tokenize through an engine)  -> *prepared
//	book      decide (the policy over every replica) and book the pick in the   -> *attempt
//	          ledger: its load and predicted blocks, in one step under the lock
//	FirstToken  the engine's first token: the ledger moves the request from prefill to decode
//	End       the attempt's outcome (proxy.Outcome, a phase): the ledger ends the request
//	          (served) or takes it back (never taken); the fleet learns the engine's health;
//	          metrics, predicted-vs-actual accounting; a retryable failure excludes the replica
//	          (or its whole engine) from the request's next attempt
//
// A front end that learns the outcome somewhere other than router/proxy (a gateway's response
// phases, a prefill leg) builds the same proxy.Outcome and calls End.

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/router/admission"
	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/tokens"
)

// prepared is a parsed, keyed request.
type prepared struct {
	tr       *tokens.Request
	kind     tokens.Kind
	body     []byte
	toks     []uint32
	id       blockkey.Identity
	session  string
	degraded bool
	// unkeyed is why the request is routed without keys (unkeyedMultimodal), "" to key it.
	unkeyed string
	// pinned is the engine every attempt must go to ("" for any): the one holding the
	// Responses answer the request continues (responses.go).
	pinned string
}

// refusal is a request the router answers itself without routing it: the client's mistake, or
// an engine's refusal every engine would give (a prompt over the context length).
type refusal struct {
	status int
	// body is the engine's own answer, as it gave it; empty: msg makes an error of vLLM's type
	// for the status.
	body []byte
	msg  string
	// api is the answer's dialect: the Messages API answers in its own error shape.
	api proxy.API
	// detail, when set, is the error in full (a param, a type other than the status's).
	detail *proxy.ErrorDetail
	// retryAfter, when > 0, is the Retry-After header's seconds.
	retryAfter int
}

// write answers the client with the refusal.
func (f *refusal) write(w http.ResponseWriter) {
	if f.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(f.retryAfter))
	}
	if f.detail != nil {
		proxy.WriteErrorDetail(w, f.status, *f.detail)
		return
	}
	if len(f.body) == 0 {
		proxy.WriteErrorFor(w, f.api, f.status, f.msg)
		return
	}
	b := f.body
	if f.api == proxy.APIMessages {
		b = proxy.OpenAIErrorAsMessages(b) // the render call answers in OpenAI's shape
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(f.status)
	_, _ = w.Write(b)
}

// holdCheckInterval is how often the hold looks for a ready replica while requests wait.
const holdCheckInterval = 250 * time.Millisecond

// admit returns the replicas to route the request over once one of them is ready: at once
// when one is, else after holding the request (router/admission) until one is, in arrival
// order. Past the hold's wait, or with the hold full, a 503 with Retry-After; with the hold
// off, the replicas as they are (book then finds no candidate: 503). A request released
// whose replica went again before it looked waits anew within its first bound.
func (s *Router) admit(ctx context.Context) ([]*replica, *refusal) {
	reps := s.reps()
	since := time.Now()
	for !s.readyIn(reps) {
		err := s.hold.Wait(ctx, since)
		switch {
		case err == nil:
			reps = s.reps()
			continue
		case errors.Is(err, admission.ErrOff):
			return reps, nil
		case errors.Is(err, admission.ErrFull), errors.Is(err, admission.ErrExpired):
			s.met.Errors.WithLabelValues("", s.policy, "no_engine").Inc()
			o := s.hold.Options()
			why := "all " + strconv.Itoa(o.MaxWaiting) + " places in the hold are taken"
			if errors.Is(err, admission.ErrExpired) {
				why = "none became ready within " + o.MaxWait.String()
			}
			s.logLimited("hold:"+why, "a held request got 503: no ready replica; counted in kvroute_router_hold_requests_total", "why", why)
			return nil, &refusal{status: http.StatusServiceUnavailable,
				msg: "no ready engine for the model (" + why + "); retry later", retryAfter: holdRetryAfter(o.MaxWait)}
		default: // the client left
			return nil, &refusal{status: http.StatusServiceUnavailable, msg: "no ready engine: " + err.Error()}
		}
	}
	return reps, nil
}

// holdRetryAfter is the Retry-After a request refused by the hold gets: a tenth of the wait
// (a replica coming up is seconds to minutes away), at least one second.
func holdRetryAfter(wait time.Duration) int { return max(1, int(wait/10/time.Second)) }

// readyIn reports whether one of reps can take a request now (what the hold waits for).
func (s *Router) readyIn(reps []*replica) bool {
	now := s.now()
	for _, r := range reps {
		if r.View().Ready && r.Eng.Health.Healthy(now) {
			return true
		}
	}
	return false
}

// prepare parses and keys a request. A tokenization failure degrades it to load-only routing
// instead of failing it; a refusal is the client's to read.
func (s *Router) prepare(ctx context.Context, hdr http.Header, kind tokens.Kind, body []byte, reps []*replica) (*prepared, *refusal) {
	api := apiFor(kind)
	tr, err := tokens.Parse(kind, body)
	if err != nil {
		s.met.Errors.WithLabelValues("", s.policy, "bad_request").Inc()
		return nil, &refusal{status: http.StatusBadRequest, msg: err.Error(), api: api}
	}
	p := &prepared{tr: tr, kind: kind, body: body, session: sessionKey(hdr, tr)}
	rendered := body
	if cb := tr.ChatBody(); cb != nil {
		rendered = cb
	}
	if tokens.Multimodal(rendered) {
		p.unkeyed = unkeyedMultimodal
	}
	if id := tr.PreviousResponseID; id != "" {
		owner, ref := s.responseOwner(ctx, hdr, id)
		if ref != nil {
			return nil, ref
		}
		p.pinned = owner.Name
	}
	if tr.Unkeyed != "" {
		// The engine's prompt is not one the router can reproduce (or there is no KV cache to
		// reuse): routed by load, no render call spent on it.
		p.unkeyed = tr.Unkeyed
		return p, nil
	}
	te := s.tokenizerEngine(reps)
	p.id = s.identity(tr, te)
	if te == nil && !tr.HasIDs {
		return p, nil // no engine: book finds no candidate either
	}
	t0 := time.Now()
	url := ""
	if te != nil {
		url = te.Discovery().URL
	}
	toks, src, err := s.tok.Tokens(ctx, url, tr, body)
	s.met.TokenizeSeconds.Observe(time.Since(t0).Seconds())
	var ce *tokens.ClientError
	if errors.As(err, &ce) {
		// The engine refused the request itself (bad max_tokens, unknown model, a prompt over
		// the context length): every engine would, so the client gets the engine's answer.
		s.met.Errors.WithLabelValues("", s.policy, "engine_refused").Inc()
		return nil, &refusal{status: ce.Status, body: ce.Body, api: api}
	}
	var nr *tokens.NoRouteError
	if errors.As(err, &nr) {
		p.unkeyed = nr.Reason // the engine kind gives no token ids for it: routed by load, counted
		return p, nil
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
		return p, nil
	}
	s.met.TokenizeSource.WithLabelValues(src.String()).Inc()
	p.toks = toks
	return p, nil
}

// identity is what changes KV content besides tokens: a LoRA adapter and the cache salt.
func (s *Router) identity(tr *tokens.Request, e *engine) blockkey.Identity {
	id := blockkey.Identity{CacheSalt: tr.CacheSalt}
	if s.fleet.Kind().Profile().AnyModelName {
		// TensorRT-LLM: the spec's name, the path its /v1/models lists and any other name are
		// the one model it serves.
		return id
	}
	if e != nil && tr.Model != e.Model && (e.Adapters[tr.Model] || e.Model != "") {
		id.LoRAName = tr.Model
	}
	return id
}

// tokenizerEngine picks the engine that renders a request: the healthy ready engines in turn.
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

// attempt is one try of a request on one replica: decided and booked by book, ended by End.
type attempt struct {
	s   *Router
	d   *decision
	p   *prepared
	rep *replica
	// firstToken: the engine's first token came (FirstToken).
	firstToken bool
	// expectCached, when > 0, is the cached tokens the engine is expected to report in place of
	// the decision's prediction: a decode leg's engine reports the prompt it pulled from the
	// prefill engine as cached (disagg.go).
	expectCached int
}

// book decides where the request goes (the policy over reps, excluded left out) and books the
// pick in the ledger. An error means no replica can take it.
func (s *Router) book(p *prepared, reps []*replica, excluded map[*replica]bool) (*attempt, error) {
	if p.pinned != "" {
		for _, r := range reps {
			if r.Eng.Name != p.pinned {
				excluded[r] = true
			}
		}
	}
	d, _, err := s.decide(p.toks, p.id, p.session, p.unkeyed, reps, excluded, true)
	if err != nil {
		s.release(d)
		return nil, err
	}
	s.met.DecisionSeconds.WithLabelValues(s.policy).Observe(d.took.Seconds())
	s.accessLog(d, p)
	a := &attempt{s: s, d: d, p: p, rep: d.reps[d.chosen]}
	if d.Cands[d.chosen].Approximate {
		s.met.ApproxDecisions.WithLabelValues(a.rep.Eng.Name).Inc()
	}
	if !a.rep.Eng.Gone() {
		s.met.InflightRequests.WithLabelValues(a.rep.Eng.Name, strconv.Itoa(a.rep.Rank)).Inc()
	}
	return a, nil
}

// Target is where the attempt goes: the engine's URL, and the DP rank to pin (none for a
// single-rank engine).
func (a *attempt) Target() proxy.Target {
	dp := a.rep.Eng.Discovery()
	rank := a.rep.Rank
	if dp.Ranks() == 1 {
		rank = -1
	}
	return proxy.Target{URL: dp.URL, Rank: rank}
}

// EngineName is the chosen replica as the client sees it (x-kvroute-engine): the engine, and
// "/rank" for an engine of several DP ranks.
func (a *attempt) EngineName() string {
	if a.rep.Eng.Discovery().Ranks() > 1 {
		return a.rep.Eng.Name + "/" + strconv.Itoa(a.rep.Rank)
	}
	return a.rep.Eng.Name
}

// PredictedCached is the prompt tokens the decision expects the engine to find cached (for a
// decode leg, those it pulls: expectCached).
func (a *attempt) PredictedCached() int {
	if a.expectCached > 0 {
		return a.expectCached
	}
	return a.d.Cached[a.d.chosen]
}

// OthersHealthy reports whether a replica other than the chosen one could take a retry.
func (a *attempt) OthersHealthy() bool {
	for i := range a.d.Cands {
		if a.d.Cands[i].Healthy && i != a.d.chosen {
			return true
		}
	}
	return false
}

// FirstToken tells the ledger the engine's first token came: the request's load moves from
// prefill to decode.
func (a *attempt) FirstToken() {
	a.firstToken = true
	if err := a.s.ledger.FirstToken(a.d.id); err != nil {
		a.s.log.Error("routed request missing from the ledger", "replica", a.rep.Name, "err", err)
	}
}

// End settles the attempt from its outcome: the ledger ends the request when the engine took it
// and takes it back when it never did; the fleet learns the engine's health; the metrics and
// the predicted-vs-actual accounting see the answer. A retryable failure adds the replica, or
// every rank of its engine when the engine's server failed, to excluded for the next attempt.
// The attempt is not used after End.
func (a *attempt) End(out proxy.Outcome, excluded map[*replica]bool) {
	s, rep, d := a.s, a.rep, a.d
	defer s.release(d)
	if out.EngineTook() {
		var u *load.Usage
		if out.Usage != nil {
			u = &load.Usage{PromptTokens: out.Usage.PromptTokens, CachedTokens: out.Usage.CachedTokens,
				HasCached: out.Usage.HasCached, CompletionTokens: out.Usage.CompletionTokens}
		}
		if _, err := s.ledger.Done(d.id, u); err != nil {
			s.log.Error("routed request missing from the ledger", "replica", rep.Name, "err", err)
		}
		d.id = 0
	} else {
		s.rollback(d)
	}
	// An engine removed meanwhile keeps no metric series (they are deleted and stay so), but a
	// failed attempt still excludes it: the request's replicas are those it started with.
	gone := rep.Eng.Gone()
	if !gone {
		s.met.InflightRequests.WithLabelValues(rep.Eng.Name, strconv.Itoa(rep.Rank)).Dec()
		s.observeEngine(a, out)
	}
	if out.Retryable() {
		a.exclude(out, excluded, gone)
		return
	}
	if a.p.kind == tokens.Responses && a.p.tr.Store && out.Status == http.StatusOK {
		s.recordResponse(out.ResponseID, rep.Eng)
	}
	if !gone {
		a.observeAnswer(out)
	}
}

// observeEngine counts what the engine itself did on the attempt, whatever came of it.
func (s *Router) observeEngine(a *attempt, out proxy.Outcome) {
	rep := a.rep
	if out.AuthRejected() {
		s.engineAuthFailure(callGenerate, rep.Eng.Name, out.Err)
	}
	if out.Status > 0 && !out.AuthRejected() {
		s.met.EngineHeadersSeconds.WithLabelValues(rep.Eng.Name).Observe(out.HeadersAfter.Seconds())
	}
	if out.EngineError != "" {
		when := "before_first_token"
		if a.firstToken {
			when = "after_first_token"
		}
		s.met.EngineErrors.WithLabelValues(rep.Eng.Name, when).Inc()
		s.log.Warn("engine sent an in-stream error", "engine", rep.Name, "when", when, "message", out.EngineError)
	}
}

// exclude takes a replica that failed before the first token out of the request's next
// attempt. When the engine's HTTP server failed, which all its DP ranks share, no retry may
// land on its other ranks; a refused connection takes the engine out of routing at once.
func (a *attempt) exclude(out proxy.Outcome, excluded map[*replica]bool, gone bool) {
	s, rep := a.s, a.rep
	why := out.Kind
	if out.Err != nil {
		why += ": " + out.Err.Error()
	}
	s.fleet.AttemptFailed(rep.Eng, why, out.PodDown() && out.Kind == proxy.KindConnect)
	if out.PodDown() {
		for _, r := range rep.Eng.Reps {
			excluded[r] = true
		}
	} else {
		excluded[rep] = true
	}
	if !gone {
		s.met.Retries.WithLabelValues(rep.Eng.Name).Inc()
	}
	rep.C.Retries.Add(1)
	s.logLimited("retry:"+rep.Name+":"+out.Kind, "engine attempt failed before the first token; retrying elsewhere, counted in kvroute_router_retries_total",
		"engine", rep.Name, "why", why)
}

// observeAnswer counts an attempt that ended the request: its time to first token, the
// engine's health, the request and error counters, and the prediction against the engine's
// reported cached tokens.
func (a *attempt) observeAnswer(out proxy.Outcome) {
	s, rep, d := a.s, a.rep, a.d
	if a.p.tr.Stream && out.TTFT > 0 {
		s.met.FirstTokenSeconds.WithLabelValues(rep.Eng.Name).Observe(out.TTFT.Seconds())
	}
	switch {
	case out.ClientGone(), out.Kind == proxy.KindRequestTimeout, out.AuthRejected():
	case out.Phase == proxy.Cut:
		s.fleet.AttemptFailed(rep.Eng, out.Kind+": "+out.Err.Error(), false)
	case out.Status > 0 && out.Status < 500 && out.EngineError == "" && out.Err == nil:
		s.fleet.AttemptServed(rep.Eng)
	}
	code := strconv.Itoa(out.Status)
	if out.Err != nil && !out.Started() {
		code = "error"
	}
	s.met.Requests.WithLabelValues(rep.Eng.Name, s.policy, code).Inc()
	if out.Err != nil {
		reason := out.Kind
		if reason == "" {
			reason = "upstream"
		}
		s.met.Errors.WithLabelValues(rep.Eng.Name, s.policy, reason).Inc()
		if out.Phase == proxy.Cut && !out.ClientGone() {
			s.log.Warn("answer cut after its first token; the client gets an error event and an aborted connection",
				"engine", rep.Name, "kind", out.Kind, "err", out.Err)
		}
	}
	if out.Status == http.StatusOK && out.Phase == proxy.Answered && out.Err == nil && a.p.kind != tokens.Pooling {
		s.account(rep, d.Req.Tokens, d.Req.BlockSize, a.PredictedCached(), out.Usage, d.Mode(d.chosen))
	}
}

// rollback takes back a decision for an attempt the engine never took (load.Ledger.Failed).
func (s *Router) rollback(d *decision) {
	if d.id == 0 {
		return
	}
	if _, err := s.ledger.Failed(d.id); err != nil {
		s.log.Error("routed request missing from the ledger", "replica", d.reps[d.chosen].Name, "err", err)
	}
	d.id = 0
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

// apiFor is the answer dialect of a request kind.
func apiFor(kind tokens.Kind) proxy.API {
	switch kind {
	case tokens.Responses:
		return proxy.APIResponses
	case tokens.Messages:
		return proxy.APIMessages
	}
	return proxy.APIOpenAI
}

// sessionKey is a request's session for session affinity: the X-Session-Id header (vLLM reads
// the same header as its request-level session_id), else the body's session_id (or
// vllm_xargs.session_id), else the OpenAI user field (the Messages API's metadata.user_id).
func sessionKey(hdr http.Header, tr *tokens.Request) string {
	if h := hdr.Get("X-Session-Id"); h != "" {
		return h
	}
	if tr.SessionID != "" {
		return tr.SessionID
	}
	return tr.User
}
