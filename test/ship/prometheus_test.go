package ship

import (
	"encoding/json"
	"io"
	"log/slog"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/router/admission"
	"github.com/kvroute/kvroute/router/app"
	"github.com/kvroute/kvroute/router/audit"
	"github.com/kvroute/kvroute/router/capture"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/metrics"
	"github.com/kvroute/kvroute/router/peersnap"
	"github.com/kvroute/kvroute/router/peersync"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/router/shadow"
)

// vllmMetrics are the vLLM /metrics names the assets may use (vLLM >= 0.12; the kv-events
// spec, section 6.3, from vllm/v1/metrics/loggers.py). Counters as Prometheus exposes them.
var vllmMetrics = []string{
	"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason",
	"vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
	"vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total",
	"vllm:prompt_tokens_cached_total", "vllm:cache_config_info",
	"vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// routerMetrics lists every series name kvrouter exposes, read from router/metrics' own
// collectors (histograms contribute _bucket, _sum and _count).
// describer is a collector that only describes.
type describer func(chan<- *prometheus.Desc)

func (d describer) Describe(ch chan<- *prometheus.Desc) { d(ch) }
func (describer) Collect(chan<- prometheus.Metric)      {}

func routerMetrics(t *testing.T) map[string]string {
	t.Helper()
	m := metrics.New(nil)
	var counters []metrics.CounterSpec
	for _, c := range kvevents.CounterSpecs() {
		counters = append(counters, metrics.CounterSpec{Metric: c.Metric, Help: c.Help, Gauge: c.Gauge})
	}
	collectors := []prometheus.Collector{metrics.NewStateCollector(nil, nil, nil, nil, counters)}
	// The trace capture and the prompt audit register their own collectors when enabled.
	rec, err := capture.New(capture.Options{Dir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	aud := audit.New(audit.Options{})
	defer aud.Close()
	pol, err := score.New("kv", score.Options{})
	if err != nil {
		t.Fatal(err)
	}
	collectors = append(append(append(collectors, rec.Collectors()...), aud.Collectors()...), shadow.New(pol).Collectors()...)
	// Several router replicas: the load sync's and the snapshot's collectors.
	collectors = append(append(collectors, peersync.Collectors()...), peersnap.NewMetrics().Collectors()...)
	// The ledger's fitted engine timing.
	collectors = append(collectors, load.New(load.Options{Policy: pol}).Collectors()...)
	// The hold for a model with no ready replica, and the backlog the autoscalers read.
	collectors = append(collectors, admission.New(admission.Options{}, "m").Collectors()...)
	collectors = append(collectors, describer(app.BacklogDescs), describer(app.IndexAndRenderDescs))
	v := reflect.ValueOf(m).Elem()
	for i := 0; i < v.NumField(); i++ {
		if c, ok := v.Field(i).Interface().(prometheus.Collector); ok && v.Type().Field(i).Name != "Registry" {
			collectors = append(collectors, c)
		}
	}
	out := map[string]string{}
	for _, c := range collectors {
		ch := make(chan *prometheus.Desc, 256)
		c.Describe(ch)
		close(ch)
		_, isHist := c.(prometheus.Histogram)
		_, isHistVec := c.(*prometheus.HistogramVec)
		for d := range ch {
			sm := fqName.FindStringSubmatch(d.String())
			if sm == nil {
				t.Fatalf("no fqName in %s", d)
			}
			out[sm[1]] = "router"
			if isHist || isHistVec {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					out[sm[1]+s] = "router"
				}
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d router metrics found: %v", len(out), out)
	}
	return out
}

func knownMetrics(t *testing.T) map[string]string {
	known := routerMetrics(t)
	for _, n := range vllmMetrics {
		known[n] = "vllm"
	}
	return known
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promNumber   = regexp.MustCompile(`\b[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?\b`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "le": true, "inf": true, "nan": true}
)

// metricNames extracts the metric names of a PromQL expression: identifiers outside strings,
// label matchers, ranges and grouping clauses that are not functions or keywords. A regex, not
// the PromQL parser, because github.com/prometheus/prometheus would pull in most of Prometheus.
func metricNames(expr string) []string {
	e := promString.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRange.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	e = promNumber.ReplaceAllString(e, " ")
	var out []string
	for _, m := range promIdent.FindAllString(e, -1) {
		if strings.HasSuffix(m, "(") || promKeywords[strings.ToLower(m)] {
			continue
		}
		out = append(out, m)
	}
	return out
}

func TestMetricNamesExtraction(t *testing.T) {
	got := metricNames(`sum by (namespace, engine) (rate(kvroute_router_x_total{state=~"a|b",code="2.."}[5m])) / on (pod) group_left (engine) vllm:y > 1e-9 and bool z`)
	want := []string{"kvroute_router_x_total", "vllm:y", "z"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("metricNames = %v, want %v", got, want)
	}
}

func checkExpr(t *testing.T, where, expr string, known map[string]string) {
	t.Helper()
	names := metricNames(expr)
	if len(names) == 0 {
		t.Errorf("%s: no metric in %q", where, expr)
	}
	for _, n := range names {
		if _, ok := known[n]; !ok {
			t.Errorf("%s uses %s, which neither router/metrics nor vLLM exposes", where, n)
		}
	}
	if strings.Count(expr, "(") != strings.Count(expr, ")") || strings.Count(expr, "{") != strings.Count(expr, "}") {
		t.Errorf("%s: unbalanced brackets in %q", where, expr)
	}
}

func TestAlertRulesUseRealMetrics(t *testing.T) {
	known := knownMetrics(t)
	var rule struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Alert       string            `json:"alert"`
					Expr        string            `json:"expr"`
					For         string            `json:"for"`
					Labels      map[string]string `json:"labels"`
					Annotations map[string]string `json:"annotations"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(readFile(t, "config/prometheus/alerts.yaml"), &rule); err != nil {
		t.Fatal(err)
	}
	if rule.Kind != "PrometheusRule" {
		t.Fatalf("kind %q", rule.Kind)
	}
	anchors := headingAnchors(string(readFile(t, "docs/operations.md")))
	alerts := map[string]bool{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			checkExpr(t, r.Alert, r.Expr, known)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || !strings.HasPrefix(r.Annotations["runbook"], "docs/operations.md#") {
				t.Errorf("%s needs a severity, a summary and a runbook into docs/operations.md", r.Alert)
			}
			if _, a, _ := strings.Cut(r.Annotations["runbook"], "#"); !anchors[a] {
				t.Errorf("%s: runbook anchor #%s is no heading of docs/operations.md", r.Alert, a)
			}
		}
	}
	// The failure modes the issue names, each with its alert.
	for _, a := range []string{"KVRouteEventStreamStalled", "KVRouteEventStreamInexact", "KVRoutePredictionDrift", "KVRoutePrefillHotspot", "KVRouteUsageNotReported"} {
		if !alerts[a] {
			t.Errorf("no alert %s", a)
		}
	}
}

func TestDashboardUsesRealMetrics(t *testing.T) {
	known := knownMetrics(t)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(readFile(t, "config/prometheus/grafana-dashboard.json"), &dash); err != nil {
		t.Fatal(err)
	}
	titles := map[string]bool{}
	for _, p := range dash.Panels {
		titles[p.Title] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkExpr(t, "panel "+p.Title, strings.ReplaceAll(tg.Expr, "$__rate_interval", "5m"), known)
		}
	}
	for _, want := range []string{"Predicted vs actual hit ratio", "Decisions per engine", "KV event lag", "Gaps, replays, resets", "Streams not exact", "Warm-up credit",
		"Request rate by outcome", "Request duration p50/p90", "Time to first token p50/p90", "Inter-token latency p50/p90", "Cached share of prompt tokens"} {
		if !titles[want] {
			t.Errorf("dashboard has no panel %q", want)
		}
	}
}

// docs/operations.md explains every router metric; a new metric without a line fails here.
func TestOperationsDocListsEveryRouterMetric(t *testing.T) {
	doc := string(readFile(t, "docs/operations.md"))
	var missing []string
	for n := range routerMetrics(t) {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
		if !strings.Contains(doc, "`"+base+"`") {
			missing = append(missing, base)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("docs/operations.md does not explain %v", missing)
	}
}

// headingAnchors returns the GitHub anchors of a Markdown document's headings.
func headingAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, line := range strings.Split(doc, "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			h = strings.TrimSpace(strings.TrimLeft(h, "#"))
			out[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
		}
	}
	return out
}

// The other way round: every full kvroute_router_ name docs/operations.md shows (a metric's
// table row, the operations table's "what you see") is one kvrouter exposes, so a renamed or
// mistyped metric in the runbook fails here rather than leaving an operator searching for it.
func TestOperationsDocNamesRealMetrics(t *testing.T) {
	doc := string(readFile(t, "docs/operations.md"))
	known := routerMetrics(t)
	name := regexp.MustCompile("kvroute_router_[a-z0-9_*]+")
	var unknown []string
	for _, n := range name.FindAllString(doc, -1) {
		n = strings.TrimSuffix(n, "_")
		if strings.Contains(n, "*") { // a family written with a wildcard (mode_*_cached_tokens_total)
			continue
		}
		if _, ok := known[n]; !ok && !slices.Contains(unknown, n) {
			unknown = append(unknown, n)
		}
	}
	if len(unknown) > 0 {
		t.Errorf("docs/operations.md names metrics kvrouter does not expose: %v", unknown)
	}
}

// `kubectl apply -k config/prometheus` ships the dashboard as a ConfigMap the Grafana sidecar
// loads (label grafana_dashboard: "1", a fixed name), holding grafana-dashboard.json as it is,
// and both PodMonitors put the KVRoutedModel's name on the series the dashboard's model
// variable reads.
func TestDashboardConfigMapAndModelLabel(t *testing.T) {
	dash := string(readFile(t, "config/prometheus/grafana-dashboard.json"))
	var cm, monitors int
	for _, o := range decodeObjects(t, kustomizeBuild(t, "config/prometheus")) {
		switch o.GetKind() {
		case "ConfigMap":
			cm++
			if o.GetName() != "kvroute-grafana-dashboard" || o.GetLabels()["grafana_dashboard"] != "1" {
				t.Errorf("dashboard ConfigMap %s labels %v: want kvroute-grafana-dashboard with grafana_dashboard: \"1\"", o.GetName(), o.GetLabels())
			}
			data, _, _ := unstructured.NestedStringMap(o.Object, "data")
			if data["kvroute.json"] != dash {
				t.Errorf("the ConfigMap's kvroute.json is not grafana-dashboard.json")
			}
		case "PodMonitor":
			monitors++
			eps, _, _ := unstructured.NestedSlice(o.Object, "spec", "podMetricsEndpoints")
			found := false
			for _, ep := range eps {
				rls, _, _ := unstructured.NestedSlice(ep.(map[string]any), "relabelings")
				for _, rl := range rls {
					m := rl.(map[string]any)
					src, _ := m["sourceLabels"].([]any)
					if m["targetLabel"] == "model" && len(src) == 1 && src[0] == "__meta_kubernetes_pod_label_serving_kvroute_io_model" {
						found = true
					}
				}
			}
			if !found {
				t.Errorf("PodMonitor %s does not set the model label from the pod's serving.kvroute.io/model", o.GetName())
			}
		}
	}
	if cm != 1 || monitors != 2 {
		t.Errorf("config/prometheus builds %d ConfigMaps and %d PodMonitors, want 1 and 2", cm, monitors)
	}
	if !strings.Contains(dash, `"name": "model"`) {
		t.Errorf("the dashboard has no model variable")
	}
}
