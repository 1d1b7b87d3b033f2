package app

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/router/degraded"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/metrics"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/route"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/router/tokens"
)

// EngineInfo is one engine in GET /debug/engines.
type EngineInfo struct {
	Name  string `json:"name"`
	URL   string `json:"url"`
	Model string `json:"model"`
	Ready bool   `json:"ready"`
	// Role is the engine's pool in a disaggregated model (prefill, decode); absent otherwise.
	Role         string            `json:"role,omitempty"`
	Health       proxy.HealthState `json:"health"`
	WarmupUntil  *time.Time        `json:"warmup_until,omitempty"`
	WarmupCredit float64           `json:"warmup_credit"`
	Ranks        []RankInfo        `json:"ranks"`
	// Kind is the engine family (--engine-kind); NotApplicable the router's vLLM checks that do
	// not apply to it, each with why; Refused, for an engine of another kind than the router's,
	// why it is not routed to (it has no ranks then).
	Kind          string   `json:"kind"`
	NotApplicable []string `json:"not_applicable,omitempty"`
	Refused       string   `json:"refused,omitempty"`
}

// RankInfo is one (engine, DP rank).
type RankInfo struct {
	Rank int `json:"rank"`
	// Stream is exact, replaying, approximate, inexact, or none (no event stream).
	Stream string `json:"stream"`
	// Scoring is "exact" when the exact index alone is trusted, else "approximate".
	Scoring         string  `json:"scoring"`
	LastSeq         *uint64 `json:"last_seq"`
	Partial         bool    `json:"partial"`
	Gaps            uint64  `json:"gaps"`
	Replays         uint64  `json:"replays"`
	Resets          uint64  `json:"resets"`
	TopicMismatches uint64  `json:"topic_mismatches"`
	DecodeErrors    uint64  `json:"decode_errors"`
	Panics          uint64  `json:"panics"`
	// Retries are this router's attempts given up on the replica before the first token.
	Retries uint64 `json:"retries"`
	// Counters is every counter of the stream (kvevents.Stats), by its /debug name; absent when
	// the replica has no event stream.
	Counters  map[string]uint64 `json:"counters,omitempty"`
	Blocks    map[string]int    `json:"blocks"`
	LastEvent *time.Time        `json:"last_event,omitempty"`
	Inflight  Inflight          `json:"inflight"`
	// PeerInflight is what the other router replicas have in flight there (absent when alone).
	PeerInflight *Inflight `json:"peer_inflight,omitempty"`
	// Seeded: the stream started from a peer router's snapshot, confirmed by the engine.
	Seeded bool `json:"seeded,omitempty"`
	// PublisherID is the engine process's id from its 24-byte sequence frames (hex; absent for
	// an engine without a snapshot endpoint); Stalled: it sends heartbeats and none came lately.
	PublisherID string `json:"publisher_id,omitempty"`
	Stalled     bool   `json:"stalled,omitempty"`
	// Ownership is the ownership values the engine's events named (vLLM's residency key).
	Ownership []string `json:"ownership,omitempty"`
	Accuracy  Accuracy `json:"accuracy"`
	// Degraded is every reason in force on the replica (see router/degraded), [] when none.
	Degraded []degraded.Status `json:"degraded"`
	// Demoted: evidence says its keys are wrong, so it is scored approximately.
	Demoted bool `json:"demoted"`
}

// Inflight is the load this router has sent to a replica and not seen finish.
type Inflight struct {
	Running       int64 `json:"running"`
	PrefillTokens int64 `json:"prefill_tokens"`
	DecodeTokens  int64 `json:"decode_tokens"`
	// PrefillHeldTokens: what the requests in prefill will hold once they decode (their
	// prompts); not carried by other routers' totals, so absent from peer_inflight.
	PrefillHeldTokens int64 `json:"prefill_held_tokens,omitempty"`
}

