package assess

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// promSeries is one series in the fake Prometheus, with what each range function returns for it
// over the queried window.
type promSeries struct {
	metric string
	labels map[string]string
	inc    float64 // increase()
	avg    float64 // avg_over_time()
	max    float64 // max_over_time()
}

// fakeProm implements the slice of the HTTP API assess uses: instant queries of the shape
// `agg by (labels) (fn(metric{matchers}[window]))` and `count by (model_name) (last_over_time(...))`,
// evaluated over its series with real label matching and grouping. Anything else is a bad_data
// error, as Prometheus answers a query it cannot parse.
type fakeProm struct {
	series []promSeries
	token  string // when set, requests must carry it as a bearer token

	mu      sync.Mutex
	queries []string
}

var (
	aggQuery   = regexp.MustCompile(`^(sum|avg|max) by \(([a-z_, ]+)\) \((increase|avg_over_time|max_over_time)\(([a-z_:]+)(\{[^}]*\})?\[([0-9a-z]+)\]\)\)$`)
	countQuery = regexp.MustCompile(`^count by \(model_name\) \(last_over_time\(([a-z_:]+)\[([0-9a-z]+)\]\)\)$`)
	matcher    = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"\s*$`)
)

func (f *fakeProm) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if r.URL.Path != "/api/v1/query" {
		http.NotFound(w, r)
		return
	}
	_ = r.ParseForm()
	q := r.Form.Get("query")
	f.mu.Lock()
	f.queries = append(f.queries, q)
	f.mu.Unlock()
	if _, err := strconv.ParseFloat(r.Form.Get("time"), 64); err != nil {
		f.fail(w, "bad_data", "invalid time")
		return
	}
	type sample struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	groups := map[string]*sample{}
	counts := map[string]int{}
	var order []string
	add := func(labels map[string]string, v float64, agg string) {
		key := fmt.Sprint(labels)
		s, ok := groups[key]
		if !ok {
			s = &sample{Metric: labels, Value: [2]any{1.7e9, "0"}}
			groups[key] = s
			order = append(order, key)
		}
		old, _ := strconv.ParseFloat(s.Value[1].(string), 64)
		switch agg {
		case "sum", "count":
			v += old
		case "max":
			if ok && old > v {
				v = old
			}
		case "avg":
			counts[key]++
			v = old + (v-old)/float64(counts[key])
		}
		s.Value[1] = strconv.FormatFloat(v, 'f', -1, 64)
	}
	if m := countQuery.FindStringSubmatch(q); m != nil {
		for _, s := range f.series {
			if s.metric == m[1] {
				add(map[string]string{"model_name": s.labels["model_name"]}, 1, "count")
			}
		}
	} else if m := aggQuery.FindStringSubmatch(q); m != nil {
		agg, by, fn, metric, sel := m[1], strings.Split(m[2], ", "), m[3], m[4], strings.Trim(m[5], "{}")
		want := map[string]string{}
		if sel != "" {
			for _, part := range strings.Split(sel, ",") {
				mm := matcher.FindStringSubmatch(part)
				if mm == nil {
					f.fail(w, "bad_data", fmt.Sprintf("1:%d: parse error: unexpected matcher %q", len(q), part))
					return
				}
				want[mm[1]] = mm[2]
			}
		}
	series:
		for _, s := range f.series {
			if s.metric != metric {
				continue
			}
			for k, v := range want {
				if s.labels[k] != v {
					continue series
				}
			}
			labels := map[string]string{}
			for _, l := range by {
				if v, ok := s.labels[l]; ok {
					labels[l] = v
				}
			}
			v := map[string]float64{"increase": s.inc, "avg_over_time": s.avg, "max_over_time": s.max}[fn]
			add(labels, v, agg)
		}
	} else {
		f.fail(w, "bad_data", "1:1: parse error: unexpected query")
		return
	}
	result := []*sample{}
	for _, k := range order {
		result = append(result, groups[k])
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"status": "success",
		"data": map[string]any{"resultType": "vector", "result": result}})
}

