package assess

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"golang.org/x/sync/errgroup"
)

// EngineOptions say which engines to scrape and for how long.
type EngineOptions struct {
	// URLs are the engines' HTTP base URLs (http://host:8000); "/metrics" is appended unless the
	// path already ends with it.
	URLs   []string
	Window time.Duration // time between the two counter scrapes
	// SampleEvery is how often the gauges (KV usage, running, waiting) are sampled in between;
	// 0 = Window/20 within [250ms, 5s].
	SampleEvery time.Duration
	Model       string // keep this model_name; empty takes the only model present
	// APIKey is sent as Authorization: Bearer. vLLM does not protect /metrics (its --api-key
	// covers /v1 only), but a proxy in front of the engines may.
	APIKey  string
	Timeout time.Duration // per scrape; 0 = 10 s
	Client  *http.Client  // nil = a plain client
	// Wait, when set, runs between the first and the last scrape instead of sleeping Window
	// (tests drive traffic there). Rates use the measured time between the scrapes either way.
	Wait func(ctx context.Context) error
}

// seriesKey is one engine rank of one model inside a scrape.
type seriesKey struct{ engine, model string }

// scrape is one engine's /metrics at one instant: metric -> rank -> value (summed over the
// other labels, e.g. finished_reason).
type scrape struct {
	values map[string]map[seriesKey]float64
	vllm   bool // any vllm:* family at all
}

// wanted are the series read from a scrape; counters are also accepted without _total (the
// OpenMetrics family name), which some proxies and exporters pass through.
var wanted = []string{MetricQueries, MetricHits, MetricPreemptions, MetricRequests, MetricKVUsage,
	MetricKVUsageOld, MetricRunning, MetricWaiting}

// CollectEngines scrapes every engine at the start and the end of the window (counters: the
// difference) and samples the gauges in between (mean and max).
func CollectEngines(ctx context.Context, o EngineOptions) (Snapshot, error) {
	if len(o.URLs) == 0 {
		return Snapshot{}, errors.New("no engine URLs")
	}
	if o.Window <= 0 && o.Wait == nil {
		return Snapshot{}, fmt.Errorf("window must be positive, got %v", o.Window)
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.SampleEvery <= 0 {
		o.SampleEvery = min(max(o.Window/20, 250*time.Millisecond), 5*time.Second)
	}
	if o.Client == nil {
		o.Client = &http.Client{}
	}
	targets, pods, err := engineTargets(o.URLs)
	if err != nil {
		return Snapshot{}, err
	}
	w, err := o.sampleWindow(ctx, targets)
	if err != nil {
		return Snapshot{}, err
	}
	notes := w.notes

	snap := Snapshot{Source: "engines", WindowSeconds: w.elapsed}
	models := map[string]bool{}
	for _, s := range w.last {
		for k := range s.values[MetricQueries] {
			models[k.model] = true
		}
	}
	switch {
	case o.Model != "" && !models[o.Model]:
		return snap, fmt.Errorf("no engine serves model_name %q; they serve %s", o.Model, strings.Join(sortedKeys(models), ", "))
	case o.Model == "" && len(models) > 1:
		return snap, fmt.Errorf("the engines serve %d models (%s): a fleet is one model, pass --model",
			len(models), strings.Join(sortedKeys(models), ", "))
	}
	snap.Model = o.Model
	for m := range models {
		if o.Model == "" {
			snap.Model = m
		}
	}

	usageName := MetricKVUsage
	for i := range targets {
		reps, oldUsage, n := engineReplicas(w, i, pods[i], snap.Model)
		notes = append(notes, n...)
		if oldUsage {
			usageName = MetricKVUsageOld
		}
		snap.Replicas = append(snap.Replicas, reps...)
		if len(reps) == 0 {
			notes = append(notes, fmt.Sprintf("%s serves no %s series for model %s: left out.", pods[i], MetricQueries, snap.Model))
		}
	}
	sortReplicas(snap.Replicas)
	if usageName == MetricKVUsageOld {
		notes = append(notes, fmt.Sprintf("KV usage read from %s (the name before %s).", MetricKVUsageOld, MetricKVUsage))
	}
	snap.Notes = append([]string{fmt.Sprintf("Counters: two scrapes of each engine's /metrics %s apart; gauges: "+
		"%d samples.", secs(w.elapsed), len(w.samples))}, notes...)
	return snap, nil
}

// engineTargets turns the engine URLs into their /metrics URLs and pod names (host:port),
// refusing anything that is not an http(s) URL and any engine listed twice.
func engineTargets(urls []string) (targets, pods []string, err error) {
	targets = make([]string, len(urls))
	pods = make([]string, len(urls))
	seen := map[string]bool{}
	for i, raw := range urls {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, nil, fmt.Errorf("engine %q: want an http(s) URL of a vLLM server, e.g. http://10.0.0.5:8000", raw)
		}
		if !strings.HasSuffix(u.Path, "/metrics") {
			u.Path = strings.TrimSuffix(u.Path, "/") + "/metrics"
		}
		pods[i] = u.Host
		if seen[u.String()] {
			return nil, nil, fmt.Errorf("engine %s is listed twice", u)
		}
		seen[u.String()] = true
		targets[i] = u.String()
	}
	return targets, pods, nil
}

