package app

// Prefill/decode disaggregation: on a fleet with prefill-role and decode-role replicas (the
// operator's serving.kvroute.io/role label, discovery.Engine.Role), a completions, chat or
// Messages request is served in vLLM's two steps (the NIXL connector's protocol; vLLM's
// reference proxy, tests/v1/kv_connector/nixl_integration/toy_proxy_server.py): a prefill leg
// (proxy.PrefillLeg: kv_transfer_params.do_remote_decode, max_tokens 1, no stream) on a prefill
// replica, then a decode leg (proxy.DecodeLeg: the prefill answer's kv_transfer_params) on a
// decode replica, streamed or not as the client asked. Each leg is an attempt of the request
// pipeline (pipeline.go): booked by the policy over its own pool (cache overlap against load
// among decode replicas, then among prefill replicas), retried elsewhere in its pool as any
// attempt is, and ended with its outcome. The decode pick comes first, as Dynamo's and llm-d's
// routers pick the decode worker first: its booking is a decode leg (the prompt pulled, booked
// as transfer: load.Routing.Transfer) from the moment it is made, so a sibling request decided
// while the prefill leg runs sees it. The client sees the decode leg's answer alone, whose
// usage is vLLM's decode answer's (the prompt pulled from the prefill engine reported as
// cached).
//
// Conditional disaggregation (Dynamo's disaggregated router decides the same way: remote
// prefill only when the prompt less its prefix hit exceeds max_local_prefill_length,
// ai-dynamo/dynamo examples/python_rs/llm/vllm_nixl/router/disagg_router.py): a request whose
// decode pick leaves fewer than Options.DisaggMinUncached uncached tokens goes whole to that
// decode replica (both pools run kv_both, so a decode engine computes a prompt itself). The
// choice is made in the decode booking itself (legChoose), under the ledger's lock, from the
// very decision that books it.

import (
	"bytes"
	"context"
	"errors"
	"net/http"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/tokens"
)

// DefaultDisaggMinUncached is the split threshold's default: 1000 uncached prompt tokens. It
// started as Dynamo's max_local_prefill_length default (the file above); kvbench replay's sweep
// (docs/disaggregation.md, "Measured") keeps it: the largest value tried that does not turn a
// shared-prefix workload's 1.5k-token turns into decode-only requests (which cost it 70% TTFT
// p90 and 5x ITL), and slightly ahead of splitting everything on the conversation trace.
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

// leg is what a booking books on the replica it picks (decideLeg).
type leg uint8

const (
	// legWhole: the whole request; its uncached prompt is prefill work on the replica.
	legWhole leg = iota
	// legDecode: a split request's decode leg; the replica pulls the uncached prompt from the
	// prefill engine (load.Routing.Transfer) and computes its last token only.
	legDecode
	// legChoose: a decode leg, or the whole request when the pick would leave fewer uncached
	// tokens than the threshold (wholeReason): conditional disaggregation, decided from the
	// booking's own decision under the ledger's lock.
	legChoose
)

// pull books rt as a decode leg: the uncached prompt but its last token is transfer, which the
// replica then holds as computed (Cached: the context its one token attends over).
func pull(rt *load.Routing) {
	t := max(rt.Uncached-1, 0)
	rt.Uncached -= t
	rt.Cached += t
	rt.Transfer = t
}

// wholeReason says why the request booked on candidate i of d goes whole to that decode
// replica rather than being split ("" to split it): its prompt is shorter than the threshold,
// or the replica's cached prefix leaves fewer uncached tokens than that. A request the router
// could not key (no token ids) is split: its length is unknown.
func (s *Router) wholeReason(d *decision, i int) string {
	threshold := s.o.DisaggMinUncached
	switch {
	case threshold < 0 || d.Req.Tokens == 0:
		return ""
	case d.Req.Tokens < threshold:
		return "short_prompt"
	case d.Uncached(i) < threshold:
		return "cached_prefix"
	}
	return ""
}

// splits says whether requests of kind go in two legs. vLLM's completions, chat and Messages
// requests carry kv_transfer_params both ways (vllm/entrypoints/openai/chat_completion/protocol.py;
// vllm/entrypoints/anthropic/protocol.py, AnthropicMessagesRequest and
// AnthropicMessagesResponse, at commit 00589e563e771f2de7abeb48bd0814873e891411); its Responses
// API does not (vllm/entrypoints/openai/responses/protocol.py at
// 010a69cea9ac46d2953fa673c3b814f922d1b194: neither ResponsesRequest nor ResponsesResponse
// has the field, and its vllm_xargs cannot hold the object), so a decode engine could not be
// told where the prompt is.
func splits(kind tokens.Kind) bool {
	return kind == tokens.Completion || kind == tokens.Chat || kind == tokens.Messages
}