func (f *fakeProm) fail(w http.ResponseWriter, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(map[string]any{"status": "error", "errorType": typ, "error": msg})
}

func (f *fakeProm) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.queries...)
}

// vllmPod adds one pod's series for a model, one set per DP rank, as vLLM labels them.
func (f *fakeProm) vllmPod(pod, model string, ranks int, queries, hits float64, kvName string) {
	for r := range ranks {
		l := func(extra ...string) map[string]string {
			m := map[string]string{"pod": pod, "instance": pod + ":8000", "namespace": "llm", "job": "vllm",
				"model_name": model, "engine": strconv.Itoa(r)}
			for i := 0; i+1 < len(extra); i += 2 {
				m[extra[i]] = extra[i+1]
			}
			return m
		}
		f.series = append(f.series,
			promSeries{metric: MetricQueries, labels: l(), inc: queries},
			promSeries{metric: MetricHits, labels: l(), inc: hits},
			promSeries{metric: MetricPreemptions, labels: l(), inc: 2},
			// Requests are split by finished_reason; assess sums them.
			promSeries{metric: MetricRequests, labels: l("finished_reason", "stop"), inc: 90},
			promSeries{metric: MetricRequests, labels: l("finished_reason", "length"), inc: 10},
			promSeries{metric: MetricRunning, labels: l(), avg: 3},
			promSeries{metric: MetricWaiting, labels: l(), avg: 0.5},
		)
		if kvName != "" {
			f.series = append(f.series, promSeries{metric: kvName, labels: l(), avg: 0.4, max: 0.7})
		}
	}
}