// window is what sampleWindow read: the opening and closing scrapes (the counters' two ends),
// every gauge sample in between them included, and the seconds between the two ends.
type window struct {
	first, last []scrape
	samples     [][]scrape
	elapsed     float64
	notes       []string
}

// sampleWindow scrapes every target at the start, every SampleEvery until the window ends
// (Window, or Wait returning), and at the end.
func (o EngineOptions) sampleWindow(ctx context.Context, targets []string) (window, error) {
	first, err := o.scrapeAll(ctx, targets)
	if err != nil {
		return window{}, err
	}
	start := time.Now()
	for i, s := range first {
		if err := requireCounters(targets[i], s); err != nil {
			return window{}, err
		}
	}
	w := window{first: first, samples: [][]scrape{first}}
	failed := 0

	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		if o.Wait != nil {
			done <- o.Wait(waitCtx)
			return
		}
		t := time.NewTimer(o.Window)
		defer t.Stop()
		select {
		case <-t.C:
			done <- nil
		case <-waitCtx.Done():
			done <- waitCtx.Err()
		}
	}()
	tick := time.NewTicker(o.SampleEvery)
	defer tick.Stop()
wait:
	for {
		select {
		case err := <-done:
			if err != nil {
				return window{}, fmt.Errorf("during the window: %w", err)
			}
			break wait
		case <-tick.C:
			// Gauge samples only; a failed one is skipped, the counters need just the two ends.
			if s, err := o.scrapeAll(ctx, targets); err == nil {
				w.samples = append(w.samples, s)
			} else {
				failed++
			}
		}
	}
	w.last, err = o.scrapeAll(ctx, targets)
	if err != nil {
		return window{}, fmt.Errorf("closing scrape: %w", err)
	}
	w.elapsed = time.Since(start).Seconds()
	w.samples = append(w.samples, w.last)
	if failed > 0 {
		w.notes = append(w.notes, fmt.Sprintf("%d intermediate gauge sample(s) failed and were skipped.", failed))
	}
	return w, nil
}

// engineReplicas reads target i's replicas of model from the window, with the notes on their
// counters; oldUsage: a replica's KV usage came from the gauge's name before MetricKVUsage.
func engineReplicas(w window, i int, pod, model string) (reps []Replica, oldUsage bool, notes []string) {
	first, last := w.first[i], w.last[i]
	for k := range last.values[MetricQueries] {
		if k.model != model {
			continue
		}
		r := Replica{Pod: pod, Engine: k.engine, Model: k.model}
		var n string
		r.QueryTokens, n = delta(first, last, MetricQueries, k)
		notes = appendNote(notes, n, r.ID())
		r.HitTokens, n = delta(first, last, MetricHits, k)
		notes = appendNote(notes, n, r.ID())
		if _, ok := last.values[MetricPreemptions][k]; ok {
			v, n := delta(first, last, MetricPreemptions, k)
			r.Preemptions = ptr(v)
			notes = appendNote(notes, n, r.ID())
		}
		if _, ok := last.values[MetricRequests][k]; ok {
			v, n := delta(first, last, MetricRequests, k)
			r.Requests = ptr(v)
			notes = appendNote(notes, n, r.ID())
		}
		name := MetricKVUsage
		if _, ok := last.values[name][k]; !ok {
			name = MetricKVUsageOld
		}
		r.KVUsageMean, r.KVUsageMax = gauge(w.samples, i, name, k)
		if r.KVUsageMean != nil && name == MetricKVUsageOld {
			oldUsage = true
		}
		r.RunningMean, _ = gauge(w.samples, i, MetricRunning, k)
		r.WaitingMean, _ = gauge(w.samples, i, MetricWaiting, k)
		reps = append(reps, r)
	}
	return reps, oldUsage, notes
}

func appendNote(notes []string, n, id string) []string {
	if n == "" {
		return notes
	}
	return append(notes, id+": "+n)
}

