package app

// Prefill/decode disaggregation: on a fleet with prefill-role and decode-role replicas (the
// operator's serving.kvroute.io/role label, discovery.Engine.Role), a completions or chat
// request is served in vLLM's two steps (the NIXL connector's protocol; vLLM's reference
// proxy, tests/v1/kv_connector/nixl_integration/toy_proxy_server.py): a prefill leg
// (proxy.PrefillLeg: kv_transfer_params.do_remote_decode, max_tokens 1, no stream) on a prefill
// replica, then a decode leg (proxy.DecodeLeg: the prefill answer's kv_transfer_params) on a
// decode replica, streamed or not as the client asked. Each leg is an attempt of the request
// pipeline (pipeline.go): booked by the policy over its own pool (cache overlap against load
// among prefill replicas, then among decode replicas), retried elsewhere in its pool as any
// attempt is, and ended with its outcome. The client sees the decode leg's answer alone, whose
// usage is vLLM's decode answer's (the prompt pulled from the prefill engine reported as
// cached).
//
// Conditional disaggregation (Dynamo's disaggregated router decides the same way: remote
// prefill only when the prompt less its prefix hit exceeds max_local_prefill_length,
// ai-dynamo/dynamo examples/python_rs/llm/vllm_nixl/router/disagg_router.py): a request whose
// decode pick would leave fewer than Options.DisaggMinUncached uncached tokens goes whole to a
// decode replica (both pools run kv_both, so a decode engine computes a prompt itself).

import (
	"bytes"
	"context"
	"errors"
	"net/http"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/proxy"
)

// DefaultDisaggMinUncached is the split threshold's default: 1000 uncached prompt tokens,
// Dynamo's max_local_prefill_length default (the file above). It is borrowed, not measured
// on this router: below it the prefill leg's round trip and the KV transfer are assumed to cost
// more than computing the prompt on the decode replica.
const DefaultDisaggMinUncached = 1000

// The paths of kvroute_router_disagg_requests_total.
const (
	disaggSplit      = "split"
	disaggDecodeOnly = "decode_only"
	disaggFallback   = "fallback"
)

// maxPrefillAnswer bounds the prefill leg's answer the router keeps (one token and the
// transfer parameters: well under a kilobyte from vLLM).
const maxPrefillAnswer = 1 << 20

// pools splits the replicas by role: the prefill pool and the decode pool. Replicas without a
// role (an aggregated engine) are in neither.
func pools(reps []*replica) (prefill, decode []*replica) {
	for _, r := range reps {
		switch r.Eng.Discovery().Role {
		case config.RolePrefill:
			prefill = append(prefill, r)
		case config.RoleDecode:
			decode = append(decode, r)
		}
	}
	return prefill, decode
}

// split serves p in two legs, or decides not to: it returns false when the request is to go
// whole to a decode replica (decode-only, or a prefill leg that failed with no retry left),
// with nothing written to the client; true when the request is answered.
func (s *Router) split(ctx context.Context, w http.ResponseWriter, r *http.Request, rq *requestRecord, p *prepared,
	pre, dec []*replica, upBody []byte, rw proxy.Rewrite) bool {
	if why := s.decodeOnly(p, dec); why != "" {
		s.met.DisaggRequests.WithLabelValues(disaggDecodeOnly, why).Inc()
		return false
	}
	api := apiFor(p.kind)
	preBody, err := proxy.PrefillLeg(upBody)
	if err != nil { // prepare parsed the body: not reached
		return s.fallback("bad_body", err)
	}
	// The prefill leg is an attempt of its own request: no stream, its answer kept here.
	tr := *p.tr
	tr.Stream = false
	pp := *p
	pp.tr, pp.body = &tr, preBody
	var rec legRecorder
	a, out, tried := s.attempts(ctx, &rec, r, &pp, pre, preBody, proxy.Rewrite{}, 0)
	switch {
	case a == nil && tried == 0:
		return s.fallback("no_prefill_replica", nil)
	case a == nil:
		return s.fallback(out.Kind, out.Err)
	case out.ClientGone() || out.Kind == proxy.KindRequestTimeout:
		s.answer(w, rq, api, a, out, tried)
		return true
	case out.Phase != proxy.Answered || out.Err != nil:
		return s.fallback(out.Kind, out.Err)
	case rec.status >= 400 && rec.status < 500:
		// The engine refused the request itself (every engine would): the client reads why.
		rq.outcome = outcomeClientError
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.buf.Bytes())
		return true
	case rec.status != http.StatusOK:
		return s.fallback(proxy.KindStatus, errors.New("prefill engine answered "+http.StatusText(rec.status)))
	}
	params, err := proxy.TransferParams(rec.buf.Bytes())
	if err != nil {
		return s.fallback("no_transfer_params", err)
	}
	decBody, err := proxy.DecodeLeg(upBody, params)
	if err != nil {
		return s.fallback("bad_body", err)
	}
	s.met.DisaggRequests.WithLabelValues(disaggSplit, "").Inc()
	dp := *p
	dp.body = decBody
	// vLLM's decode engine reports the prompt it pulled as cached, less its last token, which
	// it recomputes to sample the first (the NIXL connector's get_num_new_matched_tokens loads
	// the whole prompt; the v1 scheduler's _update_waiting_for_remote_kv takes one back when
	// all of it arrived): that is the decode leg's prediction to compare with.
	expect := max(len(p.toks)-1, 0)
	a, out, tried = s.attempts(ctx, w, r, &dp, dec, decBody, rw, expect)
	s.answer(w, rq, api, a, out, tried)
	return true
}