func startProm(t *testing.T, f *fakeProm) string {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestPrometheusPerPodAndRank(t *testing.T) {
	f := &fakeProm{}
	f.vllmPod("qwen-a", "qwen", 2, 60000, 12000, MetricKVUsage)
	f.vllmPod("qwen-b", "qwen", 2, 60000, 13200, MetricKVUsage)
	f.vllmPod("llama-a", "llama", 1, 999, 999, MetricKVUsage) // another fleet in the same Prometheus
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	snap, err := CollectPrometheus(context.Background(), PromOptions{URL: startProm(t, f), Window: 10 * time.Minute,
		Model: "qwen", Selector: `namespace="llm"`, At: at})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Model != "qwen" || snap.WindowSeconds != 600 || len(snap.Replicas) != 4 {
		t.Fatalf("snapshot %+v", snap)
	}
	ids := []string{}
	for _, r := range snap.Replicas {
		ids = append(ids, r.ID())
	}
	if strings.Join(ids, " ") != "qwen-a/0 qwen-a/1 qwen-b/0 qwen-b/1" {
		t.Errorf("replicas %v", ids)
	}
	r := snap.Replicas[2]
	if r.QueryTokens != 60000 || r.HitTokens != 13200 || *r.Requests != 100 || *r.Preemptions != 2 ||
		*r.KVUsageMean != 0.4 || *r.KVUsageMax != 0.7 || *r.RunningMean != 3 || *r.WaitingMean != 0.5 {
		t.Errorf("replica %+v", r)
	}
	for _, q := range f.seen() {
		if !strings.Contains(q, `{model_name="qwen",namespace="llm"}[10m]`) || !strings.Contains(q, "by (pod, instance, engine, model_name)") {
			t.Errorf("query %q does not select the model over the window per pod and rank", q)
		}
	}
	a, err := Decide(snap, DefaultThresholds())
	if err != nil {
		t.Fatal(err)
	}
	if a.Verdict != VerdictWorthRouting || a.Fleet.Replicas != 4 || *a.Fleet.PreemptionsPerRequest != 0.02 {
		t.Errorf("assessment %s %+v", a.Verdict, a.Fleet)
	}
}

func TestPrometheusFallbacksAndNotes(t *testing.T) {
	f := &fakeProm{}
	f.vllmPod("p0", "m", 1, 1000, 900, MetricKVUsageOld) // the gauge under its old name
	f.vllmPod("p1", "m", 1, 1000, 950, MetricKVUsageOld)
	var keep []promSeries
	for _, s := range f.series {
		switch s.metric {
		case MetricPreemptions: // not scraped here
		default:
			if s.labels["pod"] == "p1" {
				delete(s.labels, "pod") // a target without the pod label: instance names it
			}
			keep = append(keep, s)
		}
	}
	f.series = keep
	snap, err := CollectPrometheus(context.Background(), PromOptions{URL: startProm(t, f) + "/", Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Model != "m" || len(snap.Replicas) != 2 || snap.Replicas[0].Pod != "p0" || snap.Replicas[1].Pod != "p1:8000" {
		t.Fatalf("snapshot %+v", snap.Replicas)
	}
	if snap.Replicas[0].KVUsageMax == nil || *snap.Replicas[0].KVUsageMax != 0.7 || snap.Replicas[0].Preemptions != nil {
		t.Errorf("replica %+v", snap.Replicas[0])
	}
	notes := strings.Join(snap.Notes, "\n")
	for _, w := range []string{"read from vllm:gpu_cache_usage_perc", "No vllm:num_preemptions_total series", "[1h]"} {
		if !strings.Contains(notes, w) {
			t.Errorf("notes lack %q:\n%s", w, notes)
		}
	}
}

func TestPrometheusErrors(t *testing.T) {
	two := &fakeProm{}
	two.vllmPod("a", "qwen", 1, 10, 1, MetricKVUsage)
	two.vllmPod("b", "llama", 1, 10, 1, MetricKVUsage)
	noHits := &fakeProm{series: []promSeries{{metric: MetricQueries, labels: map[string]string{"pod": "a", "engine": "0", "model_name": "m"}, inc: 5}}}
	secured := &fakeProm{token: "s3cret"}
	secured.vllmPod("a", "m", 1, 10, 1, MetricKVUsage)
	twoURL, noHitsURL, securedURL, emptyURL := startProm(t, two), startProm(t, noHits), startProm(t, secured), startProm(t, &fakeProm{})
	// A port that was just free, taken after every server above so none of them reuses it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	for _, c := range []struct {
		name string
		o    PromOptions
		want []string
	}{
		{"two models", PromOptions{URL: twoURL}, []string{"2 models (llama, qwen)", "pass --model"}},
		{"wrong model", PromOptions{URL: twoURL, Model: "mistral"},
			[]string{`no vllm:prefix_cache_queries_total series match {model_name="mistral"}`, "model_name llama, qwen", "--model"}},
		{"no vLLM at all", PromOptions{URL: emptyURL},
			[]string{"has no vllm:prefix_cache_queries_total series in the last 5m", "up{}", "vllm:gpu_prefix_cache_queries_total"}},
		{"queries without hits", PromOptions{URL: noHitsURL}, []string{"no vllm:prefix_cache_hits_total"}},
		{"bad selector", PromOptions{URL: twoURL, Selector: `namespace=~"llm.*"`}, []string{"rejected", "parse error"}},
		{"unreachable", PromOptions{URL: closed}, []string{"cannot query Prometheus at " + closed, "connection refused"}},
		{"auth", PromOptions{URL: securedURL}, []string{"refused the query", "--prometheus-token-file"}},
		{"not a URL", PromOptions{URL: "prometheus:9090"}, []string{"want the server's base URL"}},
		{"bad pod label", PromOptions{URL: closed, PodLabel: "pod-name"}, []string{"not a Prometheus label name"}},
		{"window too short", PromOptions{URL: closed, Window: time.Millisecond}, []string{"too short"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.o.Window == 0 {
				c.o.Window = 5 * time.Minute
			}
			_, err := CollectPrometheus(context.Background(), c.o)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q missing from %v", w, err)
				}
			}
		})
	}
	snap, err := CollectPrometheus(context.Background(), PromOptions{URL: securedURL, Window: time.Minute, BearerToken: "s3cret"})
	if err != nil || len(snap.Replicas) != 1 {
		t.Errorf("with the token: %v %+v", err, snap)
	}
}
