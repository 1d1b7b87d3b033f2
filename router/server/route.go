package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/peersync"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/router/tokens"
)

// capBlockSize is the block size a decision does its arithmetic with while the fleet's is not
// known yet; no request is keyed with it (see blockSize).
const capBlockSize = 16

// decision is one routing decision and what it was based on.
type decision struct {
	req   score.Request
	cands []score.Candidate
	reps  []*replica
	// cached is, per candidate, the prompt tokens the router expects it to have cached.
	cached []int
	chosen int
	took   time.Duration
	// recorded is when record entered the decision into the side indexes (zero: not recorded).
	recorded time.Time
	// unkeyed is why the request was routed without keys ("" when keyed).
	unkeyed string
}

// Where the fleet's block size came from (blockSize).
const (
	blockSizeFromConfig    = "config"
	blockSizeFromDiscovery = "discovery"
	blockSizeFromEvents    = "events"
	blockSizeUnknown       = "unknown"
)

// blockSize is the fleet's block size and where it came from: configured, else announced by
// discovery, else learned from a validated event. Until one of them says, it is unknown and
// requests are routed by load without keys: keys at a guessed size would never match the
// engines' blocks, and would fill the predicted index with entries no event ever confirms.
func (s *Server) blockSize(reps []*replica) (int, string) {
	if bs := s.o.Config.BlockSize; bs > 0 {
		return bs, blockSizeFromConfig
	}
	for _, r := range reps {
		if bs := r.eng.dp.Load().BlockSize; bs > 0 {
			return bs, blockSizeFromDiscovery
		}
	}
	if s.sub != nil {
		for _, r := range reps {
			if bs := s.sub.BlockSize(r.eng.name, r.rank); bs > 0 {
				return bs, blockSizeFromEvents
			}
		}
	}
	return 0, blockSizeUnknown
}

// warmupCredit is the configured credit decaying linearly to 0 at warmup-until over the
// warm-up duration.
func (s *Server) warmupCredit(until, now time.Time) float64 {
	if until.IsZero() || !now.Before(until) {
		return 0
	}
	d := s.o.Config.Warmup.Duration.Duration
	if d <= 0 {
		return 0
	}
	return s.o.Config.Warmup.Credit * min(1, float64(until.Sub(now))/float64(d))
}