// Accuracy compares predicted and engine-reported cached tokens.
type Accuracy struct {
	Responses       uint64 `json:"responses"`
	WithUsage       uint64 `json:"with_usage"`
	NoUsage         uint64 `json:"no_usage"`
	PromptTokens    uint64 `json:"prompt_tokens"`
	PredictedCached uint64 `json:"predicted_cached_tokens"`
	ActualCached    uint64 `json:"actual_cached_tokens"`
	AbsErrorTokens  uint64 `json:"abs_error_tokens"`
	// NoUsageSeen is set when answers came back but none carried cached_tokens: the engine
	// probably runs without --enable-prompt-tokens-details.
	NoUsageSeen bool `json:"no_usage_seen"`
}

// Engines returns what /debug/engines shows.
func (s *Router) Engines() []EngineInfo {
	reps := s.reps()
	now := s.now()
	var out []EngineInfo
	var cur *EngineInfo
	for _, r := range reps {
		if cur == nil || cur.Name != r.Eng.Name {
			dp := r.Eng.Discovery()
			prof := s.fleet.Kind().Profile()
			out = append(out, EngineInfo{Name: dp.Name, URL: dp.URL, Model: r.Eng.Model, Ready: dp.Ready, Role: dp.Role,
				Health: r.Eng.Health.State(now), WarmupCredit: s.warmupCredit(dp.WarmupUntil, now),
				Kind: string(prof.Kind), NotApplicable: prof.NotApplicable})
			cur = &out[len(out)-1]
			if !dp.WarmupUntil.IsZero() {
				wu := dp.WarmupUntil
				cur.WarmupUntil = &wu
			}
		}
		cur.Ranks = append(cur.Ranks, s.rankInfo(r))
	}
	refused := s.fleet.Refused()
	for _, name := range slices.Sorted(maps.Keys(refused)) {
		out = append(out, EngineInfo{Name: name, Kind: string(s.fleet.Kind()), Refused: refused[name], Ranks: []RankInfo{}})
	}
	return out
}

func (s *Router) rankInfo(r *replica) RankInfo {
	ri := RankInfo{Rank: r.Rank, Stream: "none", Scoring: "approximate", Blocks: map[string]int{}}
	applied := false // last_event only for a stream that applied a batch: the index also stamps clears
	if r.Stream && s.sub != nil {
		if st, ok := s.sub.Stats(r.Eng.Name, r.Rank); ok {
			ri.Stream = st.State.String()
			if st.HaveSeq {
				seq := st.LastSeq
				ri.LastSeq = &seq
			}
			ri.Partial, ri.Gaps, ri.Replays, ri.Resets, ri.TopicMismatches = st.Partial, st.Gaps, st.Replays, st.Resets, st.TopicMismatches
			ri.Seeded, ri.PublisherID, ri.Stalled, ri.Ownership = st.Seeded, st.Publisher, st.Stalled, st.Owners
			ri.DecodeErrors, ri.Panics = st.DecodeErrors, st.Panics
			ri.Counters = map[string]uint64{}
			for _, c := range st.Counters() {
				ri.Counters[c.Key] = c.Value
			}
			applied = st.Applied > 0
		}
	}
	v := r.View()
	if s.exactStream(r) {
		ri.Scoring = "exact"
	}
	if st, err := s.ix.Stats(r.ID); err == nil {
		for t := index.Tier(0); t < index.NumTiers; t++ {
			ri.Blocks[t.String()] = st.Blocks[t]
		}
		if applied && !st.Updated.IsZero() {
			u := st.Updated
			ri.LastEvent = &u
		}
	}
	ri.Retries = r.C.Retries.Load()
	ld := r.Load.Load()
	ri.Inflight = Inflight{Running: ld.Running, PrefillTokens: ld.PrefillTokens, DecodeTokens: ld.DecodeTokens,
		PrefillHeldTokens: ld.PrefillHeldTokens}
	if s.peer != nil {
		p := s.peerLoad(r)
		ri.PeerInflight = &Inflight{Running: p.Running, PrefillTokens: p.PrefillTokens, DecodeTokens: p.DecodeTokens}
	}
	c := &r.C
	ri.Accuracy = Accuracy{Responses: c.Responses.Load(), WithUsage: c.WithUsage.Load(), NoUsage: c.NoUsage.Load(),
		PromptTokens: c.PromptTokens.Load(), PredictedCached: c.PredictedTokens.Load(), ActualCached: c.ActualTokens.Load(),
		AbsErrorTokens: c.AbsErr.Load()}
	ri.Accuracy.NoUsageSeen = ri.Accuracy.Responses > 0 && ri.Accuracy.WithUsage == 0
	ri.Degraded = v.Degraded
	if ri.Degraded == nil {
		ri.Degraded = []degraded.Status{}
	}
	ri.Demoted = v.Demoted
	return ri
}

