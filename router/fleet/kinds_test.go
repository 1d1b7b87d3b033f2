package fleet

import (
	"testing"

	"github.com/kvroute/kvroute/router/engine"
)

// Each engine's own /metrics names in the one reader: SGLang's gauges per dp_rank and its page
// size, TensorRT-LLM's KV-cache utilization; another engine's names on the page are not read.
func TestParseForEngineKinds(t *testing.T) {
	sgl := []byte(`# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
sglang:num_queue_reqs{model_name="m",dp_rank="0"} 3.0
sglang:num_queue_reqs{model_name="m",dp_rank="1"} 1.0
sglang:num_running_reqs{model_name="m",dp_rank="1"} 7.0
sglang:token_usage{model_name="m",dp_rank="1"} 0.25
sglang:cache_config_info{page_size="16",num_pages="4096"} 1.0
vllm:num_requests_waiting{engine="0"} 99
`)
	s, err := ParseFor(engine.SGLang, sgl)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Ranks) != 2 || s.Ranks[0].Waiting != 3 || s.Ranks[1].Running != 7 || s.Ranks[1].KVUsage != 0.25 || s.BlockSize != 16 || s.GPUBlocks != 4096 {
		t.Errorf("SGLang sample %+v", s)
	}
	trt := []byte("trtllm_kv_cache_utilization{model_name=\"m\"} 0.5\nsglang:num_queue_reqs 4\n")
	s, err = ParseFor(engine.TRTLLM, trt)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Ranks) != 1 || s.Ranks[0].KVUsage != 0.5 || s.Ranks[0].Waiting != 0 {
		t.Errorf("TensorRT-LLM sample %+v", s)
	}
	if s, _ := Parse(sgl); s.Ranks[0].Waiting != 99 || len(s.Ranks) != 1 {
		t.Errorf("vLLM's reader read %+v from a mixed page, want only vllm:num_requests_waiting", s)
	}
}