// decide scores every replica for the prompt and picks one; excluded replicas (tried already
// in this request) are unhealthy for it. When commit is set the policy is told (OnRouted).
// unkeyed, when set, says why the request must not be keyed (unkeyedMultimodal).
func (s *Server) decide(toks []uint32, id blockkey.Identity, session, unkeyed string, reps []*replica, excluded map[*replica]bool, commit bool) (*decision, error) {
	t0 := time.Now()
	now := s.now()
	bs, bsFrom := s.blockSize(reps)
	if bsFrom == blockSizeUnknown {
		bs = capBlockSize
		if unkeyed == "" {
			unkeyed = "block_size_unknown"
		}
	}
	keyed := unkeyed == ""
	if !keyed && commit {
		s.met.UnkeyedRequests.WithLabelValues(unkeyed).Inc()
		s.logLimited("unkeyed:"+unkeyed, "request routed by load without keys; counted in kvroute_router_unkeyed_requests_total",
			"reason", unkeyed)
	}
	d := &decision{reps: reps, unkeyed: unkeyed}
	d.req = score.Request{Tokens: len(toks), BlockSize: bs, SessionKey: session, LoRA: id.LoRAName, NowNs: now.UnixNano()}
	if len(toks) > 0 && keyed {
		keys, err := blockkey.AppendPromptKeys(nil, toks, bs, id)
		if err != nil {
			return nil, err
		}
		d.req.Keys = keys
	}
	// The engine recomputes the last prompt token, so at most tokens-1 can hit, in whole blocks.
	capBlocks := 0
	if len(toks) > 0 {
		capBlocks = (len(toks) - 1) / bs
	}
	approx := make([]bool, len(reps))
	anyApprox := false
	for i, r := range reps {
		approx[i] = !s.exactStream(r)
		anyApprox = anyApprox || approx[i]
	}
	var exact []index.Match
	var pred, appr []uint32
	if len(d.req.Keys) > 0 {
		exact = s.ix.Match(d.req.Keys, nil)
		pred = s.predicted.Match(d.req.Keys, now, s.ix.Slots(), nil)
		if anyApprox { // the approximate index is only read for replicas without a whole stream
			appr = s.approx.Match(d.req.Keys, now, s.ix.Slots(), nil)
		}
	}
	d.cands = make([]score.Candidate, len(reps))
	d.cached = make([]int, len(reps))
	for i, r := range reps {
		dp := r.eng.dp.Load()
		peer := s.peerLoad(r) // what the other router replicas have in flight there
		c := score.Candidate{
			ID:            r.name,
			Healthy:       dp.Ready && r.eng.health.Healthy(now) && !excluded[r],
			PrefillTokens: int(r.prefill.Load() + peer.Prefill),
			DecodeTokens:  int(r.decode.Load() + peer.Decode),
			Running:       int(r.running.Load() + peer.Running),
			WarmupCredit:  s.warmupCredit(dp.WarmupUntil, now),
			Approximate:   approx[i],
		}
		if int(r.id) < len(exact) {
			m := exact[r.id]
			c.ExactBlocks = int(m.Blocks)
			c.TierBlocks = [score.NumTiers]int{int(m.Blocks - m.CPU - m.Disk), int(m.CPU), int(m.Disk)}
			if c.Approximate {
				if a := int(appr[r.id]); a > c.ExactBlocks {
					c.ExactBlocks, c.TierBlocks = a, [score.NumTiers]int{a, 0, 0}
				}
			}
			c.PredictedBlocks = int(pred[r.id])
		}
		capCandidate(&c, capBlocks)
		d.cached[i] = max(c.ExactBlocks, c.PredictedBlocks) * bs
		d.cands[i] = c
	}
	s.polMu.Lock()
	i, err := s.pol.Pick(&d.req, d.cands)
	d.took = time.Since(t0)
	if err == nil && commit {
		s.pol.OnRouted(&d.req, d.cands, i)
		// Outside the measured decision, still under the policy lock: a sibling decided right
		// after this one must already see it in the predicted side index.
		d.chosen = i
		s.record(d)
	}
	s.polMu.Unlock()
	if err != nil {
		return d, err
	}
	d.chosen = i
	return d, nil
}

// capCandidate limits every overlap to capBlocks, taking the excess off the slowest tier first.
func capCandidate(c *score.Candidate, capBlocks int) {
	c.PredictedBlocks = min(c.PredictedBlocks, capBlocks)
	over := c.ExactBlocks - capBlocks
	if over <= 0 {
		return
	}
	c.ExactBlocks = capBlocks
	for t := score.NumTiers - 1; t >= 0 && over > 0; t-- {
		n := min(over, c.TierBlocks[t])
		c.TierBlocks[t] -= n
		over -= n
	}
}

// exactStream reports whether the replica's event stream is whole (Exact); every other state,
// or no stream at all, is scored from the approximate index too.
func (s *Server) exactStream(r *replica) bool {
	if s.exactHook != nil {
		return s.exactHook(r)
	}
	if !r.stream || s.sub == nil {
		return false
	}
	st, ok := s.sub.State(r.eng.name, r.rank)
	return ok && st == kvevents.Exact && !r.h.demoted.Load()
}

// record enters a decision into the predicted side index (and the approximate one when the
// chosen replica is scored approximately).
func (s *Server) record(d *decision) {
	d.reps[d.chosen].h.routed.Add(1)
	if d.unkeyed == unkeyedMultimodal {
		d.reps[d.chosen].h.mmRouted.Add(1)
	}
	if len(d.req.Keys) == 0 {
		return
	}
	now := s.now()
	d.recorded = now
	id := d.reps[d.chosen].id
	s.predicted.Predict(id, d.req.Keys, now)
	// The approximate index stands in for a missing stream; a replica with a whole stream
	// never reads it, so its decisions are not written there.
	if d.cands[d.chosen].Approximate {
		s.approx.Predict(id, d.req.Keys, now)
	}
}

