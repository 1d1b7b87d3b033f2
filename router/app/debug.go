package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/router/debugview"
	"github.com/kvroute/kvroute/router/metrics"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/router/tokens"
)

// The admin answers' shapes (router/debugview renders them from what the router reads here).
type (
	EngineInfo     = debugview.EngineInfo
	RankInfo       = debugview.RankInfo
	Inflight       = debugview.Inflight
	Accuracy       = debugview.Accuracy
	RouteCandidate = debugview.RouteCandidate
	RouteAnswer    = debugview.RouteAnswer
)

// Engines returns what /debug/engines shows.
func (s *Router) Engines() []EngineInfo {
	reps := s.reps()
	now := s.now()
	ranks := make([]RankInfo, len(reps))
	for i, r := range reps {
		ranks[i] = s.rankInfo(r)
	}
	return debugview.Engines(reps, ranks, now, s.fleet.Kind(), s.fleet.Refused(),
		func(until time.Time) float64 { return s.warmupCredit(until, now) })
}

// rankInfo reads the replica's stream, index and peers' load for debugview.Rank.
func (s *Router) rankInfo(r *replica) RankInfo {
	v := debugview.RankView{Replica: r, Exact: s.exactStream(r)}
	if r.Stream && s.sub != nil {
		if st, ok := s.sub.Stats(r.Eng.Name, r.Rank); ok {
			v.Stream = &st
		}
	}
	if st, err := s.ix.Stats(r.ID); err == nil {
		v.Index = &st
	}
	if s.peer != nil {
		p := s.peer.Load(r.Name)
		v.Peer = &p
	}
	return debugview.Rank(v)
}

// DebugEngines serves GET /debug/engines.
func (s *Router) DebugEngines(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	reps := s.reps()
	bs, bsFrom := s.blockSize(reps)
	out := map[string]any{"backlog": s.backlog(reps), "hold": s.hold.Stats(), "policy": s.policy, "block_size": bs, "block_size_source": bsFrom, "engines": s.Engines(),
		"index_entries": s.ix.Keys(), "sessions": s.ix.SessionStats(), "tokenize_degraded": s.tokenizeDegraded.Load(), "tokenizer": s.tok.Stats(),
		// Bound mode: messages whose topic named no engine, so no engine's counters hold them.
		"events_unroutable": uint64(s.unroutableEvents())}
	if pre, dec := pools(reps); len(pre)+len(dec) > 0 {
		out["disaggregation"] = s.disaggInfo(pre, dec)
	}
	if s.peer != nil {
		out["router_peers"] = s.peer.Info()
	}
	for key, section := range s.debugSections {
		out[key] = section()
	}
	_ = enc.Encode(out)
}

// debugEnginesKeys are the keys DebugEngines itself writes (a test holds it to the answer).
var debugEnginesKeys = []string{"backlog", "hold", "policy", "block_size", "block_size_source", "engines", "index_entries", "sessions",
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
	return debugview.Route(s.policy, &d.Decision, ex, d.reps[d.chosen].Name, d.took, p.id.LoRAName, p.degraded)
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
