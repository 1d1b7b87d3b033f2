// Package metrics holds kvrouter's Prometheus collectors on their own registry (nothing from
// the default registry leaks in, so the scrape is exactly what this file lists).
package metrics

import (
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/internal/version"
)

const ns = "kvroute_router"

// Metrics are the router's collectors. Request-path ones are updated inline; stream and index
// state is read at scrape time through the collector given to New.
type Metrics struct {
	Registry *prometheus.Registry

	Requests             *prometheus.CounterVec // engine, policy, code
	Errors               *prometheus.CounterVec // engine, policy, reason
	Retries              *prometheus.CounterVec // engine
	DecisionSeconds      *prometheus.HistogramVec
	TokenizeSeconds      prometheus.Histogram
	TokenizeFailures     prometheus.Counter
	TokenizeSource       *prometheus.CounterVec // source
	EngineAuth           *prometheus.CounterVec // call: engines refusing the router's credentials
	EngineScrapes        *prometheus.CounterVec // engine: /metrics pages not read
	PromptTokens         *prometheus.CounterVec // engine
	PredictedCached      *prometheus.CounterVec // engine
	ActualCached         *prometheus.CounterVec // engine (responses with usage only)
	UsageMissing         *prometheus.CounterVec // engine: responses without cached_tokens
	ApproxDecisions      *prometheus.CounterVec // engine: decisions scored from the approximate index
	UnkeyedRequests      *prometheus.CounterVec // reason: requests routed by load without keys
	DisaggRequests       *prometheus.CounterVec // path, reason: requests on a disaggregated fleet
	ReportModeOverrides  prometheus.Counter     // client kv_cache_report_mode set back to incremental
	EnginesRefused       prometheus.Gauge       // discovered engines of another kind than the router's
	ResponseAffinity     *prometheus.CounterVec // result: stored Responses answers and follow-ups pinned to their engine
	ResponseOwnerEvicted prometheus.Counter     // response-owner map entries dropped (size cap or TTL)
	EngineHeadersSeconds *prometheus.HistogramVec
	FirstTokenSeconds    *prometheus.HistogramVec // engine: streams only
	EngineErrors         *prometheus.CounterVec   // engine, when: in-stream error events the engines sent
	InflightRequests     *prometheus.GaugeVec     // engine, rank
	RequestSeconds       *prometheus.HistogramVec // outcome, stream: end to end, to the last byte
	// Accuracy per scoring mode (exact, predicted, approximate, unkeyed), answers with usage
	// only: prompt, predicted cached and engine-reported cached tokens. Rates of these over any
	// window show drift; a lifetime ratio would hide it.
	ModePromptTokens    *prometheus.CounterVec // engine, mode
	ModePredictedCached *prometheus.CounterVec // engine, mode
	ModeActualCached    *prometheus.CounterVec // engine, mode
}

// RequestBuckets are the request-duration buckets: an LLM request takes from a few
// milliseconds (a refusal, a cached short answer) to minutes (a long generation), so they run
// from 5ms to 10 minutes.
var RequestBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600}