// rollback takes back what a decision told the policy and the side indexes, for an attempt that
// failed before the engine took the request: the replica that just failed must not attract the
// next request with the same prefix through a prediction of blocks it never computed.
func (s *Server) rollback(d *decision) {
	s.polMu.Lock()
	if rt, ok := s.pol.(score.Retractor); ok {
		rt.Retract(&d.req, d.cands, d.chosen)
	}
	s.polMu.Unlock()
	if d.recorded.IsZero() {
		return
	}
	id := d.reps[d.chosen].id
	s.predicted.Unpredict(id, d.req.Keys, d.recorded)
	if d.cands[d.chosen].Approximate {
		s.approx.Unpredict(id, d.req.Keys, d.recorded)
	}
}

// identity is what changes KV content besides tokens: a LoRA adapter and the cache salt.
func (s *Server) identity(tr *tokens.Request, e *engine) blockkey.Identity {
	id := blockkey.Identity{CacheSalt: tr.CacheSalt}
	if e != nil && tr.Model != e.model && (e.adapts[tr.Model] || e.model != "") {
		id.LoRAName = tr.Model
	}
	return id
}

// tokenizer picks the engine that renders a request: the healthy ready engines in turn.
func (s *Server) tokenizerEngine(reps []*replica) *engine {
	now := s.now()
	var es []*engine
	for _, r := range reps {
		if r.rank == 0 && r.eng.dp.Load().Ready && r.eng.health.Healthy(now) {
			es = append(es, r.eng)
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
func (s *Server) prepare(w http.ResponseWriter, r *http.Request, kind tokens.Kind, reps []*replica) (*prepared, bool) {
	body, err := s.readBody(w, r)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.met.Errors.WithLabelValues("", s.policy, "body_timeout").Inc()
			w.Header().Set("Connection", "close")
			proxy.WriteError(w, http.StatusRequestTimeout, proxy.TypeInvalidRequest,
				fmt.Sprintf("the request body did not arrive within %v", s.o.Config.Limits.BodyReadTimeout.Duration))
			return nil, false
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			s.met.Errors.WithLabelValues("", s.policy, "too_large").Inc()
			proxy.WriteError(w, http.StatusRequestEntityTooLarge, proxy.TypeInvalidRequest,
				fmt.Sprintf("request body over %d bytes", mbe.Limit))
			return nil, false
		}
		proxy.WriteError(w, http.StatusBadRequest, proxy.TypeInvalidRequest, "reading the body: "+err.Error())
		return nil, false
	}
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
		url = te.dp.Load().URL
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
	if err != nil {
		s.met.TokenizeFailures.Inc()
		s.tokenizeDegraded.Add(1)
		s.noteTokenizeFailure(te, err)
		if tokens.IsEngineAuth(err) {
			// The router's own call was refused: its configuration, not the client's request,
			// is wrong. The request still goes out (routed by load); it is not a client error.
			s.engineAuthFailure(callTokenize, te.name, err)
		} else {
			s.logLimited("tokenize:"+te.name, "tokenization failed; routing by load only, counted in kvroute_router_tokenize_failures_total",
				"engine", te.name, "err", err)
		}
		p.degraded = true
		return p, true
	}
	s.met.TokenizeSource.WithLabelValues(src.String()).Inc()
	p.toks = toks
	return p, true
}

// jsonMediaType reports whether a Content-Type is application/json (any parameters, any case).
func jsonMediaType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

// awaitDiscovery holds a request that arrived before the first engine snapshot (the first
// milliseconds after start) until it is applied, rather than refusing it; false (after a 503
// "no engine discovered yet") when it does not come within the wait.
func (s *Server) awaitDiscovery(w http.ResponseWriter, r *http.Request) bool {
	select {
	case <-s.readyOnce:
		return true
	default:
	}
	t := time.NewTimer(s.o.DiscoveryWait)
	defer t.Stop()
	select {
	case <-s.readyOnce:
		return true
	case <-r.Context().Done():
		return false
	case <-t.C:
		s.met.Errors.WithLabelValues("", s.policy, "no_engine").Inc()
		proxy.WriteError(w, http.StatusServiceUnavailable, proxy.TypeUnavailable, errNotDiscovered)
		return false
	}
}

const errNotDiscovered = "no engine discovered yet"

// readBody reads a request body within limits.bodyReadTimeout and limits.maxBodyBytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rc := http.NewResponseController(w)
	deadline := false
	if d := s.o.Config.Limits.BodyReadTimeout.Duration; d > 0 {
		deadline = rc.SetReadDeadline(time.Now().Add(d)) == nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.o.Config.Limits.MaxBodyBytes))
	if deadline && err == nil {
		// Lifted once the body is in: a stream may last long after. On an error it stays, so
		// net/http does not wait for the rest of a slow body before closing the connection.
		_ = rc.SetReadDeadline(time.Time{})
	}
	return body, err
}

