package assess

import (
	"errors"
	"fmt"
	"math"
)

// Verdict is the answer to "should this fleet route by KV cache?".
type Verdict string

const (
	// One replica: its own prefix cache already does all there is to do.
	VerdictSingleReplica Verdict = "single-replica"
	// Every replica already hits most of its prompt tokens with prompt-blind placement.
	VerdictAlreadyHigh Verdict = "already-high"
	// Even the favourable reading of the counters leaves routing little to save.
	VerdictNotWorthIt Verdict = "not-worth-it"
	// The counters leave room for routing to save a worthwhile share of prefill.
	VerdictWorthRouting Verdict = "worth-routing"
)

// Thresholds are the judgement calls, each a flag of kvroutectl assess.
type Thresholds struct {
	// HighHitRate: when every replica hits at least this share of its prompt tokens under blind
	// placement, the reused prefixes must recur on every replica (see the model: at 0.5 over 4
	// replicas each reused prefix is looked up >= 7 times and already sits on >= 86% of them),
	// i.e. they are the hot, broad kind blind placement already serves: on kvroute's own replays
	// (`kvbench replay`, docs/benchmarks.md), where round-robin's cached share is already high,
	// kv-aware routing adds little to it.
	HighHitRate float64 `json:"high_hit_rate"`
	// MinGain: below this ceiling gain (share of prompt tokens routing could newly hit, in the
	// favourable reading), the prefill routing could save is smaller than what its balancing
	// concessions and hot spots tend to cost in latency; 0.10 is one tenth of prompt tokens.
	MinGain float64 `json:"min_gain"`
	// PreemptionWarn: preemptions per finished request. Each preemption drops the victim's KV and
	// recomputes it; at one per hundred requests the engines are at the memory edge, where the
	// load concentration prefix routing brings turns into more of them.
	PreemptionWarn float64 `json:"preemption_warn"`
	// KVPressureWarn: the highest KV usage seen in the window. vLLM preempts when it cannot
	// allocate a block; above 0.9 a burst on a replica holding hot prefixes gets there.
	KVPressureWarn float64 `json:"kv_pressure_warn"`
	// ImbalanceWarn: max/mean of per-replica load. Above 1.5 placement is already uneven before
	// any cache affinity adds to it.
	ImbalanceWarn float64 `json:"imbalance_warn"`
	// MinSampleTokens: fewer prompt tokens than this in the window make the rates noisy.
	MinSampleTokens float64 `json:"min_sample_tokens"`
}

// DefaultThresholds are kvroutectl's defaults (the rationale is on each field).
func DefaultThresholds() Thresholds {
	return Thresholds{HighHitRate: 0.5, MinGain: 0.10, PreemptionWarn: 0.01, KVPressureWarn: 0.9,
		ImbalanceWarn: 1.5, MinSampleTokens: 20000}
}

// Validate rejects thresholds outside their meaning.
func (t Thresholds) Validate() error {
	switch {
	case t.HighHitRate <= 0 || t.HighHitRate > 1:
		return fmt.Errorf("high hit rate must be in (0, 1], got %v", t.HighHitRate)
	case t.MinGain < 0 || t.MinGain > 1:
		return fmt.Errorf("min gain must be in [0, 1], got %v", t.MinGain)
	case t.PreemptionWarn < 0 || t.KVPressureWarn < 0 || t.KVPressureWarn > 1 || t.ImbalanceWarn < 1:
		return fmt.Errorf("preemption warn must be >= 0, kv pressure warn in [0, 1], imbalance warn >= 1")
	case t.MinSampleTokens < 0:
		return fmt.Errorf("min sample tokens must be >= 0")
	}
	return nil
}

