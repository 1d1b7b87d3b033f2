package assess

import (
	"cmp"
	"slices"
	"strconv"
)

// The vLLM series assess reads, as Prometheus exposes them (counters carry _total). Names and
// meanings follow vllm/v1/metrics/loggers.py (PrometheusStatLogger) and vllm/v1/metrics/stats.py.
const (
	// Prompt tokens looked up in the prefix cache, counted once per request when it is first
	// scheduled (PrefixCacheStats.record with preempted=false).
	MetricQueries = "vllm:prefix_cache_queries_total"
	// Of those, tokens found cached.
	MetricHits = "vllm:prefix_cache_hits_total"
	// Preemption events (a request preempted twice counts twice).
	MetricPreemptions = "vllm:num_preemptions_total"
	// Share of KV blocks held by requests (0..1); cached blocks no request holds count as free.
	MetricKVUsage = "vllm:kv_cache_usage_perc"
	// The same gauge under its name before vLLM renamed it; accepted when the new one is absent.
	MetricKVUsageOld = "vllm:gpu_cache_usage_perc"
	MetricRunning    = "vllm:num_requests_running"
	MetricWaiting    = "vllm:num_requests_waiting"
	// Finished requests, one series per finished_reason; summed to count requests per replica.
	MetricRequests = "vllm:request_success_total"
)

// Replica is one engine rank's window: a vLLM data-parallel rank has its own prefix cache, so a
// pod with --data-parallel-size 2 is two replicas (told apart by the "engine" label).
type Replica struct {
	Pod    string `json:"pod"`    // pod name, Prometheus instance, or the engine URL's host:port
	Engine string `json:"engine"` // vLLM's "engine" label: the DP rank
	Model  string `json:"model,omitempty"`

	// Increases over the window, in tokens (vLLM counts the prefix cache in tokens).
	QueryTokens float64 `json:"query_tokens"`
	HitTokens   float64 `json:"hit_tokens"`

	// Optional series: nil when the engine does not export them.
	Preemptions *float64 `json:"preemptions"`
	Requests    *float64 `json:"requests"`
	KVUsageMean *float64 `json:"kv_usage_mean"`
	KVUsageMax  *float64 `json:"kv_usage_max"`
	RunningMean *float64 `json:"running_mean"`
	WaitingMean *float64 `json:"waiting_mean"`
}

// ID names the replica in output: the pod, and the rank when the pod has more than rank 0.
func (r Replica) ID() string {
	if r.Engine == "" {
		return r.Pod
	}
	return r.Pod + "/" + r.Engine
}

// Snapshot is what a collector saw: plain numbers, no judgement.
type Snapshot struct {
	Source        string    `json:"source"`         // "prometheus URL" or "engines"
	Model         string    `json:"model"`          // the served model the replicas belong to
	WindowSeconds float64   `json:"window_seconds"` // the span the increases cover
	Replicas      []Replica `json:"replicas"`
	Notes         []string  `json:"notes,omitempty"` // how it was collected: fallbacks, resets, gaps
}

// sortReplicas orders by pod, then rank numerically, so output is stable across runs.
func sortReplicas(rs []Replica) {
	slices.SortFunc(rs, func(a, b Replica) int {
		if c := cmp.Compare(a.Pod, b.Pod); c != 0 {
			return c
		}
		ai, errA := strconv.Atoi(a.Engine)
		bi, errB := strconv.Atoi(b.Engine)
		if errA == nil && errB == nil {
			return cmp.Compare(ai, bi)
		}
		return cmp.Compare(a.Engine, b.Engine)
	})
}

func ptr(v float64) *float64 { return &v }