// delta is a counter's increase between two scrapes. A drop means the engine restarted (its
// counters start again at zero), so, like Prometheus's increase(), the later value is taken as
// the increase; a series absent at the start began during the window.
func delta(a, b scrape, metric string, k seriesKey) (float64, string) {
	end := b.values[metric][k]
	begin, ok := a.values[metric][k]
	switch {
	case !ok:
		return end, metric + " appeared during the window; counted from zero."
	case end < begin:
		return end, metric + " went down (engine restart?); counted from zero after the reset."
	}
	return end - begin, ""
}

// gauge is the mean and max of one engine's gauge over the samples that carry it.
func gauge(samples [][]scrape, i int, metric string, k seriesKey) (mean, mx *float64) {
	var sum, n float64
	hi := math.Inf(-1)
	for _, s := range samples {
		if v, ok := s[i].values[metric][k]; ok {
			sum += v
			n++
			hi = math.Max(hi, v)
		}
	}
	if n == 0 {
		return nil, nil
	}
	return ptr(sum / n), ptr(hi)
}

// requireCounters checks the first scrape has what the verdict needs, and says what to check when
// it does not.
func requireCounters(target string, s scrape) error {
	if !s.vllm {
		return fmt.Errorf("%s serves no vllm:* metrics: point --engines at a vLLM server's HTTP address (the "+
			"port of /v1/completions; vLLM serves /metrics there)", target)
	}
	for _, m := range []string{MetricQueries, MetricHits} {
		if len(s.values[m]) == 0 {
			return fmt.Errorf("%s has vllm:* metrics but no %s: the engine predates vLLM 0.10 (which exported "+
				"vllm:gpu_prefix_cache_queries_total instead) or is not vLLM", target, m)
		}
	}
	return nil
}

func (o EngineOptions) scrapeAll(ctx context.Context, targets []string) ([]scrape, error) {
	out := make([]scrape, len(targets))
	g, ctx := errgroup.WithContext(ctx)
	for i, t := range targets {
		g.Go(func() error {
			s, err := o.scrapeOne(ctx, t)
			out[i] = s
			return err
		})
	}
	return out, g.Wait()
}

func (o EngineOptions) scrapeOne(ctx context.Context, target string) (scrape, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return scrape{}, err
	}
	// The classic text format: vLLM's prometheus_client and Go's promhttp both honour it, and
	// expfmt decodes it (it does not decode OpenMetrics).
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	if o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.APIKey)
	}
	resp, err := o.Client.Do(req)
	if err != nil {
		return scrape{}, fmt.Errorf("cannot scrape %s: %w", target, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		hint := "pass --api-key-file or set VLLM_API_KEY"
		if o.APIKey != "" {
			hint = "the API key given was refused"
		}
		return scrape{}, fmt.Errorf("%s answered %s: %s (vLLM leaves /metrics open; a proxy in front of it does not)",
			target, resp.Status, hint)
	case resp.StatusCode != http.StatusOK:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return scrape{}, fmt.Errorf("%s answered %s (%q): is it a vLLM server's HTTP address?", target, resp.Status,
			strings.TrimSpace(string(body)))
	}
	s := scrape{values: map[string]map[seriesKey]float64{}}
	dec := expfmt.NewDecoder(resp.Body, expfmt.ResponseFormat(resp.Header))
	for {
		var mf dto.MetricFamily
		if err := dec.Decode(&mf); err == io.EOF {
			break
		} else if err != nil {
			return scrape{}, fmt.Errorf("%s: not Prometheus text format: %w", target, err)
		}
		s.vllm = s.vllm || strings.HasPrefix(mf.GetName(), "vllm:")
		name := canonical(mf.GetName())
		if name == "" {
			continue
		}
		vals := s.values[name]
		if vals == nil {
			vals = map[seriesKey]float64{}
			s.values[name] = vals
		}
		for _, m := range mf.GetMetric() {
			k := seriesKey{}
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "engine":
					k.engine = l.GetValue()
				case "model_name":
					k.model = l.GetValue()
				}
			}
			vals[k] += value(mf.GetType(), m)
		}
	}
	return s, nil
}

// canonical maps a family name to the wanted name it stands for, or "".
func canonical(name string) string {
	for _, w := range wanted {
		if name == w || (strings.HasSuffix(w, "_total") && name == strings.TrimSuffix(w, "_total")) {
			return w
		}
	}
	return ""
}

func value(t dto.MetricType, m *dto.Metric) float64 {
	switch t {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	default:
		return m.GetUntyped().GetValue()
	}
}
