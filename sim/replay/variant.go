package replay

import (
	"bufio"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// NoEventsSuffix marks a policy run with its routers' KV event subscriptions off (kvrouter
// --no-events): "kv:no-events" is the kv policy scoring every replica from the approximate
// index, the router's own routings aged by an LRU bounded by the engine's num_gpu_blocks
// (router/index/side.go), instead of the engines' events. Both variants can run in one replay,
// interleaved per seed like any two policies, and the label says which ran.
const NoEventsSuffix = ":no-events"

// PDSuffix marks a policy run on a disaggregated fleet of the same size (Options.Prefill of
// Options.Replicas engines in the prefill pool, the rest the decode pool, every engine with
// vLLM's NIXL connector, kv_both): "kv:pd" with the router's default split threshold,
// "kv:pd=-1" splitting every request, "kv:pd=500" with kvrouter --disagg-min-uncached-tokens
// 500. It comes last: "kv:no-events:pd".
const PDSuffix = ":pd"

// SplitPD splits a replay policy label into the rest of the label, whether it runs
// disaggregated, and the split threshold it gives the routers ("" for their default).
func SplitPD(label string) (rest string, pd bool, minUncached string) {
	if i := strings.LastIndex(label, PDSuffix); i >= 0 {
		tail := label[i+len(PDSuffix):]
		if tail == "" {
			return label[:i], true, ""
		}
		if v, ok := strings.CutPrefix(tail, "="); ok && v != "" && !strings.ContainsAny(v, ":") {
			return label[:i], true, v
		}
	}
	return label, false, ""
}

// SplitPolicy splits a replay policy label into the router policy and whether the routers
// subscribe to KV events (a PDSuffix left aside).
func SplitPolicy(label string) (policy string, events bool) {
	label, _, _ = SplitPD(label)
	if p, ok := strings.CutSuffix(label, NoEventsSuffix); ok {
		return p, false
	}
	return label, true
}

// runDirName is a run's log directory: the label without the ':' some filesystems refuse.
func runDirName(label string, seed int) string {
	return fmt.Sprintf("%s-seed%d", strings.ReplaceAll(label, ":", "_"), seed)
}

// ModeTokens are the router's accuracy counters for one scoring mode, summed over engines
// (and over routers, when several): prompt tokens of answers with usage, the cached tokens the
// router predicted on the chosen replica and those the engine reported
// (kvroute_router_mode_*_tokens_total, docs/operations.md).
type ModeTokens struct {
	Prompt    float64 `json:"prompt_tokens"`
	Predicted float64 `json:"predicted_cached_tokens"`
	Actual    float64 `json:"actual_cached_tokens"`
}

// modeSeries are the counters ModeTokens reads, by metric name prefix.
var modeSeries = map[string]func(*ModeTokens) *float64{
	"kvroute_router_mode_prompt_tokens_total{":           func(m *ModeTokens) *float64 { return &m.Prompt },
	"kvroute_router_mode_predicted_cached_tokens_total{": func(m *ModeTokens) *float64 { return &m.Predicted },
	"kvroute_router_mode_actual_cached_tokens_total{":    func(m *ModeTokens) *float64 { return &m.Actual },
}

// accuracy reads the router's per-mode accuracy counters from its /metrics, summed over
// engines, keyed by the mode label.
func (r *routerProc) accuracy() (map[string]ModeTokens, error) {
	return readAccuracy("http://"+r.admin, "kvrouter "+r.id)
}

// readAccuracy reads the accuracy counters from a kvrouter's admin listener (base: http://host:port).
func readAccuracy(base, who string) (map[string]ModeTokens, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(strings.TrimRight(base, "/") + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s /metrics: status %d", who, resp.StatusCode)
	}
	return parseModeTokens(bufio.NewScanner(resp.Body))
}

func parseModeTokens(sc *bufio.Scanner) (map[string]ModeTokens, error) {
	out := map[string]ModeTokens{}
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		for prefix, field := range modeSeries {
			if !strings.HasPrefix(f[0], prefix) {
				continue
			}
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return nil, fmt.Errorf("metric %s: %w", f[0], err)
			}
			mode := labelValue(f[0], "mode")
			m := out[mode]
			*field(&m) += v
			out[mode] = m
		}
	}
	return out, sc.Err()
}