func (s *Server) serveGenerate(w http.ResponseWriter, r *http.Request, kind tokens.Kind) {
	s.requestsTotal.Add(1)
	if !s.awaitDiscovery(w, r) {
		return
	}
	if !jsonMediaType(r.Header.Get("Content-Type")) {
		// vLLM's generation routes depend on validate_json_request
		// (vllm/entrypoints/openai/api_server.py): the media type, lower-cased and without
		// parameters, must be application/json, or the request is a 400 validation error. A
		// `curl -d` body (application/x-www-form-urlencoded) or none at all is refused here
		// the same way, before a render call and a routing decision are spent on it.
		s.met.Errors.WithLabelValues("", s.policy, "bad_request").Inc()
		proxy.WriteError(w, http.StatusBadRequest, proxy.TypeInvalidRequest,
			"Unsupported Media Type: Only 'application/json' is allowed")
		return
	}
	ctx := r.Context()
	if d := s.o.Config.Limits.RequestTimeout.Duration; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, d, proxy.ErrRequestTimeout)
		defer cancel()
	}
	reps, _ := s.table.snapshot()
	p, ok := s.prepare(w, r, kind, reps)
	if !ok {
		return
	}
	rw := proxy.Rewrite{IncludeUsage: p.tr.Stream && !p.tr.IncludeUsage, FullReport: s.o.FullReport}
	upBody, err := rw.Apply(p.body)
	if err != nil {
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
		d, err := s.decide(p.toks, p.id, p.session, p.unkeyed, reps, excluded, true)
		if err != nil {
			if attempt == 0 {
				s.met.Errors.WithLabelValues("", s.policy, "no_engine").Inc()
				proxy.WriteError(w, http.StatusServiceUnavailable, proxy.TypeUnavailable, "no healthy engine")
			} else {
				s.allFailed(w, last)
			}
			return
		}
		s.met.DecisionSeconds.WithLabelValues(s.policy).Observe(d.took.Seconds())
		rep := d.reps[d.chosen]
		if d.cands[d.chosen].Approximate {
			s.met.ApproxDecisions.WithLabelValues(rep.eng.name).Inc()
		}
		healthyLeft := 0
		for i := range d.cands {
			if d.cands[i].Healthy && i != d.chosen {
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
					rep.eng.health.Unreachable(s.now(), why)
				} else {
					rep.eng.health.Failure(s.now(), why)
				}
				for _, r := range rep.eng.reps {
					excluded[r] = true
				}
			} else {
				rep.eng.health.Failure(s.now(), why)
				excluded[rep] = true
			}
			if !rep.eng.gone.Load() {
				s.met.Retries.WithLabelValues(rep.eng.name).Inc()
			}
			rep.retries.Add(1)
			s.logLimited("retry:"+rep.name+":"+out.Kind, "engine attempt failed before the first token; retrying elsewhere, counted in kvroute_router_retries_total",
				"engine", rep.name, "why", why)
			last = out
			continue
		}
		if !out.Started && out.Err != nil && !out.ClientGone {
			s.rollback(d)
		}
		if !out.Started && out.Err != nil {
			switch {
			case out.ClientGone:
			case out.Kind == proxy.KindRequestTimeout:
				proxy.WriteError(w, http.StatusGatewayTimeout, proxy.TypeServer, out.Err.Error())
			default:
				proxy.WriteError(w, http.StatusBadGateway, proxy.TypeServer, "engine "+rep.name+": "+out.Err.Error())
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
	s.allFailed(w, last)
}

// allFailed answers a request whose every attempt failed before its first token.
func (s *Server) allFailed(w http.ResponseWriter, last proxy.Outcome) {
	s.met.Errors.WithLabelValues("", s.policy, "all_failed").Inc()
	msg := "every engine tried failed"
	if last.Err != nil {
		msg += ": " + last.Err.Error()
	}
	proxy.WriteError(w, http.StatusBadGateway, proxy.TypeServer, msg)
}

// forward sends one attempt to the decision's replica and accounts for it. The replica's
// uncached prompt tokens count as prefill until the first token (proxy.Request.OnFirstToken:
// for a stream the first data event with a choice, for a non-streamed answer the answer
// itself), then its prompt tokens count as decode until the end.
func (s *Server) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, d *decision, p *prepared, path string, body []byte, rw proxy.Rewrite, mayRetry bool) proxy.Outcome {
	rep := d.reps[d.chosen]
	dp := rep.eng.dp.Load()
	cached := d.cached[d.chosen]
	uncached := int64(max(d.req.Tokens-cached, 0))
	tokensIn := int64(d.req.Tokens)
	rep.prefill.Add(uncached)
	rep.running.Add(1)
	peerReq := s.peerRecord(peersync.Routed, 0, rep, uncached, tokensIn, d.req.Keys)
	rankLabel := strconv.Itoa(rep.rank)
	if !rep.eng.gone.Load() {
		s.met.InflightRequests.WithLabelValues(rep.eng.name, rankLabel).Inc()
	}
	firstToken := false
	engineHdr := rep.eng.name
	if dp.Ranks() > 1 {
		engineHdr += "/" + rankLabel
	}
	rank := rep.rank
	if dp.Ranks() == 1 {
		rank = -1 // a single-rank engine needs no pin
	}
	out := s.px.Do(ctx, w, proxy.Target{URL: dp.URL, Rank: rank}, &proxy.Request{
		Path: path, Body: body, Header: r.Header, Stream: p.tr.Stream, DropUsageChunk: rw.IncludeUsage,
		MayRetry: mayRetry,
		SetHeaders: func(h http.Header) {
			h.Set("x-kvroute-engine", engineHdr)
			h.Set("x-kvroute-predicted-cached-tokens", strconv.Itoa(cached))
		},
		OnFirstToken: func() {
			firstToken = true
			rep.prefill.Add(-uncached)
			rep.decode.Add(tokensIn)
			s.peerRecord(peersync.FirstToken, peerReq, rep, 0, tokensIn, nil)
		},
	})
	if firstToken {
		rep.decode.Add(-tokensIn)
	} else {
		rep.prefill.Add(-uncached)
	}
	rep.running.Add(-1)
	if out.Err != nil || out.Status >= 500 || out.Cut {
		s.peerRecord(peersync.Failed, peerReq, rep, 0, 0, nil)
	} else {
		s.peerRecord(peersync.Done, peerReq, rep, 0, 0, nil)
	}
	if rep.eng.gone.Load() {
		return out // removed meanwhile: its series are deleted and stay so
	}
	s.met.InflightRequests.WithLabelValues(rep.eng.name, rankLabel).Dec()
	if out.AuthRejected {
		s.engineAuthFailure(callGenerate, rep.eng.name, out.Err)
	}
	if out.Status > 0 && !out.AuthRejected {
		s.met.TTFBSeconds.WithLabelValues(rep.eng.name).Observe(out.TTFB.Seconds())
	}
	if out.EngineError != "" {
		when := "before_first_token"
		if firstToken {
			when = "after_first_token"
		}
		s.met.EngineErrors.WithLabelValues(rep.eng.name, when).Inc()
		s.log.Warn("engine sent an in-stream error", "engine", rep.name, "when", when, "message", out.EngineError)
	}
	if out.Retryable && !out.Started {
		return out
	}
	if p.tr.Stream && out.TTFT > 0 {
		s.met.FirstTokenSeconds.WithLabelValues(rep.eng.name).Observe(out.TTFT.Seconds())
	}
	switch {
	case out.ClientGone, out.Kind == proxy.KindRequestTimeout, out.AuthRejected:
	case out.Cut:
		rep.eng.health.Failure(s.now(), out.Kind+": "+out.Err.Error())
	case out.Status > 0 && out.Status < 500 && out.EngineError == "" && out.Err == nil:
		rep.eng.health.Success()
	}
	code := strconv.Itoa(out.Status)
	if out.Err != nil && !out.Started {
		code = "error"
	}
	s.met.Requests.WithLabelValues(rep.eng.name, s.policy, code).Inc()
	if out.Err != nil {
		reason := out.Kind
		if reason == "" {
			reason = "upstream"
		}
		s.met.Errors.WithLabelValues(rep.eng.name, s.policy, reason).Inc()
		if out.Cut {
			s.log.Warn("answer cut after its first token; the client gets an error event and an aborted connection",
				"engine", rep.name, "kind", out.Kind, "err", out.Err)
		}
	}
	if out.Status == http.StatusOK && !out.Cut && out.Err == nil {
		s.account(rep, d.req.Tokens, cached, out.Usage, d.mode())
	}
	return out
}