// DebugEngines serves GET /debug/engines.
func (s *Router) DebugEngines(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	reps := s.reps()
	bs, bsFrom := s.blockSize(reps)
	out := map[string]any{"backlog": s.backlog(reps), "hold": s.hold.Stats(), "policy": s.policy, "block_size": bs, "block_size_source": bsFrom, "engines": s.Engines(),
		"index_entries": s.ix.Keys(), "tokenize_degraded": s.tokenizeDegraded.Load(), "tokenizer": s.tok.Stats(),
		// Bound mode: messages whose topic named no engine, so no engine's counters hold them.
		"events_unroutable": uint64(s.unroutableEvents())}
	if pre, dec := pools(reps); len(pre)+len(dec) > 0 {
		out["disaggregation"] = s.disaggInfo(pre, dec)
	}
	if s.peer != nil {
		out["router_peers"] = s.peerInfo()
	}
	for key, section := range s.debugSections {
		out[key] = section()
	}
	_ = enc.Encode(out)
}

// debugEnginesKeys are the keys DebugEngines itself writes (a test holds it to the answer).
var debugEnginesKeys = []string{"backlog", "hold", "policy", "block_size", "block_size_source", "engines", "index_entries",
	"tokenize_degraded", "tokenizer", "events_unroutable", "router_peers", "disaggregation"}

// AddDebugSection adds a router-wide section to GET /debug/engines under key, read on every
// call (e.g. the trace capture's written and dropped counts, which live in cmd/kvrouter's
// observers). Call it before serving; a key the answer already uses is refused.
func (s *Router) AddDebugSection(key string, read func() any) error {
	if key == "" || slices.Contains(debugEnginesKeys, key) {
		return fmt.Errorf("debug section %q: the key is taken", key)
	}
	if _, dup := s.debugSections[key]; dup {
		return fmt.Errorf("debug section %q added twice", key)
	}
	if s.debugSections == nil {
		s.debugSections = map[string]func() any{}
	}
	s.debugSections[key] = read
	return nil
}

// RouteCandidate is one replica's signals and predicted hit in POST /debug/route.
type RouteCandidate struct {
	Replica         string  `json:"replica"`
	Healthy         bool    `json:"healthy"`
	Approximate     bool    `json:"approximate"`
	ExactBlocks     int     `json:"exact_blocks"`
	TierBlocks      [3]int  `json:"tier_blocks"`
	PredictedBlocks int     `json:"predicted_blocks"`
	CachedTokens    int     `json:"predicted_cached_tokens"`
	PrefillTokens   int     `json:"prefill_tokens"`
	DecodeTokens    int     `json:"decode_tokens"`
	Running         int     `json:"running"`
	WarmupCredit    float64 `json:"warmup_credit"`
	// Breakdown is every number the decision weighed for the replica: overlap per tier,
	// predicted, warm-up credit, each load term, the guards that excluded it and the policy's
	// own terms when it explains itself (score.Explainer).
	Breakdown route.Breakdown `json:"breakdown"`
}

// RouteAnswer is POST /debug/route's answer.
type RouteAnswer struct {
	Policy    string `json:"policy"`
	Tokens    int    `json:"tokens"`
	Blocks    int    `json:"blocks"`
	BlockSize int    `json:"block_size"`
	LoRA      string `json:"lora,omitempty"`
	Degraded  bool   `json:"degraded"`
	Unkeyed   string `json:"unkeyed,omitempty"`
	// Pick is the replica the policy would choose (Chosen is its older name).
	Pick       string           `json:"pick"`
	Chosen     string           `json:"chosen"`
	DecisionUS float64          `json:"decision_us"`
	Candidates []RouteCandidate `json:"candidates"`
}