// New builds the collectors on a fresh registry; state (may be nil) adds scrape-time metrics.
func New(state prometheus.Collector) *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "requests_total",
			Help: "Requests forwarded, by engine, policy and final HTTP status."}, []string{"engine", "policy", "code"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "errors_total",
			Help: "Requests that failed or were refused, by engine (\"\" before a choice), policy and reason."}, []string{"engine", "policy", "reason"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "retries_total",
			Help: "Attempts given up on an engine before any byte reached the client, by that engine."}, []string{"engine"}),
		DecisionSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "decision_seconds",
			Help:    "Routing decision time from token ids (keys, match, score), by policy.",
			Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 200e-6, 300e-6, 500e-6, 1e-3, 2.5e-3, 10e-3}}, []string{"policy"}),
		TokenizeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "tokenize_seconds",
			Help: "Time to get a request's token ids (render call or cache).", Buckets: prometheus.ExponentialBuckets(50e-6, 4, 9)}),
		TokenizeFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "tokenize_failures_total",
			Help: "Requests whose tokenization failed and were routed by load only."}),
		TokenizeSource: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "tokenize_source_total",
			Help: "Where request tokens came from: ids, cache or engine."}, []string{"source"}),
		EngineAuth: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "engine_auth_failures_total",
			Help: "Router calls an engine refused with 401/403 (no or wrong engine API key: a router misconfiguration), by call: tokenize, models, health, generate."},
			[]string{"call"}),
		EngineScrapes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "engine_metrics_failures_total",
			Help: "Engine /metrics pages the router could not read or parse (its queue and KV-use signals for the engine keep the last page's values until one is read)."},
			[]string{"engine"}),
		PromptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "prompt_tokens_total",
			Help: "Prompt tokens routed, by engine."}, []string{"engine"}),
		PredictedCached: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "predicted_cached_tokens_total",
			Help: "Prompt tokens the router predicted cached on the chosen replica."}, []string{"engine"}),
		ActualCached: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "actual_cached_tokens_total",
			Help: "usage.prompt_tokens_details.cached_tokens reported by the engines."}, []string{"engine"}),
		UsageMissing: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "usage_missing_total",
			Help: "Successful answers without cached_tokens (engine started without --enable-prompt-tokens-details?)."}, []string{"engine"}),
		ApproxDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "approximate_decisions_total",
			Help: "Decisions where the chosen replica was scored from the approximate index (no healthy event stream)."}, []string{"engine"}),
		ReportModeOverrides: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "client_report_mode_overrides_total",
			Help: "Requests whose own vllm_xargs.kv_cache_report_mode the router set back to incremental (outside full mode a client's full mode would leave re-announced blocks in the index)."}),
		EnginesRefused: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "engines_refused",
			Help: "Engines discovery lists but the router refuses: their kind is not the router's --engine-kind (a fleet runs one engine kind; /debug/engines names them)."}),
		UnkeyedRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "unkeyed_requests_total",
			Help: "Requests routed by load without router keys, by reason (block_size_unknown: nothing configured, annotated or learned yet; multimodal: media not keyed; pooling: embeddings, scores, rerank, tokenize; responses_previous, responses_items, messages_content: a prompt the router does not reproduce; engine_no_chat_render: the engine kind tokenizes text only)."}, []string{"reason"}),
		DisaggRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "disagg_requests_total",
			Help: "Completions and chat requests on a fleet with prefill and decode replicas, by path and reason: split (a prefill leg, then a decode leg with its kv_transfer_params), decode_only (short_prompt, cached_prefix: fewer uncached tokens than the split threshold), fallback (the prefill leg failed with no retry left, reason the failure kind: sent whole to a decode replica)."}, []string{"path", "reason"}),
		ResponseAffinity: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "response_affinity_total",
			Help: "Stored Responses answers and the requests that name them, by result: recorded (owner learnt), pinned (sent to the engine holding it), found_by_lookup (owner found by asking the engines), not_found and owner_unavailable (answered 404, never sent elsewhere)."}, []string{"result"}),
		ResponseOwnerEvicted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "response_owner_evictions_total",
			Help: "Response-id -> engine entries dropped for the size cap or the TTL (a later request naming one finds its engine by asking the engines)."}),
		EngineHeadersSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "engine_response_headers_seconds",
			Help: "Time from forwarding to the engine's response headers (for a vLLM stream: its acceptance, not its first token; for a non-streamed answer: the whole answer).", Buckets: prometheus.ExponentialBuckets(1e-3, 2.5, 12)}, []string{"engine"}),
		FirstTokenSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "engine_first_token_seconds",
			Help: "Streams: time from forwarding to the first SSE data event carrying a choice.", Buckets: prometheus.ExponentialBuckets(1e-3, 2.5, 12)}, []string{"engine"}),
		EngineErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "engine_stream_errors_total",
			Help: "In-stream error events (data: {\"error\": ...} under status 200) the engines sent, before or after the first token."}, []string{"engine", "when"}),
		RequestSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "request_duration_seconds",
			Help:    "Generation requests from their acceptance to the last byte sent to the client, by outcome (ok, client_error, engine_error, timeout, no_engine, canceled) and stream (true, false).",
			Buckets: RequestBuckets}, []string{"outcome", "stream"}),
		InflightRequests: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "inflight_requests",
			Help: "Requests this router has in flight, by engine and rank."}, []string{"engine", "rank"}),
		ModePromptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "mode_prompt_tokens_total",
			Help: "Prompt tokens of answers with usage, by engine and the chosen replica's scoring mode (exact, predicted, approximate, unkeyed)."},
			[]string{"engine", "mode"}),
		ModePredictedCached: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "mode_predicted_cached_tokens_total",
			Help: "Cached tokens the router predicted, answers with usage, by engine and scoring mode."}, []string{"engine", "mode"}),
		ModeActualCached: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "mode_actual_cached_tokens_total",
			Help: "Cached tokens the engines reported, by engine and the scoring mode of the decision."}, []string{"engine", "mode"}),
	}
	r.MustRegister(m.Requests, m.Errors, m.Retries, m.DecisionSeconds, m.TokenizeSeconds, m.TokenizeFailures,
		m.TokenizeSource, m.EngineAuth, m.EngineScrapes, m.PromptTokens, m.PredictedCached, m.ActualCached, m.UsageMissing, m.ApproxDecisions, m.UnkeyedRequests, m.DisaggRequests, m.ReportModeOverrides, m.EnginesRefused,
		m.ResponseAffinity, m.ResponseOwnerEvicted,
		m.EngineHeadersSeconds, m.FirstTokenSeconds, m.EngineErrors, m.InflightRequests, m.RequestSeconds, m.ModePromptTokens, m.ModePredictedCached, m.ModeActualCached,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Collector())
	if state != nil {
		r.MustRegister(state)
	}
	return m
}

