package assess

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// PromOptions say where and what to ask Prometheus.
type PromOptions struct {
	URL    string        // base URL of the Prometheus HTTP API (…/api/v1/query is appended)
	Window time.Duration // the range increase() and *_over_time() look back over
	// Model keeps the series whose model_name equals it; empty takes the only model present.
	Model string
	// Selector is extra PromQL label matchers, e.g. `namespace="llm",job="vllm"`.
	Selector string
	// PodLabel names the target label that tells pods apart ("pod" with the usual Kubernetes
	// service discovery); series without it fall back to "instance".
	PodLabel    string
	BearerToken string        // sent as Authorization: Bearer, for a Prometheus behind auth
	Timeout     time.Duration // per query; 0 = 30 s
	// At evaluates every query at this instant (zero = now), so all numbers cover one window.
	At        time.Time
	Transport http.RoundTripper // nil = http.DefaultTransport
}

var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// CollectPrometheus runs one instant query per metric, grouped per pod and rank, and assembles a
// Snapshot. The prefix-cache counters are required; every other series is optional and noted
// when absent.
func CollectPrometheus(ctx context.Context, o PromOptions) (Snapshot, error) {
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Snapshot{}, fmt.Errorf("--prometheus %q: want the server's base URL, e.g. http://prometheus.monitoring:9090", o.URL)
	}
	if o.Window < time.Second {
		return Snapshot{}, fmt.Errorf("window %v is too short for Prometheus: use at least two scrape intervals (e.g. 5m)", o.Window)
	}
	if o.PodLabel == "" {
		o.PodLabel = "pod"
	}
	if !labelName.MatchString(o.PodLabel) {
		return Snapshot{}, fmt.Errorf("--pod-label %q is not a Prometheus label name", o.PodLabel)
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	if o.At.IsZero() {
		o.At = time.Now()
	}
	rt := o.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	if o.BearerToken != "" {
		rt = bearer{token: o.BearerToken, next: rt}
	}
	client, err := api.NewClient(api.Config{Address: strings.TrimSuffix(o.URL, "/"), RoundTripper: rt})
	if err != nil {
		return Snapshot{}, fmt.Errorf("--prometheus %q: %v", o.URL, err)
	}
	p := &promRun{api: promv1.NewAPI(client), o: o, win: model.Duration(o.Window).String()}
	p.sel = selector(o.Model, o.Selector)
	grouping := []string{o.PodLabel, "instance", "engine", "model_name"}
	if o.PodLabel == "instance" {
		grouping = grouping[1:]
	}
	p.by = "by (" + strings.Join(grouping, ", ") + ")"

	snap := Snapshot{Source: "prometheus " + o.URL, WindowSeconds: o.Window.Seconds()}
	queries, err := p.query(ctx, "sum", "increase", MetricQueries)
	if err != nil {
		return snap, err
	}
	if len(queries) == 0 {
		return snap, p.explainMissing(ctx, MetricQueries)
	}
	models := map[string]bool{}
	for k := range queries {
		models[k.model] = true
	}
	if len(models) > 1 {
		return snap, fmt.Errorf("%s has series for %d models (%s): a fleet is one model, pass --model",
			MetricQueries, len(models), strings.Join(sortedKeys(models), ", "))
	}
	for m := range models {
		snap.Model = m
	}
	hits, err := p.query(ctx, "sum", "increase", MetricHits)
	if err != nil {
		return snap, err
	}
	if len(hits) == 0 {
		return snap, fmt.Errorf("Prometheus has %s but no %s for %s in the last %s: both come from the same vLLM "+
			"stat logger, so check the recording rules or relabelling that drop series", MetricQueries, MetricHits,
			p.selDesc(), p.win)
	}

	optional := func(agg, fn, metric string) map[replicaKey]float64 {
		if err != nil {
			return nil
		}
		var v map[replicaKey]float64
		v, err = p.query(ctx, agg, fn, metric)
		if err == nil && len(v) == 0 {
			snap.Notes = append(snap.Notes, fmt.Sprintf("No %s series for %s: left out.", metric, p.selDesc()))
		}
		return v
	}
	preempt := optional("sum", "increase", MetricPreemptions)
	reqs := optional("sum", "increase", MetricRequests)
	running := optional("avg", "avg_over_time", MetricRunning)
	waiting := optional("avg", "avg_over_time", MetricWaiting)
	if err != nil {
		return snap, err
	}
	kvMean, kvMax, kvNote, err := p.kvUsage(ctx)
	if err != nil {
		return snap, err
	}
	if kvNote != "" {
		snap.Notes = append(snap.Notes, kvNote)
	}

	for k, q := range queries {
		r := Replica{Pod: k.pod, Engine: k.engine, Model: k.model, QueryTokens: q, HitTokens: hits[k]}
		r.Preemptions = lookup(preempt, k)
		r.Requests = lookup(reqs, k)
		r.KVUsageMean, r.KVUsageMax = lookup(kvMean, k), lookup(kvMax, k)
		r.RunningMean, r.WaitingMean = lookup(running, k), lookup(waiting, k)
		snap.Replicas = append(snap.Replicas, r)
	}
	sortReplicas(snap.Replicas)
	snap.Notes = append(snap.Notes, fmt.Sprintf("Counters: increase() over [%s] at %s; gauges: avg_over_time and "+
		"max_over_time over the same range; grouped %s.", p.win, o.At.UTC().Format(time.RFC3339), p.by))
	return snap, nil
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

type replicaKey struct{ pod, engine, model string }

type promRun struct {
	api      promv1.API
	o        PromOptions
	win, sel string
	by       string
}

// selector builds the matcher braces: the model first, then the user's extra matchers as given
// (Prometheus reports their syntax errors itself).
func selector(modelName, extra string) string {
	var parts []string
	if modelName != "" {
		parts = append(parts, fmt.Sprintf("model_name=%q", modelName))
	}
	if e := strings.Trim(strings.TrimSpace(extra), "{}"); e != "" {
		parts = append(parts, e)
	}
	if len(parts) == 0 {
		return ""
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func (p *promRun) selDesc() string {
	if p.sel == "" {
		return "any model"
	}
	return p.sel
}

// query runs `agg by (...) (fn(metric{sel}[window]))` and keys the vector per replica.
func (p *promRun) query(ctx context.Context, agg, fn, metric string) (map[replicaKey]float64, error) {
	q := fmt.Sprintf("%s %s (%s(%s%s[%s]))", agg, p.by, fn, metric, p.sel, p.win)
	v, err := p.instant(ctx, q)
	if err != nil {
		return nil, err
	}
	out := map[replicaKey]float64{}
	for _, s := range v {
		k := replicaKey{pod: string(s.Metric[model.LabelName(p.o.PodLabel)]), engine: string(s.Metric["engine"]),
			model: string(s.Metric["model_name"])}
		if k.pod == "" {
			k.pod = string(s.Metric["instance"])
		}
		out[k] += float64(s.Value)
	}
	return out, nil
}

func (p *promRun) instant(ctx context.Context, q string) (model.Vector, error) {
	ctx, cancel := context.WithTimeout(ctx, p.o.Timeout)
	defer cancel()
	val, _, _, err := p.api.Query(ctx, q, p.o.At)
	if err != nil {
		var apiErr *promv1.Error
		if errors.As(err, &apiErr) && (apiErr.Type == promv1.ErrBadData || apiErr.Type == promv1.ErrExec ||
			apiErr.Type == promv1.ErrTimeout || apiErr.Type == promv1.ErrCanceled) {
			return nil, fmt.Errorf("Prometheus at %s rejected %s: %s", p.o.URL, q, apiErr.Msg)
		}
		if errors.As(err, &apiErr) && (strings.Contains(apiErr.Msg, "401") || strings.Contains(apiErr.Msg, "403")) {
			return nil, fmt.Errorf("Prometheus at %s refused the query (%s): pass a bearer token with "+
				"--prometheus-token-file", p.o.URL, apiErr.Msg)
		}
		return nil, fmt.Errorf("cannot query Prometheus at %s (%v): check --prometheus is the server's base URL "+
			"and that it is reachable from here", p.o.URL, err)
	}
	vec, ok := val.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("Prometheus at %s answered %s with a %s, not an instant vector", p.o.URL, q, val.Type())
	}
	return vec, nil
}

// kvUsage reads the KV gauge under its current name, else under the name vLLM used before.
func (p *promRun) kvUsage(ctx context.Context) (mean, mx map[replicaKey]float64, note string, err error) {
	for _, name := range []string{MetricKVUsage, MetricKVUsageOld} {
		if mean, err = p.query(ctx, "avg", "avg_over_time", name); err != nil {
			return nil, nil, "", err
		}
		if len(mean) == 0 {
			continue
		}
		if mx, err = p.query(ctx, "max", "max_over_time", name); err != nil {
			return nil, nil, "", err
		}
		if name == MetricKVUsageOld {
			note = fmt.Sprintf("KV usage read from %s (the name before %s).", MetricKVUsageOld, MetricKVUsage)
		}
		return mean, mx, note, nil
	}
	return nil, nil, fmt.Sprintf("Neither %s nor %s for %s: KV pressure left out.", MetricKVUsage, MetricKVUsageOld, p.selDesc()), nil
}

// explainMissing says why the required counter returned nothing: wrong model or selector, or
// no vLLM series at all.
func (p *promRun) explainMissing(ctx context.Context, metric string) error {
	v, err := p.instant(ctx, fmt.Sprintf("count by (model_name) (last_over_time(%s[%s]))", metric, p.win))
	if err != nil {
		return err
	}
	if len(v) > 0 {
		var models []string
		for _, s := range v {
			models = append(models, string(s.Metric["model_name"]))
		}
		slices.Sort(models)
		return fmt.Errorf("no %s series match %s in the last %s; Prometheus has it for model_name %s: check --model "+
			"and --selector", metric, p.selDesc(), p.win, strings.Join(models, ", "))
	}
	return fmt.Errorf("Prometheus at %s has no %s series in the last %s. Check that it scrapes the vLLM engines' "+
		"/metrics (their up{} series), that the window covers at least two scrapes, and that the engines run "+
		"vLLM 0.10 or later (earlier versions exported vllm:gpu_prefix_cache_queries_total instead)",
		p.o.URL, metric, p.win)
}

func lookup(m map[replicaKey]float64, k replicaKey) *float64 {
	if v, ok := m[k]; ok {
		return ptr(v)
	}
	return nil
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		if k == "" {
			k = `""`
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