// staleAfter and staleHits: a replica whose engine answers staleHits requests in a row, each of
// at least one full block and each staleAfter or more after the stream's last applied batch,
// has a publisher that stopped (a prefill stores blocks, and vLLM publishes them within
// milliseconds). Several in a row, because a request served wholly from the prefix cache
// publishes nothing in incremental mode.
const (
	staleAfter = 2 * time.Second
	staleHits  = 3
)

// checkPublishing marks the stream stale when the engine serves without publishing.
func (s *Server) checkPublishing(rep *replica, promptTokens int) {
	bs := max(s.o.Config.BlockSize, 1)
	if !rep.stream || s.sub == nil || promptTokens < bs {
		return
	}
	st, ok := s.sub.Stats(rep.eng.name, rep.rank)
	if !ok {
		return
	}
	if !st.LastApplied.IsZero() && time.Since(st.LastApplied) < staleAfter {
		rep.quiet.Store(0)
		return
	}
	if rep.quiet.Add(1) >= staleHits && st.State == kvevents.Exact {
		if err := s.sub.Stale(rep.eng.name, rep.rank); err == nil {
			s.log.Warn("engine serves but publishes no KV events; replica scored approximately until they resume",
				"engine", rep.eng.name, "rank", rep.rank, "last_event", st.LastApplied)
		}
	}
}

