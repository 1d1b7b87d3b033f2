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

// SplitPolicy splits a replay policy label into the router policy and whether the routers
// subscribe to KV events.
func SplitPolicy(label string) (policy string, events bool) {
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
