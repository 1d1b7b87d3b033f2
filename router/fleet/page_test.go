package fleet

import (
	"fmt"
	"strings"
)

// vllmPage renders a /metrics page shaped like vLLM v1's (vllm/v1/metrics/loggers.py,
// PrometheusStatLogger): the Python process collectors, per-engine gauges and counters labelled
// model_name and engine, and its histograms with their bucket boundaries, for ranks DP ranks.
// deprecated writes vllm:gpu_cache_usage_perc instead of vllm:kv_cache_usage_perc.
func vllmPage(ranks, waiting, running int, usage float64, deprecated bool) string {
	var b strings.Builder
	for _, m := range []string{"python_gc_objects_collected_total{generation=\"0\"} 12345.0",
		"python_gc_objects_collected_total{generation=\"1\"} 2345.0", "python_gc_objects_collected_total{generation=\"2\"} 345.0",
		"python_info{implementation=\"CPython\",major=\"3\",minor=\"12\",patchlevel=\"8\",version=\"3.12.8\"} 1.0",
		"process_virtual_memory_bytes 3.2e+10", "process_resident_memory_bytes 2.1e+09", "process_start_time_seconds 1.7e+09",
		"process_cpu_seconds_total 1234.5", "process_open_fds 87.0", "process_max_fds 1.048576e+06"} {
		fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s gauge\n%s\n", strings.Fields(m)[0], strings.Fields(m)[0], m)
	}
	const model = `model_name="meta-llama/Llama-3.1-8B-Instruct"`
	fmt.Fprintf(&b, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
	fmt.Fprintf(&b, "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",calculate_kv_scales=\"False\",cpu_offload_gb=\"0\",enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"27450\",prefix_caching_hash_algo=\"sha256\",swap_space=\"4\"} 1.0\n")
	usageName := "vllm:kv_cache_usage_perc"
	if deprecated {
		usageName = "vllm:gpu_cache_usage_perc"
	}
	gauges := []struct {
		name string
		v    func(r int) float64
	}{
		{"vllm:num_requests_running", func(r int) float64 { return float64(running + r) }},
		{"vllm:num_requests_waiting", func(r int) float64 { return float64(waiting + r) }},
		{usageName, func(r int) float64 { return usage }},
	}
	for _, g := range gauges {
		fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s gauge\n", g.name, g.name)
		for r := range ranks {
			fmt.Fprintf(&b, "%s{engine=\"%d\",%s} %g\n", g.name, r, model, g.v(r))
		}
	}
	fmt.Fprintf(&b, "# HELP vllm:num_requests_waiting_by_reason x\n# TYPE vllm:num_requests_waiting_by_reason gauge\n")
	for r := range ranks {
		fmt.Fprintf(&b, "vllm:num_requests_waiting_by_reason{engine=\"%d\",%s,reason=\"capacity\"} 99.0\n", r, model)
	}
	for _, c := range []string{"vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"} {
		fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s counter\n", c, c)
		for r := range ranks {
			fmt.Fprintf(&b, "%s{engine=\"%d\",%s} 1.23456789e+08\n", c, r, model)
		}
	}
	fmt.Fprintf(&b, "# HELP vllm:request_success_total x\n# TYPE vllm:request_success_total counter\n")
	for r := range ranks {
		for _, why := range []string{"stop", "length", "abort"} {
			fmt.Fprintf(&b, "vllm:request_success_total{engine=\"%d\",finished_reason=\"%s\",%s} 4242.0\n", r, why, model)
		}
	}
	seconds := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	tokens := []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}
	for _, h := range []struct {
		name    string
		buckets []float64
	}{
		{"vllm:time_to_first_token_seconds", seconds}, {"vllm:inter_token_latency_seconds", seconds},
		{"vllm:e2e_request_latency_seconds", seconds}, {"vllm:request_queue_time_seconds", seconds},
		{"vllm:request_inference_time_seconds", seconds}, {"vllm:request_prefill_time_seconds", seconds},
		{"vllm:request_decode_time_seconds", seconds}, {"vllm:request_prompt_tokens", tokens},
		{"vllm:request_generation_tokens", tokens}, {"vllm:iteration_tokens_total", tokens},
		{"vllm:request_max_num_generation_tokens", tokens}, {"vllm:request_params_max_tokens", tokens},
		{"vllm:request_params_n", []float64{1, 2, 5, 10, 20}},
	} {
		fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s histogram\n", h.name, h.name)
		for r := range ranks {
			for i, le := range h.buckets {
				fmt.Fprintf(&b, "%s_bucket{engine=\"%d\",le=\"%g\",%s} %d.0\n", h.name, r, le, model, 100*i)
			}
			fmt.Fprintf(&b, "%s_bucket{engine=\"%d\",le=\"+Inf\",%s} 4242.0\n", h.name, r, model)
			fmt.Fprintf(&b, "%s_count{engine=\"%d\",%s} 4242.0\n", h.name, r, model)
			fmt.Fprintf(&b, "%s_sum{engine=\"%d\",%s} 12345.678\n", h.name, r, model)
		}
	}
	return b.String()
}