// labelValue is the value of label k in a Prometheus series name (`name{a="x",k="y"}`), ""
// when absent. The series read here carry no commas or quotes inside their values.
func labelValue(series, k string) string {
	_, labels, ok := strings.Cut(series, "{")
	if !ok {
		return ""
	}
	for _, kv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
		if name, v, ok := strings.Cut(kv, "="); ok && name == k {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// addModes adds b's counters into a (a may be nil).
func addModes(a, b map[string]ModeTokens) map[string]ModeTokens {
	if a == nil {
		a = map[string]ModeTokens{}
	}
	for k, v := range b {
		m := a[k]
		m.Prompt += v.Prompt
		m.Predicted += v.Predicted
		m.Actual += v.Actual
		a[k] = m
	}
	return a
}

// ModeNames are the modes of m in a stable order.
func ModeNames(m map[string]ModeTokens) []string {
	var ns []string
	for n := range m {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

// EventsRatio is, for one policy run both with and without KV events in the same replay, the
// per-seed ratio with events / without of the cached-token ratio and of TTFT p50 and p90, with
// their 95% t-intervals over the seeds (a seed missing either run is left out).
type EventsRatio struct {
	Policy  string    `json:"policy"` // the label with events (its pair is Policy+NoEventsSuffix)
	Seeds   []int     `json:"seeds"`
	Cached  []float64 `json:"cached"`
	TTFTP50 []float64 `json:"ttft_p50"`
	TTFTP90 []float64 `json:"ttft_p90"`

	CachedCI  Interval `json:"cached_ci"`
	TTFTP50CI Interval `json:"ttft_p50_ci"`
	TTFTP90CI Interval `json:"ttft_p90_ci"`
}

// EventsRatios pairs every label L with L+NoEventsSuffix among the runs, seed by seed.
func EventsRatios(runs []*RunResult) []EventsRatio {
	type key struct {
		label string
		seed  int
	}
	by := map[key]*RunResult{}
	var labels []string
	for _, r := range runs {
		if !strings.HasSuffix(r.Policy, NoEventsSuffix) && !slices.Contains(labels, r.Policy) {
			labels = append(labels, r.Policy)
		}
		by[key{r.Policy, r.Seed}] = r
	}
	var out []EventsRatio
	for _, l := range labels {
		e := EventsRatio{Policy: l}
		for _, r := range runs {
			if r.Policy != l {
				continue
			}
			off := by[key{l + NoEventsSuffix, r.Seed}]
			if off == nil {
				continue
			}
			a, b := summarize([]*RunResult{r}), summarize([]*RunResult{off})
			e.Seeds = append(e.Seeds, r.Seed)
			e.Cached = append(e.Cached, a.CachedRatio.Mean/b.CachedRatio.Mean)
			e.TTFTP50 = append(e.TTFTP50, a.TTFTP50.Mean/b.TTFTP50.Mean)
			e.TTFTP90 = append(e.TTFTP90, a.TTFTP90.Mean/b.TTFTP90.Mean)
		}
		if len(e.Seeds) == 0 {
			continue
		}
		e.CachedCI, e.TTFTP50CI, e.TTFTP90CI = TInterval(e.Cached), TInterval(e.TTFTP50), TInterval(e.TTFTP90)
		out = append(out, e)
	}
	return out
}

// Per-engine accuracy series (kvroute_router_*_tokens_total{engine}) and the split counter.
var poolSeries = map[string]func(*ModeTokens) *float64{
	"kvroute_router_prompt_tokens_total{":           func(m *ModeTokens) *float64 { return &m.Prompt },
	"kvroute_router_predicted_cached_tokens_total{": func(m *ModeTokens) *float64 { return &m.Predicted },
	"kvroute_router_actual_cached_tokens_total{":    func(m *ModeTokens) *float64 { return &m.Actual },
}

const disaggSeries = "kvroute_router_disagg_requests_total{"

// poolOf is the pool of an engine the replay named (run.go): "prefill-N", "decode-N", else
// aggregated.
func poolOf(engine string) string {
	for _, p := range []string{"prefill", "decode"} {
		if strings.HasPrefix(engine, p+"-") {
			return p
		}
	}
	return "aggregated"
}

// poolFigures reads the router's per-engine accuracy counters summed by pool, and its split
// counter by "path/reason".
func (r *routerProc) poolFigures() (map[string]ModeTokens, map[string]float64, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + r.admin + "/metrics")
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("kvrouter %s /metrics: status %d", r.id, resp.StatusCode)
	}
	return parsePoolFigures(bufio.NewScanner(resp.Body))
}

func parsePoolFigures(sc *bufio.Scanner) (map[string]ModeTokens, map[string]float64, error) {
	pools, disagg := map[string]ModeTokens{}, map[string]float64{}
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		if strings.HasPrefix(f[0], disaggSeries) {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return nil, nil, fmt.Errorf("metric %s: %w", f[0], err)
			}
			disagg[labelValue(f[0], "path")+"/"+labelValue(f[0], "reason")] += v
			continue
		}
		for prefix, field := range poolSeries {
			if !strings.HasPrefix(f[0], prefix) {
				continue
			}
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return nil, nil, fmt.Errorf("metric %s: %w", f[0], err)
			}
			pool := poolOf(labelValue(f[0], "engine"))
			m := pools[pool]
			*field(&m) += v
			pools[pool] = m
		}
	}
	return pools, disagg, sc.Err()
}

// addCounts adds b into a (a may be nil).
func addCounts(a, b map[string]float64) map[string]float64 {
	if a == nil {
		a = map[string]float64{}
	}
	for k, v := range b {
		a[k] += v
	}
	return a
}

// subModes is after less before, mode by mode: what a run added to counters that were not
// reset before it (an external router's, which outlives the runs).
func subModes(after, before map[string]ModeTokens) map[string]ModeTokens {
	out := map[string]ModeTokens{}
	for m, a := range after {
		b := before[m]
		out[m] = ModeTokens{Prompt: a.Prompt - b.Prompt, Predicted: a.Predicted - b.Predicted, Actual: a.Actual - b.Actual}
	}
	return out
}
