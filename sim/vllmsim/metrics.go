package vllmsim

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// ttftBuckets are vLLM's buckets for vllm:time_to_first_token_seconds.
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
	1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

var (
	descRunning = prometheus.NewDesc("vllm:num_requests_running",
		"Number of requests in model execution batches.", []string{"model_name", "engine"}, nil)
	descWaiting = prometheus.NewDesc("vllm:num_requests_waiting",
		"Number of requests waiting to be processed.", []string{"model_name", "engine"}, nil)
	// vllm/v1/metrics/loggers.py: "capacity" counts the waiting queue (requests waiting for KV
	// blocks or a seat), "deferred" the skipped-waiting queue (LoRA budget, KV transfer, blocked
	// status); the sim defers nothing, so "deferred" stays 0.
	descWaitingByReason = prometheus.NewDesc("vllm:num_requests_waiting_by_reason",
		"Number of requests waiting to be processed, by reason.", []string{"model_name", "engine", "reason"}, nil)
	descUsage = prometheus.NewDesc("vllm:kv_cache_usage_perc",
		"KV-cache usage. 1 means 100 percent usage.", []string{"model_name", "engine"}, nil)
	descQueries = prometheus.NewDesc("vllm:prefix_cache_queries_total",
		"Prefix cache queries, in terms of number of queried tokens.", []string{"model_name", "engine"}, nil)
	descHits = prometheus.NewDesc("vllm:prefix_cache_hits_total",
		"Prefix cache hits, in terms of number of cached tokens.", []string{"model_name", "engine"}, nil)
	descPrompt = prometheus.NewDesc("vllm:prompt_tokens_total",
		"Number of prefill tokens processed.", []string{"model_name", "engine"}, nil)
	descGen = prometheus.NewDesc("vllm:generation_tokens_total",
		"Number of generation tokens processed.", []string{"model_name", "engine"}, nil)
	descPreempt = prometheus.NewDesc("vllm:num_preemptions_total",
		"Cumulative number of preemption from the engine.", []string{"model_name", "engine"}, nil)
	descSuccess = prometheus.NewDesc("vllm:request_success_total",
		"Count of successfully processed requests.", []string{"model_name", "engine", "finished_reason"}, nil)
	// vllm/v1/metrics/loggers.py (PrometheusStatLogger): one series per sleep_state, on every engine.
	descSleepState = prometheus.NewDesc("vllm:engine_sleep_state",
		"Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "+
			"weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
		[]string{"model_name", "engine", "sleep_state"}, nil)
	descCacheConfig = prometheus.NewDesc("vllm:cache_config_info",
		"Information of the LLMEngine CacheConfig",
		[]string{"block_size", "cache_dtype", "enable_prefix_caching", "num_gpu_blocks",
			"prefix_caching_hash_algo", "engine"}, nil)
)

// rankMetrics is one rank's view for /metrics: a snapshot the scheduler refreshes under the
// rank's lock, plus the TTFT histogram it observes into.
type rankMetrics struct {
	model, engine string
	vec           *prometheus.HistogramVec
	ttft          prometheus.Observer

	mu      sync.Mutex
	running int
	waiting int
	usage   float64
	stats   rankStats
}

func (m *rankMetrics) set(running, waiting int, usage float64, st rankStats) {
	m.mu.Lock()
	m.running, m.waiting, m.usage, m.stats = running, waiting, usage, st
	m.mu.Unlock()
}

// reset forgets the TTFT observations (a restarted process starts its histograms empty).
func (m *rankMetrics) reset() {
	m.vec.DeleteLabelValues(m.model, m.engine)
	m.ttft = m.vec.WithLabelValues(m.model, m.engine)
}

// simMetrics exports every rank's snapshot; it lives in the sim's own registry.
type simMetrics struct {
	cfg   *Config
	ranks []*rankMetrics
	vec   *prometheus.HistogramVec
	sleep *sleepState
}

func newSimMetrics(cfg *Config, reg *prometheus.Registry, sleep *sleepState) *simMetrics {
	m := &simMetrics{cfg: cfg, sleep: sleep, vec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vllm:time_to_first_token_seconds",
		Help:    "Histogram of time to first token in seconds.",
		Buckets: ttftBuckets,
	}, []string{"model_name", "engine"})}
	for i := range cfg.DataParallelSize {
		rm := &rankMetrics{model: cfg.Model, engine: strconv.Itoa(i), vec: m.vec}
		rm.ttft = m.vec.WithLabelValues(rm.model, rm.engine)
		m.ranks = append(m.ranks, rm)
	}
	reg.MustRegister(m, m.vec)
	return m
}

func (m *simMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRunning, descWaiting, descWaitingByReason, descUsage, descQueries, descHits,
		descPrompt, descGen, descPreempt, descSuccess, descSleepState, descCacheConfig} {
		ch <- d
	}
}

func (m *simMetrics) Collect(ch chan<- prometheus.Metric) {
	g, c := prometheus.GaugeValue, prometheus.CounterValue
	awake, offloaded, discarded := m.sleep.sleepGauge().values()
	for _, rm := range m.ranks {
		rm.mu.Lock()
		l := []string{rm.model, rm.engine}
		ch <- prometheus.MustNewConstMetric(descRunning, g, float64(rm.running), l...)
		ch <- prometheus.MustNewConstMetric(descWaiting, g, float64(rm.waiting), l...)
		ch <- prometheus.MustNewConstMetric(descWaitingByReason, g, float64(rm.waiting), rm.model, rm.engine, "capacity")
		ch <- prometheus.MustNewConstMetric(descWaitingByReason, g, 0, rm.model, rm.engine, "deferred")
		ch <- prometheus.MustNewConstMetric(descUsage, g, rm.usage, l...)
		ch <- prometheus.MustNewConstMetric(descQueries, c, float64(rm.stats.prefixQueries), l...)
		ch <- prometheus.MustNewConstMetric(descHits, c, float64(rm.stats.prefixHits), l...)
		ch <- prometheus.MustNewConstMetric(descPrompt, c, float64(rm.stats.promptTokens), l...)
		ch <- prometheus.MustNewConstMetric(descGen, c, float64(rm.stats.genTokens), l...)
		ch <- prometheus.MustNewConstMetric(descPreempt, c, float64(rm.stats.preemptions), l...)
		ch <- prometheus.MustNewConstMetric(descSuccess, c, float64(rm.stats.finished), rm.model, rm.engine, "length")
		rm.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(descSleepState, g, awake, rm.model, rm.engine, "awake")
		ch <- prometheus.MustNewConstMetric(descSleepState, g, offloaded, rm.model, rm.engine, "weights_offloaded")
		ch <- prometheus.MustNewConstMetric(descSleepState, g, discarded, rm.model, rm.engine, "discard_all")
		ch <- prometheus.MustNewConstMetric(descCacheConfig, g, 1, strconv.Itoa(m.cfg.BlockSize), "auto",
			"True", strconv.Itoa(m.cfg.NumGPUBlocks), m.cfg.HashAlgo, rm.engine)
	}
}