// ForgetEngine deletes every series labelled with the engine (it left the fleet), so a
// router that sees pods come and go does not export their series forever.
func (m *Metrics) ForgetEngine(name string) {
	l := prometheus.Labels{"engine": name}
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{m.Requests, m.Errors, m.Retries,
		m.PromptTokens, m.PredictedCached, m.ActualCached, m.UsageMissing, m.ApproxDecisions, m.EngineHeadersSeconds,
		m.FirstTokenSeconds, m.EngineErrors, m.InflightRequests, m.ModePromptTokens, m.ModePredictedCached,
		m.ModeActualCached, m.EngineScrapes} {
		v.DeletePartialMatch(l)
	}
}

// Handler serves the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// Stream is one event stream's scrape-time state.
type Stream struct {
	Engine string
	Rank   string
	// State is exact, replaying, approximate or inexact.
	State                            string
	LastSeq                          float64
	EventLagSeconds                  float64 // now - last applied event (0 if none)
	BlocksGPU, BlocksCPU, BlocksDisk float64
	Healthy                          bool
	WarmupCredit                     float64
	// Counters holds one value per CounterSpec given to NewStateCollector, in that order.
	Counters []float64
	// Degraded names the degraded reasons in force on the replica.
	Degraded []string
}

// CounterSpec names one per-stream counter: its metric name after the router's namespace and
// its help. The event pipeline keeps the list (kvevents.CounterSpecs), so every counter it has
// is exported without this package naming each one.
type CounterSpec struct {
	Metric, Help string
	Gauge        bool // a level, not a count
}

// StateCollector reads stream, index and engine state at scrape time.
type StateCollector struct {
	Streams      func() []Stream
	IndexKeys    func() float64
	SideLen      func() (predicted, approximate float64)
	Unroutable   func() float64
	streamDesc   map[string]*prometheus.Desc
	counterDescs []*prometheus.Desc
	counterTypes []prometheus.ValueType
	states       *prometheus.Desc
	keys, side   *prometheus.Desc
	unroutable   *prometheus.Desc
	// SideEvicted, when set, reads how many entries each side index (predicted, approximate)
	// dropped because a replica's KV capacity was full.
	SideEvicted func() (predicted, approximate float64)
	sideEvicted *prometheus.Desc

	// DegradedReasons are every degraded reason: replica_degraded is exported 1/0 for each.
	DegradedReasons []string
	degradedDesc    *prometheus.Desc
}

var streamStates = []string{"exact", "replaying", "approximate", "inexact"}