// decodeOnly says why p is not split ("" to split it): its decode pick (the policy's dry run
// over the decode pool) would leave fewer uncached tokens than the threshold. A request the
// router could not key (no token ids) is split: its length is unknown.
func (s *Router) decodeOnly(p *prepared, dec []*replica) string {
	threshold := s.o.DisaggMinUncached
	if threshold < 0 || len(p.toks) == 0 {
		return ""
	}
	if len(p.toks) < threshold {
		return "short_prompt"
	}
	d, _, err := s.decide(p.toks, p.id, p.session, p.unkeyed, dec, nil, false)
	if err != nil || d.chosen < 0 {
		s.release(d)
		return "" // no decode replica: the split's decode leg answers the client
	}
	uncached := d.Req.Tokens - d.Cached[d.chosen]
	s.release(d)
	if uncached < threshold {
		return "cached_prefix"
	}
	return ""
}

// PrefillHeader is llm-d's prefill header: the prefill endpoint (host:port) a decode pod's
// routing sidecar sends the prefill leg to before it decodes locally; absent, the sidecar
// sends the request whole to its engine (llm-d/llm-d-inference-scheduler pkg/common/common.go
// @545825e0bf76, read by pkg/sidecar/proxy/chat_completions.go @1956ad50d2c7).
const PrefillHeader = "x-prefiller-host-port"

// pickSplit is split's decision for the endpoint picker, where the decode pod's sidecar (not the
// router) runs the two legs: decode-only by the same rule (decodeOnly), else the prefill leg
// booked over the prefill pool by the policy (cache overlap against load there) as split books
// it, its answer the sidecar's (attempt.answerElsewhere). It returns the prefill leg's attempt
// (nil: decode-only, or no prefill replica, counted as split's fallback) and the cached tokens
// the decode engine is to report (the pulled prompt less its last token, as split predicts),
// 0 for decode-only.
func (s *Router) pickSplit(p *prepared, pre, dec []*replica) (*attempt, int) {
	if why := s.decodeOnly(p, dec); why != "" {
		s.met.DisaggRequests.WithLabelValues(disaggDecodeOnly, why).Inc()
		return nil, 0
	}
	a, err := s.book(p, pre, map[*replica]bool{})
	if err != nil {
		s.fallback("no_prefill_replica", nil)
		return nil, 0
	}
	a.answerElsewhere = true
	s.met.DisaggRequests.WithLabelValues(disaggSplit, "").Inc()
	return a, max(len(p.toks)-1, 0)
}

// fallback counts and logs a prefill leg that failed with no retry left: the request goes
// whole to a decode replica.
func (s *Router) fallback(reason string, err error) bool {
	if reason == "" {
		reason = "upstream"
	}
	s.met.DisaggRequests.WithLabelValues(disaggFallback, reason).Inc()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	s.logLimited("disagg-fallback:"+reason, "prefill leg failed with no retry left; the request goes whole to a decode replica, counted in kvroute_router_disagg_requests_total{path=\"fallback\"}",
		"reason", reason, "err", msg)
	return false
}

// legRecorder keeps the prefill leg's answer for the router (the client never sees it), up to
// maxPrefillAnswer bytes; the rest is dropped, which TransferParams then refuses.
type legRecorder struct {
	h      http.Header
	status int
	buf    bytes.Buffer
}

func (l *legRecorder) Header() http.Header {
	if l.h == nil {
		l.h = http.Header{}
	}
	return l.h
}

func (l *legRecorder) WriteHeader(status int) { l.status = status }

func (l *legRecorder) Write(b []byte) (int, error) {
	if l.status == 0 {
		l.status = http.StatusOK
	}
	if room := maxPrefillAnswer - l.buf.Len(); room > 0 {
		l.buf.Write(b[:min(len(b), room)])
	}
	return len(b), nil
}

// DisaggInfo is the disaggregation section of GET /debug/engines (a fleet with a role).
type DisaggInfo struct {
	// PrefillReplicas and DecodeReplicas count the replicas (engine, DP rank) of each pool.
	PrefillReplicas int `json:"prefill_replicas"`
	DecodeReplicas  int `json:"decode_replicas"`
	// Splitting: both pools have replicas, so completions and chat requests are split.
	Splitting bool `json:"splitting"`
	// MinUncached is the split threshold (Options.DisaggMinUncached; < 0: always split).
	MinUncached int `json:"min_uncached_tokens"`
}

func (s *Router) disaggInfo(pre, dec []*replica) DisaggInfo {
	return DisaggInfo{PrefillReplicas: len(pre), DecodeReplicas: len(dec), Splitting: len(pre) > 0 && len(dec) > 0,
		MinUncached: s.o.DisaggMinUncached}
}