// CounterSemantics says what vLLM's exported counters include, for the output. From
// vllm/v1/metrics/stats.py (PrefixCacheStats.record files a request whose num_preemptions > 0
// under preempted_requests/queries/hits) and vllm/v1/metrics/loggers.py (PrometheusStatLogger
// .record adds only queries and hits to the exported counters; num_preemptions counts PREEMPTED
// events); the split is vLLM PR #25787 (September 2025).
var CounterSemantics = []string{
	"Hit rate is vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, in tokens.",
	"vLLM counts a request's lookup once, when it is first scheduled. After a preemption, the resumed " +
		"request's second lookup and its re-computed prefill go to internal preempted_* stats that /metrics " +
		"does not export. So preemptions do not inflate this hit rate, and the prefill they cost does not show " +
		"in it. vllm:num_preemptions_total is the only place they appear. vLLM before PR #25787 " +
		"(September 2025) counted that second lookup as a hit.",
	"vllm:num_preemptions_total counts preemption events: a request preempted twice counts twice.",
	"KV usage (vllm:kv_cache_usage_perc, formerly vllm:gpu_cache_usage_perc) is the share of blocks " +
		"held by running requests. Cached blocks that no request holds count as free, so a full prefix " +
		"cache can still read low.",
}

// ReplicaStats is one replica's derived numbers.
type ReplicaStats struct {
	ID                    string   `json:"id"`
	Pod                   string   `json:"pod"`
	Engine                string   `json:"engine"`
	HitRate               *float64 `json:"hit_rate"` // nil when it looked nothing up
	QueryTokensPerS       float64  `json:"query_tokens_per_s"`
	RequestsPerS          *float64 `json:"requests_per_s"`
	Preemptions           *float64 `json:"preemptions"`
	PreemptionsPerRequest *float64 `json:"preemptions_per_request"`
	KVUsageMean           *float64 `json:"kv_usage_mean"`
	KVUsageMax            *float64 `json:"kv_usage_max"`
	InFlightMean          *float64 `json:"in_flight_mean"` // running + waiting
}

// FleetStats aggregates the replicas.
type FleetStats struct {
	Replicas              int      `json:"replicas"`
	HitRate               float64  `json:"hit_rate"` // token-weighted: all hits / all queries
	HitRateMin            *float64 `json:"hit_rate_min"`
	HitRateMax            *float64 `json:"hit_rate_max"`
	QueryTokensPerS       float64  `json:"query_tokens_per_s"`
	MissTokensPerS        float64  `json:"miss_tokens_per_s"` // the prefill computed today
	RequestsPerS          *float64 `json:"requests_per_s"`
	Preemptions           *float64 `json:"preemptions"`
	PreemptionsPerRequest *float64 `json:"preemptions_per_request"`
	KVUsageMean           *float64 `json:"kv_usage_mean"`
	KVUsageMax            *float64 `json:"kv_usage_max"`
	InFlightMean          *float64 `json:"in_flight_mean"` // sum over replicas
	// LoadBasis is what the spread is measured on: "requests/s", or "prompt tokens/s" when the
	// engines do not export request counts.
	LoadBasis       string  `json:"load_basis"`
	LoadCV          float64 `json:"load_cv"`            // coefficient of variation across replicas
	LoadMaxOverMean float64 `json:"load_max_over_mean"` // 1 = perfectly even
}

// Estimate is the prefill routing could save, with its model.
type Estimate struct {
	BlindHitRate float64 `json:"blind_hit_rate"`
	Ceiling
	// GainMax is the ceiling's extra hit share (of prompt tokens).
	GainMax float64 `json:"gain_max"`
	// PrefillSavedMax is GainMax as a share of the prefill computed today (the misses).
	PrefillSavedMax float64 `json:"prefill_saved_max"`
	// PrefillTokensPerSSavedMax is GainMax in prompt tokens per second across the fleet.
	PrefillTokensPerSSavedMax float64  `json:"prefill_tokens_per_s_saved_max"`
	Assumptions               []string `json:"assumptions"`
}

