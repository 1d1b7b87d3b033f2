// Package debugview renders the router's admin answers (GET /debug/engines, POST /debug/route)
// as pure functions over what the router read: the JSON shapes and the mapping from one
// replica's stream, index and load figures to its entry. router/app reads the live parts and
// serves the answer through router/server's admin mux; nothing here reads a live counter.
package debugview

import (
	"maps"
	"slices"
	"time"

	"github.com/kvroute/kvroute/router/degraded"
	"github.com/kvroute/kvroute/router/engine"
	"github.com/kvroute/kvroute/router/fleet"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/route"
	"github.com/kvroute/kvroute/router/score"
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
	// TransferTokens: prompt tokens its requests pull from a prefill engine before their first
	// token (split requests' decode legs), counted apart from PrefillTokens.
	TransferTokens int64 `json:"transfer_tokens,omitempty"`
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

// RankView is what the router read of one replica for its /debug/engines entry.
type RankView struct {
	Replica *fleet.Replica
	// Stream is the replica's event stream counters (nil: no stream).
	Stream *kvevents.Stats
	// Exact: the replica is scored from its exact index alone.
	Exact bool
	// Index is the replica's part of the index (nil: the index has none).
	Index *index.ReplicaStats
	// Peer is what the other router replicas have in flight there (nil when alone).
	Peer *load.Load
}

// Rank renders one replica's entry.
func Rank(in RankView) RankInfo {
	r := in.Replica
	ri := RankInfo{Rank: r.Rank, Stream: "none", Scoring: "approximate", Blocks: map[string]int{}}
	applied := false // last_event only for a stream that applied a batch: the index also stamps clears
	if st := in.Stream; st != nil {
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
	v := r.View()
	if in.Exact {
		ri.Scoring = "exact"
	}
	if st := in.Index; st != nil {
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
		PrefillHeldTokens: ld.PrefillHeldTokens, TransferTokens: ld.TransferTokens}
	if p := in.Peer; p != nil {
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

// Engines groups the replicas' entries (ranks[i] is reps[i]'s) by engine, in the fleet's order,
// then lists the engines the fleet refused, by name. credit is the engine's warm-up credit now.
func Engines(reps []*fleet.Replica, ranks []RankInfo, now time.Time, kind engine.Kind, refused map[string]string,
	credit func(until time.Time) float64) []EngineInfo {
	var out []EngineInfo
	var cur *EngineInfo
	prof := kind.Profile()
	for i, r := range reps {
		if cur == nil || cur.Name != r.Eng.Name {
			dp := r.Eng.Discovery()
			out = append(out, EngineInfo{Name: dp.Name, URL: dp.URL, Model: r.Eng.Model, Ready: dp.Ready, Role: dp.Role,
				Health: r.Eng.Health.State(now), WarmupCredit: credit(dp.WarmupUntil),
				Kind: string(prof.Kind), NotApplicable: prof.NotApplicable})
			cur = &out[len(out)-1]
			if !dp.WarmupUntil.IsZero() {
				wu := dp.WarmupUntil
				cur.WarmupUntil = &wu
			}
		}
		cur.Ranks = append(cur.Ranks, ranks[i])
	}
	for _, name := range slices.Sorted(maps.Keys(refused)) {
		out = append(out, EngineInfo{Name: name, Kind: string(kind), Refused: refused[name], Ranks: []RankInfo{}})
	}
	return out
}

// Route renders a decision for /debug/route and the sampled access log: pick is the chosen
// replica, took the decision's time, lora and degraded what the request's preparation found.
func Route(policy string, d *route.Decision, ex []score.Explanation, pick string, took time.Duration, lora string, degraded bool) RouteAnswer {
	ans := RouteAnswer{Policy: policy, Tokens: d.Req.Tokens, Blocks: len(d.Req.Keys), BlockSize: d.Req.BlockSize,
		LoRA: lora, Degraded: degraded, Unkeyed: d.Unkeyed, Pick: pick, Chosen: pick,
		DecisionUS: float64(took.Nanoseconds()) / 1e3}
	bd := d.Breakdowns(ex)
	for i, c := range d.Cands {
		ans.Candidates = append(ans.Candidates, RouteCandidate{Replica: c.ID, Healthy: c.Healthy, Approximate: c.Approximate,
			ExactBlocks: c.ExactBlocks, TierBlocks: c.TierBlocks, PredictedBlocks: c.PredictedBlocks, CachedTokens: d.Cached[i],
			PrefillTokens: c.PrefillTokens, DecodeTokens: c.DecodeTokens, Running: c.Running, WarmupCredit: c.WarmupCredit,
			Breakdown: bd[i]})
	}
	return ans
}
