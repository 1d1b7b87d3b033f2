package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
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
			if st, ok := s.sub.Stats(r.eng.name, r.rank); ok && st.BlockSize > 0 {
				return st.BlockSize, blockSizeFromEvents
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
		c := score.Candidate{
			ID:            r.name,
			Healthy:       dp.Ready && r.eng.health.Healthy(now) && !excluded[r],
			PrefillTokens: int(r.prefill.Load()),
			DecodeTokens:  int(r.decode.Load()),
			Running:       int(r.running.Load()),
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
	id := d.reps[d.chosen].id
	s.predicted.Predict(id, d.req.Keys, now)
	// The approximate index stands in for a missing stream; a replica with a whole stream
	// never reads it, so its decisions are not written there.
	if d.cands[d.chosen].Approximate {
		s.approx.Predict(id, d.req.Keys, now)
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
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.o.Config.Limits.MaxBodyBytes))
	if err != nil {
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
	if err != nil {
		s.met.TokenizeFailures.Inc()
		s.tokenizeDegraded.Add(1)
		s.noteTokenizeFailure(te, err)
		s.log.Warn("tokenization failed; routing by load only", "err", err)
		p.degraded = true
		return p, true
	}
	s.met.TokenizeSource.WithLabelValues(src.String()).Inc()
	p.toks = toks
	return p, true
}

func (s *Server) serveGenerate(w http.ResponseWriter, r *http.Request, kind tokens.Kind) {
	s.requestsTotal.Add(1)
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
				s.met.Errors.WithLabelValues("", s.policy, "all_failed").Inc()
				proxy.WriteError(w, http.StatusBadGateway, proxy.TypeServer, fmt.Sprintf("every engine tried failed: %v", last.Err))
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
		out := s.forward(w, r, d, p, path, upBody, rw, attempt < s.o.MaxAttempts-1 && healthyLeft > 0)
		if out.Retryable && !out.Started {
			why := fmt.Sprintf("status %d", out.Status)
			if out.Err != nil {
				why = out.Err.Error()
			}
			rep.eng.health.Failure(s.now(), why)
			s.met.Retries.WithLabelValues(rep.eng.name).Inc()
			s.log.Warn("engine attempt failed before the first byte; retrying elsewhere", "engine", rep.name, "why", why)
			excluded[rep] = true
			last = out
			continue
		}
		return
	}
	s.met.Errors.WithLabelValues("", s.policy, "all_failed").Inc()
	proxy.WriteError(w, http.StatusBadGateway, proxy.TypeServer, fmt.Sprintf("every engine tried failed: %v", last.Err))
}

// forward sends one attempt to the decision's replica and accounts for it.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, d *decision, p *prepared, path string, body []byte, rw proxy.Rewrite, mayRetry bool) proxy.Outcome {
	rep := d.reps[d.chosen]
	dp := rep.eng.dp.Load()
	cached := d.cached[d.chosen]
	uncached := int64(max(d.req.Tokens-cached, 0))
	tokensIn := int64(d.req.Tokens)
	rep.prefill.Add(uncached)
	rep.running.Add(1)
	rankLabel := strconv.Itoa(rep.rank)
	s.met.InflightRequests.WithLabelValues(rep.eng.name, rankLabel).Inc()
	firstByte := false
	engineHdr := rep.eng.name
	if dp.Ranks() > 1 {
		engineHdr += "/" + rankLabel
	}
	rank := rep.rank
	if dp.Ranks() == 1 {
		rank = -1 // a single-rank engine needs no pin
	}
	out := s.px.Do(r.Context(), w, proxy.Target{URL: dp.URL, Rank: rank}, &proxy.Request{
		Path: path, Body: body, Header: r.Header, Stream: p.tr.Stream, DropUsageChunk: rw.IncludeUsage,
		MayRetry: mayRetry,
		SetHeaders: func(h http.Header) {
			h.Set("x-kvroute-engine", engineHdr)
			h.Set("x-kvroute-predicted-cached-tokens", strconv.Itoa(cached))
		},
		OnFirstByte: func() {
			firstByte = true
			rep.prefill.Add(-uncached)
			rep.decode.Add(tokensIn)
		},
	})
	if firstByte {
		rep.decode.Add(-tokensIn)
	} else {
		rep.prefill.Add(-uncached)
	}
	rep.running.Add(-1)
	s.met.InflightRequests.WithLabelValues(rep.eng.name, rankLabel).Dec()
	if out.Retryable && !out.Started {
		return out
	}
	if out.Status > 0 {
		s.met.TTFBSeconds.WithLabelValues(rep.eng.name).Observe(out.TTFB.Seconds())
		if out.Status < 500 {
			rep.eng.health.Success()
		}
	}
	code := strconv.Itoa(out.Status)
	if out.Err != nil && !out.Started {
		code = "error"
	}
	s.met.Requests.WithLabelValues(rep.eng.name, s.policy, code).Inc()
	if out.Err != nil {
		reason := "upstream"
		if out.ClientGone {
			reason = "client_gone"
		}
		s.met.Errors.WithLabelValues(rep.eng.name, s.policy, reason).Inc()
		if !out.Started {
			proxy.WriteError(w, http.StatusBadGateway, proxy.TypeServer, "engine "+rep.name+": "+out.Err.Error())
		}
	}
	if out.Status == http.StatusOK {
		s.account(rep, d.req.Tokens, cached, out.Usage, d.mode())
	}
	return out
}

// account compares the prediction with the engine's reported cached tokens.
func (s *Server) account(rep *replica, promptTokens, predicted int, u *proxy.Usage, mode string) {
	rep.responses.Add(1)
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
	reps, _ := s.table.snapshot()
	e := s.tokenizerEngine(reps)
	if e == nil {
		proxy.WriteError(w, http.StatusServiceUnavailable, proxy.TypeUnavailable, "no healthy engine")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.dp.Load().URL+"/v1/models", nil)
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
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