// Assessment is the whole answer.
type Assessment struct {
	Source        string         `json:"source"`
	Model         string         `json:"model"`
	WindowSeconds float64        `json:"window_seconds"`
	Verdict       Verdict        `json:"verdict"`
	Headline      string         `json:"headline"`
	Reasons       []string       `json:"reasons"`
	Warnings      []string       `json:"warnings"`
	Estimate      Estimate       `json:"estimate"`
	Fleet         FleetStats     `json:"fleet"`
	Replicas      []ReplicaStats `json:"replicas"`
	Counters      []string       `json:"counters"` // what vLLM's counters include
	Notes         []string       `json:"notes"`    // how the numbers were collected
	Thresholds    Thresholds     `json:"thresholds"`
}

// ErrNoTraffic is returned when no replica looked up any prompt token in the window.
var ErrNoTraffic = errors.New("no prompt tokens were looked up in the prefix cache on any replica in the window")

// Decide turns a snapshot into a verdict. It is pure: same snapshot, same answer.
func Decide(s Snapshot, th Thresholds) (Assessment, error) {
	if err := th.Validate(); err != nil {
		return Assessment{}, err
	}
	if len(s.Replicas) == 0 {
		return Assessment{}, errors.New("the snapshot has no replicas")
	}
	if !(s.WindowSeconds > 0) {
		return Assessment{}, fmt.Errorf("window must be positive, got %v s", s.WindowSeconds)
	}
	reps := append([]Replica(nil), s.Replicas...)
	sortReplicas(reps)
	a := Assessment{Source: s.Source, Model: s.Model, WindowSeconds: s.WindowSeconds,
		Counters: CounterSemantics, Notes: append([]string(nil), s.Notes...), Thresholds: th,
		Reasons: []string{}, Warnings: []string{}}
	a.Replicas, a.Fleet = stats(reps, s.WindowSeconds)
	f := &a.Fleet
	n := f.Replicas

	a.Estimate = estimate(f.HitRate, n, f.QueryTokensPerS)
	a.Warnings = warnings(reps, a.Replicas, f, th)

	if n == 1 {
		a.Verdict = VerdictSingleReplica
		a.Headline = "One replica: nothing to route."
		a.Reasons = append(a.Reasons, fmt.Sprintf("%s is the only replica of this model. Its own prefix cache "+
			"already serves every repeated prefix a router could send it; routing needs at least two replicas "+
			"to choose between.", reps[0].ID()))
		if f.QueryTokensPerS > 0 {
			a.Reasons = append(a.Reasons, fmt.Sprintf("For reference, it hits %s of its prompt tokens.", pct(f.HitRate)))
		}
		return a, nil
	}
	if f.QueryTokensPerS == 0 {
		return a, fmt.Errorf("%w (%d replicas, %s): send traffic during the window or widen it; if the engines "+
			"serve requests, check that prefix caching is on (vLLM turns it off with --no-enable-prefix-caching)",
			ErrNoTraffic, n, secs(s.WindowSeconds))
	}

	active := 0
	for _, r := range a.Replicas {
		if r.HitRate != nil {
			active++
		}
	}
	e := a.Estimate
	switch {
	case active == n && *f.HitRateMin >= th.HighHitRate:
		a.Verdict = VerdictAlreadyHigh
		a.Headline = fmt.Sprintf("Reuse is already high on every replica (lowest %s) with prompt-blind placement: "+
			"the fleet is already getting it.", pct(*f.HitRateMin))
		k := recurFloor(*f.HitRateMin, n)
		a.Reasons = append(a.Reasons,
			fmt.Sprintf("Every one of the %d replicas hits at least %s (fleet %s, threshold %s). A replica only hits "+
				"prefixes it has already seen. For placement that ignores the prompt to do this well, each reused "+
				"prefix must be looked up about %s times or more across the fleet, which already puts it on about "+
				"%s of the replicas.", n, pct(*f.HitRateMin), pct(f.HitRate), pct(th.HighHitRate),
				kStr(k), pct(Coverage(n, float64(k)))),
			fmt.Sprintf("What is left is %s of prompt tokens missing. Those misses are each hot prefix's first lookup "+
				"on each replica, plus the unique tails of prompts, which no router can hit. A router could only "+
				"remove the first kind.", pct(1-f.HitRate)),
			"If the gateway already pins sessions (for example LiteLLM's session_affinity), this is that effect: keep it. "+
				"It costs one line of configuration and no index.")
		if e.GainMax >= th.MinGain {
			a.Reasons = append(a.Reasons, fmt.Sprintf("Upper bound for completeness: if every prompt token belonged "+
				"to a prefix looked up about %s times, one shared cache would reach %s. Real prompts end in unique "+
				"tails, so expect less.", recurRange(e.Ceiling), pct(e.HitRate)))
		}
	case e.GainMax < th.MinGain:
		a.Verdict = VerdictNotWorthIt
		a.Headline = fmt.Sprintf("Low, scattered reuse: routing by KV cache is not worth it (fleet hit rate %s).", pct(f.HitRate))
		a.Reasons = append(a.Reasons,
			fmt.Sprintf("Prompt-blind placement over %d replicas hits %s of prompt tokens.", n, pct(f.HitRate)),
			fmt.Sprintf("Even the most favourable reading adds at most %s of prompt tokens (threshold %s): one shared "+
				"cache at %s. In that reading, %s of prompt tokens sit in prefixes looked up about %s times each and "+
				"scattered by blind placement. There is not enough reuse to gather.",
				pts(e.GainMax), pts(th.MinGain), pct(e.HitRate), pct(e.ReusedShare), recurRange(e.Ceiling)),
			"A KV-aware router here would mostly balance load and pay for an index that rarely matches. Keep "+
				"least-loaded or round-robin. Before concluding that the traffic has no reuse, check that no per-request "+
				"value (a timestamp or session id) sits at the start of the system prompt.")
	default:
		a.Verdict = VerdictWorthRouting
		a.Headline = fmt.Sprintf("Worth routing: up to %s of today's prefill could be saved (fleet hit rate %s, "+
			"up to %s with one shared cache).", pct(e.PrefillSavedMax), pct(f.HitRate), pct(e.HitRate))
		a.Reasons = append(a.Reasons,
			fmt.Sprintf("Prompt-blind placement over %d replicas hits %s of prompt tokens (per replica %s to %s).",
				n, pct(f.HitRate), pct(*f.HitRateMin), pct(*f.HitRateMax)),
			fmt.Sprintf("That rate is what blind placement leaves when prefixes are shared by a few requests each. A "+
				"prefix looked up k times reaches about N(1-(1-1/N)^k) replicas and misses once on each of them, "+
				"whereas routing would miss it once in total. In the most favourable reading (%s of prompt tokens in "+
				"prefixes looked up about %s times each), one shared cache hits %s: %s of prompt tokens, "+
				"about %s prompt tokens/s less prefill.",
				pct(e.ReusedShare), recurRange(e.Ceiling), pct(e.HitRate), pts(e.GainMax), num(e.PrefillTokensPerSSavedMax)),
			"The counters cannot tell that reading from a few very hot prefixes, for which the gain would be near "+
				"zero. The saving is therefore an upper bound under the stated assumptions, not a prediction. "+
				"A trial with mirrored traffic settles it.",
			"If the reuse is within conversations (a turn reuses the previous turn), session affinity in the gateway "+
				"gets the same for one line of configuration. A KV-aware router also gathers prefixes that "+
				"different users share: system prompts, RAG documents, agent scaffolds.")
	}
	return a, nil
}