// account compares the prediction with the engine's reported cached tokens.
func (s *Server) account(rep *replica, promptTokens, predicted int, u *proxy.Usage, mode string) {
	rep.responses.Add(1)
	s.checkPublishing(rep, promptTokens)
	name := rep.eng.name
	if u == nil || !u.HasCached {
		rep.noUsage.Add(1)
		s.met.UsageMissing.WithLabelValues(name).Inc()
		return
	}
	if u.PromptTokens > 0 {
		promptTokens = u.PromptTokens
	}
	rep.withUsage.Add(1)
	rep.promptTok.Add(uint64(promptTokens))
	rep.predictedTok.Add(uint64(predicted))
	rep.actualTok.Add(uint64(u.CachedTokens))
	diff := predicted - u.CachedTokens
	rep.absErrTok.Add(uint64(max(diff, -diff)))
	s.met.PromptTokens.WithLabelValues(name).Add(float64(promptTokens))
	s.met.PredictedCached.WithLabelValues(name).Add(float64(predicted))
	s.met.ActualCached.WithLabelValues(name).Add(float64(u.CachedTokens))
	s.accountMode(rep, mode, promptTokens, predicted, u.CachedTokens)
}

// serveModels forwards GET /v1/models to a healthy engine.
func (s *Server) serveModels(w http.ResponseWriter, r *http.Request) {
	if !s.awaitDiscovery(w, r) {
		return
	}
	reps, _ := s.table.snapshot()
	e := s.tokenizerEngine(reps)
	if e == nil {
		proxy.WriteError(w, http.StatusServiceUnavailable, proxy.TypeUnavailable, "no healthy engine")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.dp.Load().URL+"/v1/models", nil)
	// The same rule as generation: forwarded as is without an engine API key, replaced by
	// the router's key (in the client's transport) with one.
	if a := r.Header.Get("Authorization"); a != "" {
		req.Header.Set("Authorization", a)
	}
	resp, err := s.px.Client().Do(req)
	if err != nil {
		e.health.Failure(s.now(), err.Error())
		proxy.WriteError(w, http.StatusBadGateway, proxy.TypeServer, "engine "+e.name+": "+err.Error())
		return
	}
	defer resp.Body.Close()
	if s.o.EngineAPIKey != "" && proxy.IsAuthStatus(resp.StatusCode) {
		s.engineAuthFailure(callModels, e.name, proxy.ErrEngineAuth)
		proxy.WriteError(w, http.StatusBadGateway, proxy.TypeServer, "engine "+e.name+": "+proxy.ErrEngineAuth.Error())
		return
	}
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
