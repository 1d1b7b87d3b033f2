package vllmcli

import "strings"

// arity is how many values a flag takes, as vLLM's argparse declares it.
type arity int

const (
	// boolOpt is argparse's BooleanOptionalAction: --x sets, --no-x clears, no value.
	boolOpt arity = iota
	// storeTrue is --x alone.
	storeTrue
	// one value: --x V or --x=V.
	one
	// list is nargs="+": one value or more, up to the next option.
	list
	// optional is nargs="?": a value when the next argument is not an option.
	optional
)

// use is what vllm-sim does with a flag.
type use int

const (
	ignored     use = iota // accepted; changes nothing the simulator models (GPU, kernels, loading, logging)
	mapped                 // sets the simulator's configuration (serve.go)
	unsupported            // a vLLM flag whose effect the simulator cannot give; refused rather than faked
)

type flagSpec struct {
	name    string // long name with dashes, without "--"
	aliases []string
	arity   arity
	use     use
}

// vllmFlags are the flags of `vllm serve`: FrontendArgs (vllm/entrypoints/openai/cli_args.py),
// make_arg_parser's own, EngineArgs and AsyncEngineArgs (vllm/engine/arg_utils.py). The names
// and arities follow vLLM's argparse declarations (a dataclass bool field is a
// BooleanOptionalAction, a list field nargs="+"); the table is kvroute's own.
var vllmFlags = []flagSpec{
	// make_arg_parser
	{name: "headless", arity: storeTrue, use: unsupported},
	{name: "api-server-count", aliases: []string{"asc"}, arity: one},
	{name: "config", arity: one, use: unsupported},

	// FrontendArgs
	{name: "host", arity: one, use: mapped},
	{name: "port", arity: one, use: mapped},
	{name: "uds", arity: one, use: unsupported},
	{name: "uvicorn-log-level", arity: one},
	{name: "disable-uvicorn-access-log", arity: boolOpt},
	{name: "allow-credentials", arity: boolOpt},
	{name: "allowed-origins", arity: one},
	{name: "allowed-methods", arity: one},
	{name: "allowed-headers", arity: one},
	{name: "api-key", arity: list, use: mapped},
	{name: "lora-modules", arity: list, use: mapped},
	{name: "chat-template", arity: one},
	{name: "chat-template-content-format", arity: one},
	{name: "trust-request-chat-template", arity: boolOpt},
	{name: "response-role", arity: one},
	{name: "ssl-keyfile", arity: one, use: unsupported},
	{name: "ssl-certfile", arity: one, use: unsupported},
	{name: "ssl-ca-certs", arity: one, use: unsupported},
	{name: "enable-ssl-refresh", arity: boolOpt},
	{name: "ssl-cert-reqs", arity: one},
	{name: "root-path", arity: one},
	{name: "middleware", arity: one},
	{name: "return-tokens-as-token-ids", arity: boolOpt},
	{name: "disable-frontend-multiprocessing", arity: boolOpt},
	{name: "enable-request-id-headers", arity: boolOpt},
	{name: "enable-auto-tool-choice", arity: boolOpt},
	{name: "exclude-tools-when-tool-choice-none", arity: boolOpt},
	{name: "tool-call-parser", arity: one},
	{name: "tool-parser-plugin", arity: one},
	{name: "tool-server", arity: one},
	{name: "log-config-file", arity: one},
	{name: "max-log-len", arity: one},
	{name: "disable-fastapi-docs", arity: boolOpt},
	{name: "enable-prompt-tokens-details", arity: boolOpt, use: mapped},
	{name: "enable-server-load-tracking", arity: boolOpt},
	{name: "enable-force-include-usage", arity: boolOpt},
	{name: "enable-tokenizer-info-endpoint", arity: boolOpt},
	{name: "enable-log-outputs", arity: boolOpt},
	{name: "h11-max-incomplete-event-size", arity: one},
	{name: "h11-max-header-count", arity: one},
	{name: "log-error-stack", arity: boolOpt},
	{name: "tokens-only", arity: boolOpt, use: unsupported},
	{name: "sse-keep-alive-interval", arity: one, use: mapped},

	// EngineArgs: ModelConfig
	{name: "model", arity: one, use: mapped},
	{name: "runner", arity: one},
	{name: "convert", arity: one},
	{name: "task", arity: one},
	{name: "tokenizer", arity: one},
	{name: "tokenizer-mode", arity: one},
	{name: "trust-remote-code", arity: boolOpt},
	{name: "dtype", arity: one},
	{name: "seed", arity: one},
	{name: "hf-config-path", arity: one},
	{name: "allowed-local-media-path", arity: one},
	{name: "allowed-media-domains", arity: list},
	{name: "revision", arity: one},
	{name: "code-revision", arity: one},
	{name: "rope-scaling", arity: one},
	{name: "rope-theta", arity: one},
	{name: "tokenizer-revision", arity: one},
	{name: "max-model-len", arity: one, use: mapped},
	{name: "quantization", aliases: []string{"q"}, arity: one},
	{name: "enforce-eager", arity: boolOpt},
	{name: "max-logprobs", arity: one},
	{name: "logprobs-mode", arity: one},
	{name: "disable-sliding-window", arity: boolOpt},
	{name: "disable-cascade-attn", arity: boolOpt},
	{name: "skip-tokenizer-init", arity: boolOpt},
	{name: "enable-prompt-embeds", arity: boolOpt},
	{name: "served-model-name", arity: list, use: mapped},
	{name: "config-format", arity: one},
	{name: "hf-token", arity: optional},
	{name: "hf-overrides", arity: one},
	{name: "pooler-config", arity: one},
	{name: "override-pooler-config", arity: one},
	{name: "logits-processor-pattern", arity: one},
	{name: "generation-config", arity: one},
	{name: "override-generation-config", arity: one},
	{name: "enable-sleep-mode", arity: boolOpt},
	{name: "model-impl", arity: one},
	{name: "override-attention-dtype", arity: one},
	{name: "logits-processors", arity: list},
	{name: "io-processor-plugin", arity: one},

	// LoadConfig
	{name: "load-format", arity: one},
	{name: "download-dir", arity: one},
	{name: "safetensors-load-strategy", arity: one},
	{name: "model-loader-extra-config", arity: one},
	{name: "ignore-patterns", arity: list},
	{name: "use-tqdm-on-load", arity: boolOpt},
	{name: "pt-load-map-location", arity: one},

	// StructuredOutputsConfig (the guided-decoding ones are deprecated, typed bool with a value)
	{name: "reasoning-parser", arity: one},
	{name: "guided-decoding-backend", arity: one},
	{name: "guided-decoding-disable-fallback", arity: one},
	{name: "guided-decoding-disable-any-whitespace", arity: one},
	{name: "guided-decoding-disable-additional-properties", arity: one},

	// ParallelConfig
	{name: "distributed-executor-backend", arity: one},
	{name: "pipeline-parallel-size", aliases: []string{"pp"}, arity: one},
	{name: "tensor-parallel-size", aliases: []string{"tp"}, arity: one},
	{name: "decode-context-parallel-size", aliases: []string{"dcp"}, arity: one},
	{name: "data-parallel-size", aliases: []string{"dp"}, arity: one, use: mapped},
	// Multi-node data parallelism: which ranks this process runs and where the others are.
	{name: "data-parallel-rank", aliases: []string{"dpn"}, arity: one, use: unsupported},
	{name: "data-parallel-start-rank", aliases: []string{"dpr"}, arity: one, use: unsupported},
	{name: "data-parallel-size-local", aliases: []string{"dpl"}, arity: one, use: unsupported},
	{name: "data-parallel-address", aliases: []string{"dpa"}, arity: one, use: unsupported},
	{name: "data-parallel-rpc-port", aliases: []string{"dpp"}, arity: one, use: unsupported},
	{name: "data-parallel-backend", aliases: []string{"dpb"}, arity: one},
	{name: "data-parallel-hybrid-lb", arity: boolOpt, use: unsupported},
	{name: "enable-expert-parallel", arity: boolOpt},
	{name: "all2all-backend", arity: one},
	{name: "enable-dbo", arity: boolOpt},
	{name: "dbo-decode-token-threshold", arity: one},
	{name: "dbo-prefill-token-threshold", arity: one},
	{name: "disable-nccl-for-dp-synchronization", arity: boolOpt},
	{name: "enable-eplb", arity: boolOpt},
	{name: "eplb-config", arity: one},
	{name: "expert-placement-strategy", arity: one},
	{name: "num-redundant-experts", arity: one},
	{name: "eplb-window-size", arity: one},
	{name: "eplb-step-interval", arity: one},
	{name: "eplb-log-balancedness", arity: boolOpt},
	{name: "max-parallel-loading-workers", arity: one},
	{name: "ray-workers-use-nsight", arity: boolOpt},
	{name: "disable-custom-all-reduce", arity: boolOpt},
	{name: "worker-cls", arity: one},
	{name: "worker-extension-cls", arity: one},
	{name: "enable-multimodal-encoder-data-parallel", arity: storeTrue},

	// CacheConfig
	{name: "block-size", arity: one, use: mapped},
	{name: "gpu-memory-utilization", arity: one},
	{name: "kv-cache-memory-bytes", arity: one},
	{name: "swap-space", arity: one},
	{name: "kv-cache-dtype", arity: one},
	{name: "num-gpu-blocks-override", arity: one, use: mapped},
	{name: "enable-prefix-caching", arity: boolOpt, use: mapped},
	{name: "prefix-caching-hash-algo", arity: one, use: mapped},
	{name: "cpu-offload-gb", arity: one},
	{name: "calculate-kv-scales", arity: boolOpt},
	{name: "kv-sharing-fast-prefill", arity: boolOpt},
	{name: "mamba-cache-dtype", arity: one},
	{name: "mamba-ssm-cache-dtype", arity: one},
	{name: "mamba-block-size", arity: one},

	// MultiModalConfig
	{name: "limit-mm-per-prompt", arity: one},
	{name: "enable-mm-embeds", arity: boolOpt},
	{name: "media-io-kwargs", arity: one},
	{name: "mm-processor-kwargs", arity: one},
	{name: "mm-processor-cache-gb", arity: one},
	{name: "disable-mm-preprocessor-cache", arity: storeTrue},
	{name: "mm-processor-cache-type", arity: one},
	{name: "mm-shm-cache-max-object-size-mb", arity: one},
	{name: "mm-encoder-tp-mode", arity: one},
	{name: "mm-encoder-attn-backend", arity: one},
	{name: "interleave-mm-strings", arity: boolOpt},
	{name: "skip-mm-profiling", arity: boolOpt},
	{name: "video-pruning-rate", arity: one},

	// LoRAConfig
	{name: "enable-lora", arity: boolOpt, use: mapped},
	{name: "max-loras", arity: one},
	{name: "max-lora-rank", arity: one},
	{name: "lora-extra-vocab-size", arity: one},
	{name: "lora-dtype", arity: one},
	{name: "max-cpu-loras", arity: one},
	{name: "fully-sharded-loras", arity: boolOpt},
	{name: "default-mm-loras", arity: one},

	// ObservabilityConfig
	{name: "show-hidden-metrics-for-version", arity: one},
	{name: "otlp-traces-endpoint", arity: one},
	{name: "collect-detailed-traces", arity: list},

	// SchedulerConfig
	{name: "max-num-batched-tokens", arity: one, use: mapped},
	{name: "max-num-seqs", arity: one, use: mapped},
	{name: "max-num-partial-prefills", arity: one},
	{name: "max-long-partial-prefills", arity: one},
	{name: "long-prefill-token-threshold", arity: one},
	{name: "num-lookahead-slots", arity: one},
	{name: "scheduling-policy", arity: one},
	{name: "enable-chunked-prefill", arity: boolOpt},
	{name: "disable-chunked-mm-input", arity: boolOpt},
	{name: "scheduler-cls", arity: one},
	{name: "disable-hybrid-kv-cache-manager", arity: boolOpt},
	{name: "async-scheduling", arity: boolOpt},

	// CompilationConfig
	{name: "cudagraph-capture-sizes", arity: list},
	{name: "cuda-graph-sizes", arity: list},
	{name: "max-cudagraph-capture-size", arity: one},
	{name: "optimization-level", arity: one},

	// VllmConfig
	{name: "speculative-config", arity: one},
	{name: "kv-transfer-config", arity: one, use: mapped},
	{name: "kv-events-config", arity: one, use: mapped},
	{name: "compilation-config", aliases: []string{"O"}, arity: one},
	{name: "additional-config", arity: one},
	{name: "structured-outputs-config", arity: one},

	// EngineArgs' own and AsyncEngineArgs
	{name: "disable-log-stats", arity: storeTrue},
	{name: "aggregate-engine-logging", arity: storeTrue},
	{name: "enable-log-requests", arity: boolOpt},
	{name: "disable-log-requests", arity: boolOpt},
}

// lookup indexes vllmFlags by every spelling an argument can take: "--name", "--no-name" for
// BooleanOptionalAction flags, "-alias".
var lookup = func() map[string]*flagSpec {
	m := map[string]*flagSpec{}
	for i := range vllmFlags {
		f := &vllmFlags[i]
		m["--"+f.name] = f
		if f.arity == boolOpt {
			m["--no-"+f.name] = f
		}
		for _, a := range f.aliases {
			m["-"+a] = f
		}
	}
	return m
}()

// spellings lists every long spelling, for prefix matching and suggestions.
func spellings() []string {
	var out []string
	for k := range lookup {
		if strings.HasPrefix(k, "--") {
			out = append(out, k)
		}
	}
	return out
}