// stats derives per-replica and fleet numbers.
func stats(reps []Replica, window float64) ([]ReplicaStats, FleetStats) {
	out := make([]ReplicaStats, len(reps))
	f := FleetStats{Replicas: len(reps)}
	var q, h, req, pre, kvSum, kvW float64
	allReq, anyPre, anyKV := true, false, false
	for i, r := range reps {
		rs := ReplicaStats{ID: r.ID(), Pod: r.Pod, Engine: r.Engine, QueryTokensPerS: r.QueryTokens / window,
			Preemptions: r.Preemptions, KVUsageMean: r.KVUsageMean, KVUsageMax: r.KVUsageMax}
		if r.QueryTokens > 0 {
			rs.HitRate = ptr(math.Min(1, r.HitTokens/r.QueryTokens))
			f.HitRateMin = minPtr(f.HitRateMin, *rs.HitRate)
			f.HitRateMax = maxPtr(f.HitRateMax, *rs.HitRate)
		}
		if r.Requests != nil {
			rs.RequestsPerS = ptr(*r.Requests / window)
			req += *r.Requests
			if r.Preemptions != nil && *r.Requests > 0 {
				rs.PreemptionsPerRequest = ptr(*r.Preemptions / *r.Requests)
			}
		} else {
			allReq = false
		}
		if r.Preemptions != nil {
			anyPre = true
			pre += *r.Preemptions
		}
		if r.KVUsageMean != nil {
			anyKV = true
			kvSum += *r.KVUsageMean
			kvW++
		}
		if r.KVUsageMax != nil {
			f.KVUsageMax = maxPtr(f.KVUsageMax, *r.KVUsageMax)
		}
		if r.RunningMean != nil || r.WaitingMean != nil {
			rs.InFlightMean = ptr(deref(r.RunningMean) + deref(r.WaitingMean))
			f.InFlightMean = ptr(deref(f.InFlightMean) + *rs.InFlightMean)
		}
		q += r.QueryTokens
		h += r.HitTokens
		out[i] = rs
	}
	if q > 0 {
		f.HitRate = math.Min(1, h/q)
	}
	f.QueryTokensPerS = q / window
	f.MissTokensPerS = (q - math.Min(h, q)) / window
	if anyPre {
		f.Preemptions = ptr(pre)
	}
	if allReq {
		f.RequestsPerS = ptr(req / window)
		if anyPre && req > 0 {
			f.PreemptionsPerRequest = ptr(pre / req)
		}
	}
	if anyKV {
		f.KVUsageMean = ptr(kvSum / kvW)
	}
	load := make([]float64, len(out))
	f.LoadBasis = "prompt tokens/s"
	for i, r := range out {
		load[i] = r.QueryTokensPerS
	}
	if allReq && req > 0 {
		f.LoadBasis = "requests/s"
		for i, r := range out {
			load[i] = *r.RequestsPerS
		}
	}
	f.LoadCV, f.LoadMaxOverMean = spread(load)
	return out, f
}

