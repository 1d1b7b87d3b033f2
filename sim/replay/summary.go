package replay

import (
	"math"
	"sort"
)

// Summary is one policy over its seeds: each figure is computed per seed, then averaged with a
// 95% t-interval over the seeds (TInterval).
type Summary struct {
	Policy   string `json:"policy"`
	Seeds    int    `json:"seeds"`
	Requests int    `json:"requests"` // per seed, sent or not
	Errors   int    `json:"errors"`   // over all seeds
	// Held is how many requests, over all seeds, waited for a slot under Options.Concurrency
	// (Outcome.Held): non-zero means the replay ran closed-loop, arrivals paced by this
	// policy's own completions, so its traffic was not the workload's.
	Held        int      `json:"held"`
	TTFTP50     Interval `json:"ttft_p50_s"`
	TTFTP90     Interval `json:"ttft_p90_s"`
	TTFTP99     Interval `json:"ttft_p99_s"`
	E2EP50      Interval `json:"e2e_p50_s"`
	E2EP90      Interval `json:"e2e_p90_s"`
	Throughput  Interval `json:"throughput_rps"`      // successful requests / wall time of the run
	OutputTPS   Interval `json:"output_tokens_per_s"` // generated tokens / wall time
	CachedRatio Interval `json:"cached_ratio"`        // sum cached_tokens / sum prompt_tokens
	// MaxEngineShare is the busiest engine's successful requests over a fair share (requests /
	// engines): 1 is an even spread, the engine count is everything on one engine.
	MaxEngineShare Interval `json:"max_engine_share"`
	// MaxEngineWorkShare is the same over the work the engines did: the busiest engine's
	// uncached prompt tokens (prompt less cached, as the engines reported them) over a fair
	// share. Prompts of very different lengths can balance requests and not work, or the
	// other way round; the kv policy balances work.
	MaxEngineWorkShare Interval `json:"max_engine_work_share"`
	// Scale-up runs only.
	NewShareOfFair *Interval `json:"new_share_of_fair,omitempty"`
	HitDrop        *Interval `json:"hit_drop,omitempty"`
	// FirstErrors keeps a few distinct error messages, so a failing run says why.
	FirstErrors []string `json:"first_errors,omitempty"`
	// RouterEvents: the routers subscribed to KV events (SplitPolicy of the label).
	RouterEvents bool `json:"router_events"`
	// Accuracy is the routers' per-mode accuracy counters summed over the seeds whose routers
	// could be read (RunResult.Accuracy).
	Accuracy map[string]ModeTokens `json:"accuracy,omitempty"`
}

// Summarize groups runs by policy (in first-seen order) and summarises each.
func Summarize(runs []*RunResult) []Summary {
	var order []string
	by := map[string][]*RunResult{}
	for _, r := range runs {
		if _, ok := by[r.Policy]; !ok {
			order = append(order, r.Policy)
		}
		by[r.Policy] = append(by[r.Policy], r)
	}
	out := make([]Summary, 0, len(order))
	for _, p := range order {
		out = append(out, summarize(by[p]))
	}
	return out
}

func summarize(runs []*RunResult) Summary {
	_, events := SplitPolicy(runs[0].Policy)
	s := Summary{Policy: runs[0].Policy, Seeds: len(runs), Requests: len(runs[0].Outcomes), RouterEvents: events}
	var p50, p90, p99, e50, e90, thr, otps, cached, spread, workSpread, share, drop []float64
	seen := map[string]bool{}
	for _, r := range runs {
		var ttft, e2e []float64
		var c, p, gen, work int
		perEngine, perWork := map[string]int{}, map[string]int{}
		for _, o := range r.Outcomes {
			if o.Held > 0 {
				s.Held++
			}
			if o.Err != "" {
				s.Errors++
				if !seen[o.Err] && len(s.FirstErrors) < 3 {
					seen[o.Err] = true
					s.FirstErrors = append(s.FirstErrors, o.Err)
				}
				continue
			}
			ttft = append(ttft, o.TTFT)
			e2e = append(e2e, o.E2E)
			c += o.CachedTokens
			p += o.PromptTokens
			gen += o.OutputTokens
			perEngine[o.Engine]++
			perWork[o.Engine] += max(o.PromptTokens-o.CachedTokens, 0)
			work += max(o.PromptTokens-o.CachedTokens, 0)
		}
		sort.Float64s(ttft)
		sort.Float64s(e2e)
		p50 = append(p50, pct(ttft, 0.5))
		p90 = append(p90, pct(ttft, 0.9))
		p99 = append(p99, pct(ttft, 0.99))
		e50 = append(e50, pct(e2e, 0.5))
		e90 = append(e90, pct(e2e, 0.9))
		wall := math.NaN()
		if r.Wall > 0 {
			wall = r.Wall
		}
		thr = append(thr, float64(len(ttft))/wall)
		otps = append(otps, float64(gen)/wall)
		cached = append(cached, ratio(c, p))
		spread = append(spread, maxShare(perEngine, len(r.Engines), len(ttft)))
		workSpread = append(workSpread, maxShare(perWork, len(r.Engines), work))
		if r.Accuracy != nil {
			s.Accuracy = addModes(s.Accuracy, r.Accuracy)
		}
		if r.ScaleUp != nil {
			share = append(share, r.ScaleUp.NewShareOfFair)
			drop = append(drop, r.ScaleUp.HitDrop)
		}
	}
	s.TTFTP50, s.TTFTP90, s.TTFTP99 = TInterval(p50), TInterval(p90), TInterval(p99)
	s.E2EP50, s.E2EP90 = TInterval(e50), TInterval(e90)
	s.Throughput, s.OutputTPS, s.CachedRatio = TInterval(thr), TInterval(otps), TInterval(cached)
	s.MaxEngineShare, s.MaxEngineWorkShare = TInterval(spread), TInterval(workSpread)
	if len(share) > 0 {
		a, b := TInterval(share), TInterval(drop)
		s.NewShareOfFair, s.HitDrop = &a, &b
	}
	return s
}

// maxShare is the busiest engine's requests over requests/engines (NaN with no requests); with
// tokens per engine and their total, the same over tokens. NaN too when some request's engine
// is unknown (an external router that does not say which engine served, as kvrouter's
// x-kvroute-engine does): the spread is not known then.
func maxShare(perEngine map[string]int, engines, requests int) float64 {
	engines = max(engines, len(perEngine))
	if _, unknown := perEngine[""]; unknown || requests == 0 || engines == 0 {
		return math.NaN()
	}
	most := 0
	for _, n := range perEngine {
		most = max(most, n)
	}
	return float64(most) * float64(engines) / float64(requests)
}

func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return percentileSorted(sorted, p)
}