// NewStateCollector returns a collector over the given readers, with one counter per spec on
// every stream; unroutable may be nil.
func NewStateCollector(streams func() []Stream, keys func() float64, side func() (float64, float64),
	unroutable func() float64, counters []CounterSpec) *StateCollector {
	l := []string{"engine", "rank"}
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(ns+"_"+name, help, l, nil) }
	c := &StateCollector{
		Streams: streams, IndexKeys: keys, SideLen: side, Unroutable: unroutable,
		streamDesc: map[string]*prometheus.Desc{
			"last_seq": d("stream_last_seq", "Last applied event sequence number."),
			"lag":      d("event_lag_seconds", "Seconds since the stream's last applied event."),
			"gpu":      d("index_blocks_gpu", "Blocks indexed on GPU."),
			"cpu":      d("index_blocks_cpu", "Blocks indexed on CPU."),
			"disk":     d("index_blocks_disk", "Blocks indexed on disk."),
			"healthy":  d("engine_healthy", "1 when the replica may take traffic."),
			"warmup":   d("warmup_credit", "Current warm-up credit (0..1)."),
		},
		states: prometheus.NewDesc(ns+"_stream_state", "1 for the stream's current state.", []string{"engine", "rank", "state"}, nil),
		keys:   prometheus.NewDesc(ns+"_index_entries", "Distinct router keys in the exact index.", nil, nil),
		side:   prometheus.NewDesc(ns+"_side_index_entries", "Records in the side indexes.", []string{"index"}, nil),
		sideEvicted: prometheus.NewDesc(ns+"_side_index_evicted_total",
			"Side-index entries dropped because the replica's KV capacity (num_gpu_blocks) was full, as the engine evicts.", []string{"index"}, nil),
		unroutable: prometheus.NewDesc(ns+"_events_unroutable_total",
			"Messages on the bound events socket whose topic names no known engine (dropped).", nil, nil),
		degradedDesc: prometheus.NewDesc(ns+"_replica_degraded",
			"1 while the degraded reason is in force on the replica (docs/operations.md lists the triggers).", []string{"engine", "rank", "reason"}, nil),
	}
	for _, cs := range counters {
		c.counterDescs = append(c.counterDescs, d(cs.Metric, cs.Help))
		t := prometheus.CounterValue
		if cs.Gauge {
			t = prometheus.GaugeValue
		}
		c.counterTypes = append(c.counterTypes, t)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.streamDesc {
		ch <- d
	}
	for _, d := range c.counterDescs {
		ch <- d
	}
	ch <- c.unroutable
	ch <- c.degradedDesc
	ch <- c.states
	ch <- c.keys
	ch <- c.side
	ch <- c.sideEvicted
}

// Collect implements prometheus.Collector.
func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	for _, s := range c.Streams() {
		emit := func(k string, t prometheus.ValueType, v float64) {
			ch <- prometheus.MustNewConstMetric(c.streamDesc[k], t, v, s.Engine, s.Rank)
		}
		emit("last_seq", g, s.LastSeq)
		emit("lag", g, s.EventLagSeconds)
		emit("gpu", g, s.BlocksGPU)
		emit("cpu", g, s.BlocksCPU)
		emit("disk", g, s.BlocksDisk)
		emit("healthy", g, b2f(s.Healthy))
		emit("warmup", g, s.WarmupCredit)
		// A replica without an event stream has no counters: its series are absent, not 0.
		for i, v := range s.Counters {
			if i < len(c.counterDescs) {
				ch <- prometheus.MustNewConstMetric(c.counterDescs[i], c.counterTypes[i], v, s.Engine, s.Rank)
			}
		}
		for _, st := range streamStates {
			ch <- prometheus.MustNewConstMetric(c.states, g, b2f(st == s.State), s.Engine, s.Rank, st)
		}
		for _, r := range c.DegradedReasons {
			ch <- prometheus.MustNewConstMetric(c.degradedDesc, g, b2f(slices.Contains(s.Degraded, r)), s.Engine, s.Rank, r)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.keys, g, c.IndexKeys())
	if c.Unroutable != nil {
		ch <- prometheus.MustNewConstMetric(c.unroutable, ctr, c.Unroutable())
	}
	p, a := c.SideLen()
	ch <- prometheus.MustNewConstMetric(c.side, g, p, "predicted")
	ch <- prometheus.MustNewConstMetric(c.side, g, a, "approximate")
	if c.SideEvicted != nil {
		p, a := c.SideEvicted()
		ch <- prometheus.MustNewConstMetric(c.sideEvicted, ctr, p, "predicted")
		ch <- prometheus.MustNewConstMetric(c.sideEvicted, ctr, a, "approximate")
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
