// Package shadow re-decides every routed request with another policy (kv, typically, while
// production runs round-robin) on the signals the real decision saw, without acting on it, and
// exports how much cache the shadow's pick had against the production pick's.
//
// Bias, to read its figures right: the caches it scores were filled by the production policy.
// A replica holds a prefix only where production sent it, so the shadow finds reuse only where
// production happened to place it; routing for real, kv would have shaped the caches itself
// (gathering each prefix on fewer replicas, which usually raises its hits). It cannot show kv's
// costs either: its picks add no load and evict nothing. Read its figure as what kv would hit
// on today's caches, usually below what kv would reach, not as a forecast; the trial (kvbench
// on a captured trace) is the forecast.
package shadow

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/router/score"
)

// Shadow runs one policy beside production. Observe is safe for concurrent use.
type Shadow struct {
	mu  sync.Mutex
	pol score.Policy

	decisions *prometheus.CounterVec // agree
	cached    *prometheus.CounterVec // pick
	prompt    prometheus.Counter
}

// New wraps pol (built like the router's own policy) as a shadow.
func New(pol score.Policy) *Shadow {
	s := &Shadow{pol: pol}
	s.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "shadow_decisions_total",
		Help: "Requests the shadow policy re-decided, by whether it picked the replica production picked."}, []string{"policy", "agree"})
	s.cached = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "shadow_cached_tokens_total",
		Help: "Prompt tokens the router's index had cached on the shadow policy's pick and on production's pick (pick label)."}, []string{"policy", "pick"})
	s.prompt = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "shadow_prompt_tokens_total",
		Help: "Prompt tokens of the requests the shadow policy re-decided."})
	for _, a := range []string{"true", "false"} {
		s.decisions.WithLabelValues(pol.Name(), a)
	}
	for _, p := range []string{"shadow", "production"} {
		s.cached.WithLabelValues(pol.Name(), p)
	}
	return s
}

// Collectors are the shadow's metrics.
func (s *Shadow) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.decisions, s.cached, s.prompt}
}

// Observe re-decides one request on the candidates production's decision saw. Unkeyed
// requests (no block keys) are skipped: no policy can see cache for them.
func (s *Shadow) Observe(req *score.Request, cands []score.Candidate, chosen int) {
	if req == nil || len(req.Keys) == 0 || chosen < 0 || chosen >= len(cands) {
		return
	}
	s.mu.Lock()
	pick, err := s.pol.Pick(req, cands)
	if err == nil {
		s.pol.OnRouted(req, cands, pick)
	}
	s.mu.Unlock()
	if err != nil || pick < 0 || pick >= len(cands) {
		return
	}
	name := s.pol.Name()
	s.decisions.WithLabelValues(name, strconv.FormatBool(pick == chosen)).Inc()
	s.cached.WithLabelValues(name, "shadow").Add(float64(CachedTokens(req, &cands[pick])))
	s.cached.WithLabelValues(name, "production").Add(float64(CachedTokens(req, &cands[chosen])))
	s.prompt.Add(float64(req.Tokens))
}

// CachedTokens is what the router expects a candidate to have cached of the request: its
// longer overlap (exact index or recent decisions) in whole blocks, at most the prompt less
// its last token (which the engine always computes).
func CachedTokens(req *score.Request, c *score.Candidate) int {
	n := max(c.ExactBlocks, c.PredictedBlocks) * req.BlockSize
	return max(min(n, req.Tokens-1), 0)
}