// disaggregate serves a generation request p on a fleet with both pools: the decode pick first, booked with the
// conditional choice (legChoose); then either the whole request on it, or the prefill leg and
// the decode leg on it. It returns false, with nothing written to the client, when the request
// is to go whole to a decode replica booked anew (no decode replica to book now, a prefill leg
// that failed with no retry left); true when the request is answered.
func (s *Router) disaggregate(ctx context.Context, w http.ResponseWriter, r *http.Request, rq *requestRecord, p *prepared,
	pre, dec []*replica, upBody []byte, rw proxy.Rewrite) bool {
	api := apiFor(p.kind)
	if !splits(p.kind) {
		s.met.DisaggRequests.WithLabelValues(disaggDecodeOnly, "api_unsupported").Inc()
		return false
	}
	endDecide := s.childSpan(ctx, "kvroute.decide")
	da, err := s.bookLeg(p, dec, map[*replica]bool{}, legChoose)
	if err != nil {
		endDecide()
		return false // no decode replica: the attempts over the decode pool answer why
	}
	s.endDecideSpan(endDecide, da)
	if !da.d.pulled {
		s.met.DisaggRequests.WithLabelValues(disaggDecodeOnly, da.d.whole).Inc()
		a, out, tried := s.attempts(ctx, w, r, p, dec, upBody, rw, da)
		s.answer(w, rq, api, a, out, tried)
		return true
	}
	preBody, err := proxy.PrefillLeg(upBody)
	if err != nil { // prepare parsed the body: not reached
		da.withdraw()
		return s.fallback("bad_body", err)
	}
	// The prefill leg is an attempt of its own request: no stream, its answer kept here.
	tr := *p.tr
	tr.Stream = false
	pp := *p
	pp.tr, pp.body = &tr, preBody
	var rec legRecorder
	a, out, tried := s.attempts(ctx, &rec, r, &pp, pre, preBody, proxy.Rewrite{}, nil)
	switch {
	case a == nil && tried == 0:
		da.withdraw()
		return s.fallback("no_prefill_replica", nil)
	case a == nil:
		da.withdraw()
		return s.fallback(out.Kind, out.Err)
	case out.ClientGone() || out.Kind == proxy.KindRequestTimeout:
		da.withdraw()
		s.answer(w, rq, api, a, out, tried)
		return true
	case out.Phase != proxy.Answered || out.Err != nil:
		da.withdraw()
		return s.fallback(out.Kind, out.Err)
	case rec.status >= 400 && rec.status < 500:
		// The engine refused the request itself (every engine would): the client reads why.
		da.withdraw()
		rq.outcome = outcomeClientError
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.buf.Bytes())
		return true
	case rec.status != http.StatusOK:
		da.withdraw()
		return s.fallback(proxy.KindStatus, errors.New("prefill engine answered "+http.StatusText(rec.status)))
	}
	params, err := proxy.TransferParams(rec.buf.Bytes())
	if err != nil {
		da.withdraw()
		return s.fallback("no_transfer_params", err)
	}
	decBody, err := proxy.DecodeLeg(upBody, params)
	if err != nil {
		da.withdraw()
		return s.fallback("bad_body", err)
	}
	s.met.DisaggRequests.WithLabelValues(disaggSplit, "").Inc()
	dp := *p
	dp.body = decBody
	a, out, tried = s.attempts(ctx, w, r, &dp, dec, decBody, rw, da)
	s.answer(w, rq, api, a, out, tried)
	return true
}

// PrefillHeader is llm-d's prefill header: the prefill endpoint (host:port) a decode pod's
// routing sidecar sends the prefill leg to before it decodes locally; absent, the sidecar
// sends the request whole to its engine (llm-d/llm-d-inference-scheduler pkg/common/common.go
// @545825e0bf76, read by pkg/sidecar/proxy/chat_completions.go @1956ad50d2c7).
const PrefillHeader = "x-prefiller-host-port"

// pickPrefill is the endpoint picker's prefill leg, for a decode booking that pulls its
// prompt (decision.pulled): booked over the prefill pool by the policy (cache overlap against
// load there) as disaggregate books it, its answer the decode pod's sidecar's
// (attempt.answerElsewhere). Nil when no prefill replica can take it (counted as split's
// fallback).
func (s *Router) pickPrefill(p *prepared, pre []*replica) *attempt {
	a, err := s.book(p, pre, map[*replica]bool{})
	if err != nil {
		s.fallback("no_prefill_replica", nil)
		return nil
	}
	a.answerElsewhere = true
	s.met.DisaggRequests.WithLabelValues(disaggSplit, "").Inc()
	return a
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