// serveDebugRoute scores a request body without forwarding it or telling the policy. The
// body is a completions body, or a chat body when it has "messages" (or ?kind=chat).
// debugRouteConcurrency bounds /debug/route calls in flight: each one may make an engine render
// the prompt, so the admin port must not become a way to load the engines.
const debugRouteConcurrency = 2

// DebugRoute serves POST /debug/route.
func (s *Router) DebugRoute(w http.ResponseWriter, r *http.Request) {
	select {
	case s.debugRouteSlots <- struct{}{}:
		defer func() { <-s.debugRouteSlots }()
	default:
		proxy.WriteError(w, http.StatusTooManyRequests,
			fmt.Sprintf("%d /debug/route calls are in flight already; retry when one has finished", debugRouteConcurrency))
		return
	}
	kind := tokens.Completion
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.o.Config.Limits.MaxBodyBytes))
	if err != nil {
		proxy.WriteError(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	}
	var probe map[string]json.RawMessage
	if r.URL.Query().Get("kind") == "chat" || (json.Unmarshal(body, &probe) == nil && probe["messages"] != nil) {
		kind = tokens.Chat
	}
	reps := s.reps()
	p, refused := s.prepare(r.Context(), r.Header, kind, body, reps)
	if refused != nil {
		refused.write(w)
		return
	}
	d, ex, err := s.decide(p.toks, p.id, p.session, p.unkeyed, reps, nil, false)
	if err != nil {
		s.release(d)
		proxy.WriteError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	ans := s.routeAnswer(d, ex, p)
	s.release(d) // the answer holds copies, and the guards' shared read-only slices
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(ans); err != nil {
		s.log.Debug("/debug/route answer not written", "err", err)
	}
}

// routeAnswer renders a decision for /debug/route and the sampled access log.
func (s *Router) routeAnswer(d *decision, ex []score.Explanation, p *prepared) RouteAnswer {
	ans := RouteAnswer{Policy: s.policy, Tokens: d.Req.Tokens, Blocks: len(d.Req.Keys), BlockSize: d.Req.BlockSize,
		LoRA: p.id.LoRAName, Degraded: p.degraded, Unkeyed: d.Unkeyed, Pick: d.reps[d.chosen].Name, Chosen: d.reps[d.chosen].Name,
		DecisionUS: float64(d.took.Nanoseconds()) / 1e3}
	bd := d.Breakdowns(ex)
	for i, c := range d.Cands {
		ans.Candidates = append(ans.Candidates, RouteCandidate{Replica: c.ID, Healthy: c.Healthy, Approximate: c.Approximate,
			ExactBlocks: c.ExactBlocks, TierBlocks: c.TierBlocks, PredictedBlocks: c.PredictedBlocks, CachedTokens: d.Cached[i],
			PrefillTokens: c.PrefillTokens, DecodeTokens: c.DecodeTokens, Running: c.Running, WarmupCredit: c.WarmupCredit,
			Breakdown: bd[i]})
	}
	return ans
}

// streamMetrics feeds the scrape-time collector.
func (s *Router) streamMetrics() []metrics.Stream {
	now := s.now()
	var out []metrics.Stream
	for _, r := range s.reps() {
		ri := s.rankInfo(r)
		m := metrics.Stream{Engine: r.Eng.Name, Rank: strconv.Itoa(r.Rank), State: ri.Stream,
			BlocksGPU: float64(ri.Blocks["GPU"]), BlocksCPU: float64(ri.Blocks["CPU"]), BlocksDisk: float64(ri.Blocks["Disk"]),
			Healthy:      r.Eng.Discovery().Ready && r.Eng.Health.Healthy(now),
			WarmupCredit: s.warmupCredit(r.Eng.Discovery().WarmupUntil, now), Degraded: degradedNames(ri.Degraded)}
		if ri.LastSeq != nil {
			m.LastSeq = float64(*ri.LastSeq)
		}
		if ri.LastEvent != nil {
			m.EventLagSeconds = now.Sub(*ri.LastEvent).Seconds()
		}
		if r.Stream && s.sub != nil {
			if st, ok := s.sub.Stats(r.Eng.Name, r.Rank); ok {
				for _, c := range st.Counters() {
					m.Counters = append(m.Counters, float64(c.Value))
				}
			}
		}
		out = append(out, m)
	}
	return out
}