// spread is the coefficient of variation (population) and max/mean; zeros when all are zero.
func spread(xs []float64) (cv, maxOverMean float64) {
	var sum, mx float64
	for _, x := range xs {
		sum += x
		mx = math.Max(mx, x)
	}
	if len(xs) == 0 || sum == 0 {
		return 0, 0
	}
	mean := sum / float64(len(xs))
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return math.Sqrt(ss/float64(len(xs))) / mean, mx / mean
}

func estimate(h float64, n int, queryPerS float64) Estimate {
	c := SharedCacheCeiling(h, n)
	e := Estimate{BlindHitRate: h, Ceiling: c, GainMax: math.Max(0, c.HitRate-h)}
	if h < 1 {
		e.PrefillSavedMax = e.GainMax / (1 - h)
	}
	e.PrefillTokensPerSSavedMax = e.GainMax * queryPerS
	e.Assumptions = []string{
		"Today's placement ignores the prompt (random, round-robin or least-loaded): a request is equally likely to land on any replica.",
		"One shared cache is the reference, which is what perfect prefix routing approaches. A real router gives some of it up to balance load.",
		"Caches keep what they stored while the prefix is reused. When they evict, routing also pools their capacity, and the gain can exceed the ceiling.",
		"The ceiling is the most favourable spread of reuse that explains the observed hit rate. The least favourable spread (a few prefixes hot on every replica) gains nothing.",
	}
	return e
}

