package render

// vllmFlags are the options of `vllm serve` for the release VLLMFlagsTag names, as argparse
// registers them: make_arg_parser and FrontendArgs (vllm/entrypoints/openai/cli_args.py),
// EngineArgs.add_cli_args and AsyncEngineArgs.add_cli_args (vllm/engine/arg_utils.py). Long
// names are written with dashes; vLLM's parser also takes them with underscores, as
// --name=value and, for JSON-valued ones, as --name.key value.
//
// Read from vllm-project/vllm: arg_utils.py at commit 99d7eb5d6a51 and cli_args.py at commit
// 789340fbad95, plus the options a later arg_utils.py snapshot adds (the "later snapshot"
// group below: attention, offloading, observability and parallel options; its commit was not
// recorded by the source index, and its fork-only groups, AFD and fault tolerance, are left
// out). The index held no tree tagged v0.26.0 or later, so the list is the union of what those
// snapshots register: an option removed since is not flagged (vLLM refuses it at start), and
// one added since is reported as unknown by CheckEngineArgs, a warning, never a refusal.
// Re-read both files at the tag whenever TestedVLLMReleases[0] moves; a test fails until
// VLLMFlagsTag follows.
const VLLMFlagsTag = "v0.26.0"

// vllmFlags: name -> whether argparse also registers --no-<name> (BooleanOptionalAction).
var vllmFlags = map[string]bool{
	// make_arg_parser
	"headless": false, "api-server-count": false, "config": false,

	// FrontendArgs
	"host": false, "port": false, "uds": false, "uvicorn-log-level": false,
	"disable-uvicorn-access-log": true, "allow-credentials": true, "allowed-origins": false,
	"allowed-methods": false, "allowed-headers": false, "api-key": false, "lora-modules": false,
	"chat-template": false, "chat-template-content-format": false,
	"trust-request-chat-template": true, "response-role": false, "ssl-keyfile": false,
	"ssl-certfile": false, "ssl-ca-certs": false, "enable-ssl-refresh": true,
	"ssl-cert-reqs": false, "root-path": false, "middleware": false,
	"return-tokens-as-token-ids": true, "disable-frontend-multiprocessing": true,
	"enable-request-id-headers": true, "enable-auto-tool-choice": true,
	"exclude-tools-when-tool-choice-none": true, "tool-call-parser": false,
	"tool-parser-plugin": false, "tool-server": false, "log-config-file": false,
	"max-log-len": false, "disable-fastapi-docs": true, "enable-prompt-tokens-details": true,
	"enable-server-load-tracking": true, "enable-force-include-usage": true,
	"enable-tokenizer-info-endpoint": true, "enable-log-outputs": true,
	"h11-max-incomplete-event-size": false, "h11-max-header-count": false,
	"log-error-stack": true, "tokens-only": true,

	// ModelConfig
	"model": false, "runner": false, "convert": false, "task": false, "tokenizer": false,
	"tokenizer-mode": false, "trust-remote-code": true, "dtype": false, "seed": false,
	"hf-config-path": false, "allowed-local-media-path": false, "allowed-media-domains": false,
	"revision": false, "code-revision": false, "rope-scaling": false, "rope-theta": false,
	"tokenizer-revision": false, "max-model-len": false, "quantization": false,
	"enforce-eager": true, "max-logprobs": false, "logprobs-mode": false,
	"disable-sliding-window": true, "disable-cascade-attn": true, "skip-tokenizer-init": true,
	"enable-prompt-embeds": true, "served-model-name": false, "config-format": false,
	"hf-token": false, "hf-overrides": false, "pooler-config": false,
	"override-pooler-config": false, "logits-processor-pattern": false,
	"generation-config": false, "override-generation-config": false,
	"enable-sleep-mode": true, "model-impl": false, "override-attention-dtype": false,
	"logits-processors": false, "io-processor-plugin": false,

	// LoadConfig
	"load-format": false, "download-dir": false, "safetensors-load-strategy": false,
	"model-loader-extra-config": false, "ignore-patterns": false, "use-tqdm-on-load": true,
	"pt-load-map-location": false,

	// StructuredOutputsConfig (and its deprecated guided-decoding spellings)
	"reasoning-parser": false, "guided-decoding-backend": false,
	"guided-decoding-disable-fallback": false, "guided-decoding-disable-any-whitespace": false,
	"guided-decoding-disable-additional-properties": false,

	// ParallelConfig
	"distributed-executor-backend": false, "pipeline-parallel-size": false,
	"tensor-parallel-size": false, "decode-context-parallel-size": false,
	"data-parallel-size": false, "data-parallel-rank": false, "data-parallel-start-rank": false,
	"data-parallel-size-local": false, "data-parallel-address": false,
	"data-parallel-rpc-port": false, "data-parallel-backend": false,
	"data-parallel-hybrid-lb": true, "enable-expert-parallel": true, "all2all-backend": false,
	"enable-dbo": true, "dbo-decode-token-threshold": false, "dbo-prefill-token-threshold": false,
	"disable-nccl-for-dp-synchronization": true, "enable-eplb": true, "eplb-config": false,
	"expert-placement-strategy": false, "num-redundant-experts": false,
	"eplb-window-size": false, "eplb-step-interval": false, "eplb-log-balancedness": true,
	"max-parallel-loading-workers": false, "ray-workers-use-nsight": true,
	"disable-custom-all-reduce": true, "worker-cls": false, "worker-extension-cls": false,
	"enable-multimodal-encoder-data-parallel": false,

	// CacheConfig
	"block-size": false, "gpu-memory-utilization": false, "kv-cache-memory-bytes": false,
	"swap-space": false, "kv-cache-dtype": false, "num-gpu-blocks-override": false,
	"enable-prefix-caching": true, "prefix-caching-hash-algo": false, "cpu-offload-gb": false,
	"calculate-kv-scales": true, "kv-sharing-fast-prefill": true, "mamba-cache-dtype": false,
	"mamba-ssm-cache-dtype": false, "mamba-block-size": false,

	// MultiModalConfig
	"limit-mm-per-prompt": false, "enable-mm-embeds": true, "media-io-kwargs": false,
	"mm-processor-kwargs": false, "mm-processor-cache-gb": false,
	"disable-mm-preprocessor-cache": false, "mm-processor-cache-type": false,
	"mm-shm-cache-max-object-size-mb": false, "mm-encoder-tp-mode": false,
	"mm-encoder-attn-backend": false, "interleave-mm-strings": true, "skip-mm-profiling": true,
	"video-pruning-rate": false,

	// LoRAConfig
	"enable-lora": true, "max-loras": false, "max-lora-rank": false,
	"lora-extra-vocab-size": false, "lora-dtype": false, "max-cpu-loras": false,
	"fully-sharded-loras": true, "default-mm-loras": false,

	// ObservabilityConfig
	"show-hidden-metrics-for-version": false, "otlp-traces-endpoint": false,
	"collect-detailed-traces": false,

	// SchedulerConfig
	"max-num-batched-tokens": false, "max-num-seqs": false, "max-num-partial-prefills": false,
	"max-long-partial-prefills": false, "long-prefill-token-threshold": false,
	"num-lookahead-slots": false, "scheduling-policy": false, "enable-chunked-prefill": true,
	"disable-chunked-mm-input": true, "scheduler-cls": false,
	"disable-hybrid-kv-cache-manager": true, "async-scheduling": true,

	// CompilationConfig
	"cudagraph-capture-sizes": false, "cuda-graph-sizes": false,
	"max-cudagraph-capture-size": false,

	// VllmConfig
	"speculative-config": false, "kv-transfer-config": false, "kv-events-config": false,
	"compilation-config": false, "additional-config": false,
	"structured-outputs-config": false,

	// Other engine and AsyncEngineArgs options
	"disable-log-stats": false, "aggregate-engine-logging": false,
	"enable-log-requests": true, "disable-log-requests": true,

	// The later snapshot's additions
	"allow-deprecated-quantization": true, "enable-return-routed-experts": true,
	"attention-backend": false, "reasoning-parser-plugin": false, "master-addr": false,
	"master-port": false, "nnodes": false, "node-rank": false,
	"dcp-kv-cache-interleave-size": false, "cp-kv-cache-interleave-size": false,
	"prefill-context-parallel-size": false, "data-parallel-external-lb": true,
	"ubatch-size": false, "mamba-cache-mode": false, "kv-offloading-size": false,
	"kv-offloading-backend": false, "mm-encoder-only": true,
	"enable-tower-connector-lora": true, "specialize-active-lora": true,
	"kv-cache-metrics": true, "kv-cache-metrics-sample": false, "cudagraph-metrics": true,
	"enable-layerwise-nvtx-tracing": true, "enable-mfu-metrics": true,
	"enable-logging-iteration-details": true, "stream-interval": false,
	"ec-transfer-config": false, "attention-config": false, "profiler-config": false,
	"optimization-level": false, "weight-transfer-config": false,
}

// vllmShortFlags are the single-dash aliases, each with its long name.
var vllmShortFlags = map[string]string{
	"-asc": "api-server-count", "-q": "quantization", "-pp": "pipeline-parallel-size",
	"-tp": "tensor-parallel-size", "-dcp": "decode-context-parallel-size",
	"-dp": "data-parallel-size", "-dpn": "data-parallel-rank", "-dpr": "data-parallel-start-rank",
	"-dpl": "data-parallel-size-local", "-dpa": "data-parallel-address",
	"-dpp": "data-parallel-rpc-port", "-dpb": "data-parallel-backend", "-O": "compilation-config",
	// The later snapshot's
	"-n": "nnodes", "-r": "node-rank", "-pcp": "prefill-context-parallel-size",
	"-dph": "data-parallel-hybrid-lb", "-dpe": "data-parallel-external-lb",
	"-ep": "enable-expert-parallel", "-cc": "compilation-config", "-ac": "attention-config",
}

var vllmFlagTable = newFlagTable(flagTable{
	of: "`vllm serve` of vLLM " + VLLMFlagsTag, long: vllmFlags, short: vllmShortFlags,
	shortPrefixes: []string{"-O"}, underscores: true, dots: true,
})