func warnings(reps []Replica, rs []ReplicaStats, f *FleetStats, th Thresholds) []string {
	var w []string
	for i, r := range reps {
		if r.QueryTokens == 0 && r.Requests != nil && *r.Requests > 0 {
			w = append(w, fmt.Sprintf("%s finished %s requests but looked up no prompt tokens in the prefix cache: "+
				"prefix caching is probably off there (--no-enable-prefix-caching).", rs[i].ID, num(*r.Requests)))
		} else if r.QueryTokens == 0 {
			w = append(w, fmt.Sprintf("%s got no traffic in the window; its hit rate is left out.", rs[i].ID))
		}
	}
	switch {
	case f.PreemptionsPerRequest != nil && *f.PreemptionsPerRequest >= th.PreemptionWarn && *f.Preemptions > 0:
		w = append(w, fmt.Sprintf("Preemptions are high: %s per finished request (%s in the window, threshold %s). "+
			"The engines are short of KV memory. Cache-aware routing concentrates load on the replicas that hold hot "+
			"prefixes, which raises preemptions there. After any change, watch vllm:num_preemptions_total beside "+
			"the hit rate. The prefill that preemptions re-compute is not in the hit-rate counters.",
			ratio(*f.PreemptionsPerRequest), num(*f.Preemptions), ratio(th.PreemptionWarn)))
	case f.PreemptionsPerRequest == nil && f.Preemptions != nil && *f.Preemptions > 0:
		w = append(w, fmt.Sprintf("%s preemptions in the window. Request counts are not exported "+
			"(vllm:request_success_total), so there is no per-request rate. Cache-aware routing concentrates load: "+
			"watch vllm:num_preemptions_total beside the hit rate.", num(*f.Preemptions)))
	}
	if f.KVUsageMax != nil && *f.KVUsageMax >= th.KVPressureWarn {
		w = append(w, fmt.Sprintf("KV pressure: usage reached %s (mean %s, threshold %s). Little headroom is left "+
			"for the load that prefix affinity concentrates. Under this pressure, some vLLM versions also count a "+
			"waiting request's lookup again on each scheduling retry (vLLM issue #43736), which skews the hit rate.",
			pct(*f.KVUsageMax), pct(deref(f.KVUsageMean)), pct(th.KVPressureWarn)))
	}
	if f.LoadMaxOverMean >= th.ImbalanceWarn {
		w = append(w, fmt.Sprintf("Load is already uneven: the busiest replica carries %.2fx the mean %s (CV %.2f, "+
			"threshold %.2fx). Cache affinity adds to that skew.", f.LoadMaxOverMean, f.LoadBasis, f.LoadCV, th.ImbalanceWarn))
	}
	if total := f.QueryTokensPerS; total > 0 && f.Replicas > 1 {
		var q float64
		for _, r := range reps {
			q += r.QueryTokens
		}
		if q < th.MinSampleTokens {
			w = append(w, fmt.Sprintf("Only %s prompt tokens were looked up in the window (fewer than %s), so the "+
				"rates are noisy. Widen --window.", num(q), num(th.MinSampleTokens)))
		}
	}
	return w
}

// recurFloor is the smallest k whose blind hit share reaches h: with every replica at h or more,
// reused prefixes recur at least this often (when every token is reused; fewer reused tokens
// need even more recurrences).
func recurFloor(h float64, n int) int {
	for _, k := range modelKs {
		if k == kInfinity || blindHitShare(float64(n), float64(k)) >= h {
			return k
		}
	}
	return kInfinity
}

func recurRange(c Ceiling) string {
	if c.RecurLow == c.RecurHigh {
		return kStr(c.RecurLow)
	}
	return kStr(c.RecurLow) + "-" + kStr(c.RecurHigh)
}

func kStr(k int) string {
	if k >= kInfinity {
		return "very many"
	}
	return fmt.Sprint(k)
}

func minPtr(p *float64, v float64) *float64 {
	if p == nil || v < *p {
		return ptr(v)
	}
	return p
}

func maxPtr(p *float64, v float64) *float64 {
	if p == nil || v > *p {
		return ptr(v)
	}
	return p
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}
