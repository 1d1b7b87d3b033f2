package vllmrelease

import "strings"

// Arity is how many values an option takes, as vLLM's argparse declares it.
type Arity int

const (
	// BoolOpt is argparse's BooleanOptionalAction: --x sets, --no-x clears, no value.
	BoolOpt Arity = iota
	// StoreTrue is --x alone.
	StoreTrue
	// One value: --x V or --x=V.
	One
	// List is nargs="+": one value or more, up to the next option.
	List
	// Optional is nargs="?": a value when the next argument is not an option.
	Optional
)

// Flag is one option of `vllm serve`.
type Flag struct {
	// Name is the long name with dashes, without "--".
	Name string
	// Aliases are the single-dash short names, without "-".
	Aliases []string
	Arity   Arity
}

// FlagsTag is the release Flags follows; a test holds it to Tested[0].
const FlagsTag = "v0.31.0"

// Flags are the options of `vllm serve` for FlagsTag, as argparse registers them:
// make_arg_parser and FrontendArgs (vllm/entrypoints/openai/cli_args.py), EngineArgs and
// AsyncEngineArgs (vllm/engine/arg_utils.py). Long names are written with dashes; vLLM's parser
// also takes them with underscores, as --name=value and, for JSON-valued ones, as --name.key.
// A dataclass bool field is a BooleanOptionalAction, a list field nargs="+".
//
// Read from the snapshots Sources names (no tagged tree was indexed), as their union: an option
// removed since is not flagged (vLLM refuses it at start), one added since is unknown here,
// which the operator reports as a warning, never a refusal. The table is kvroute's own.
var Flags = []Flag{

	// make_arg_parser
	{Name: "headless", Arity: StoreTrue},
	{Name: "api-server-count", Aliases: []string{"asc"}, Arity: One},
	{Name: "config", Arity: One},

	// FrontendArgs
	{Name: "host", Arity: One},
	{Name: "port", Arity: One},
	{Name: "uds", Arity: One},
	{Name: "uvicorn-log-level", Arity: One},
	{Name: "disable-uvicorn-access-log", Arity: BoolOpt},
	{Name: "allow-credentials", Arity: BoolOpt},
	{Name: "allowed-origins", Arity: One},
	{Name: "allowed-methods", Arity: One},
	{Name: "allowed-headers", Arity: One},
	{Name: "api-key", Arity: List},
	{Name: "lora-modules", Arity: List},
	{Name: "chat-template", Arity: One},
	{Name: "chat-template-content-format", Arity: One},
	{Name: "trust-request-chat-template", Arity: BoolOpt},
	{Name: "response-role", Arity: One},
	{Name: "ssl-keyfile", Arity: One},
	{Name: "ssl-certfile", Arity: One},
	{Name: "ssl-ca-certs", Arity: One},
	{Name: "enable-ssl-refresh", Arity: BoolOpt},
	{Name: "ssl-cert-reqs", Arity: One},
	{Name: "root-path", Arity: One},
	{Name: "middleware", Arity: One},
	{Name: "return-tokens-as-token-ids", Arity: BoolOpt},
	{Name: "disable-frontend-multiprocessing", Arity: BoolOpt},
	{Name: "enable-request-id-headers", Arity: BoolOpt},
	{Name: "enable-auto-tool-choice", Arity: BoolOpt},
	{Name: "exclude-tools-when-tool-choice-none", Arity: BoolOpt},
	{Name: "tool-call-parser", Arity: One},
	{Name: "tool-parser-plugin", Arity: One},
	{Name: "tool-server", Arity: One},
	{Name: "log-config-file", Arity: One},
	{Name: "max-log-len", Arity: One},
	{Name: "disable-fastapi-docs", Arity: BoolOpt},
	{Name: "enable-prompt-tokens-details", Arity: BoolOpt},
	{Name: "enable-server-load-tracking", Arity: BoolOpt},
	{Name: "enable-force-include-usage", Arity: BoolOpt},
	{Name: "enable-tokenizer-info-endpoint", Arity: BoolOpt},
	{Name: "enable-log-outputs", Arity: BoolOpt},
	{Name: "h11-max-incomplete-event-size", Arity: One},
	{Name: "h11-max-header-count", Arity: One},
	{Name: "log-error-stack", Arity: BoolOpt},
	{Name: "tokens-only", Arity: BoolOpt},
	{Name: "sse-keep-alive-interval", Arity: One},

	// EngineArgs: ModelConfig
	{Name: "model", Arity: One},
	{Name: "runner", Arity: One},
	{Name: "convert", Arity: One},
	{Name: "task", Arity: One},
	{Name: "tokenizer", Arity: One},
	{Name: "tokenizer-mode", Arity: One},
	{Name: "trust-remote-code", Arity: BoolOpt},
	{Name: "dtype", Arity: One},
	{Name: "seed", Arity: One},
	{Name: "hf-config-path", Arity: One},
	{Name: "allowed-local-media-path", Arity: One},
	{Name: "allowed-media-domains", Arity: List},
	{Name: "revision", Arity: One},
	{Name: "code-revision", Arity: One},
	{Name: "rope-scaling", Arity: One},
	{Name: "rope-theta", Arity: One},
	{Name: "tokenizer-revision", Arity: One},
	{Name: "max-model-len", Arity: One},
	{Name: "quantization", Aliases: []string{"q"}, Arity: One},
	{Name: "enforce-eager", Arity: BoolOpt},
	{Name: "max-logprobs", Arity: One},
	{Name: "logprobs-mode", Arity: One},
	{Name: "disable-sliding-window", Arity: BoolOpt},
	{Name: "disable-cascade-attn", Arity: BoolOpt},
	{Name: "skip-tokenizer-init", Arity: BoolOpt},
	{Name: "enable-prompt-embeds", Arity: BoolOpt},
	{Name: "served-model-name", Arity: List},
	{Name: "config-format", Arity: One},
	{Name: "hf-token", Arity: Optional},
	{Name: "hf-overrides", Arity: One},
	{Name: "pooler-config", Arity: One},
	{Name: "override-pooler-config", Arity: One},
	{Name: "logits-processor-pattern", Arity: One},
	{Name: "generation-config", Arity: One},
	{Name: "override-generation-config", Arity: One},
	{Name: "enable-sleep-mode", Arity: BoolOpt},
	{Name: "model-impl", Arity: One},
	{Name: "override-attention-dtype", Arity: One},
	{Name: "logits-processors", Arity: List},
	{Name: "io-processor-plugin", Arity: One},

	// LoadConfig
	{Name: "load-format", Arity: One},
	{Name: "download-dir", Arity: One},
	{Name: "safetensors-load-strategy", Arity: One},
	{Name: "model-loader-extra-config", Arity: One},
	{Name: "ignore-patterns", Arity: List},
	{Name: "use-tqdm-on-load", Arity: BoolOpt},
	{Name: "pt-load-map-location", Arity: One},

	// StructuredOutputsConfig (the guided-decoding ones are deprecated, typed bool with a value)
	{Name: "reasoning-parser", Arity: One},
	{Name: "guided-decoding-backend", Arity: One},
	{Name: "guided-decoding-disable-fallback", Arity: One},
	{Name: "guided-decoding-disable-any-whitespace", Arity: One},
	{Name: "guided-decoding-disable-additional-properties", Arity: One},

	// ParallelConfig
	{Name: "distributed-executor-backend", Arity: One},
	{Name: "pipeline-parallel-size", Aliases: []string{"pp"}, Arity: One},
	{Name: "tensor-parallel-size", Aliases: []string{"tp"}, Arity: One},
	{Name: "decode-context-parallel-size", Aliases: []string{"dcp"}, Arity: One},
	{Name: "data-parallel-size", Aliases: []string{"dp"}, Arity: One},
	// Multi-node data parallelism: which ranks this process runs and where the others are.
	{Name: "data-parallel-rank", Aliases: []string{"dpn"}, Arity: One},
	{Name: "data-parallel-start-rank", Aliases: []string{"dpr"}, Arity: One},
	{Name: "data-parallel-size-local", Aliases: []string{"dpl"}, Arity: One},
	{Name: "data-parallel-address", Aliases: []string{"dpa"}, Arity: One},
	{Name: "data-parallel-rpc-port", Aliases: []string{"dpp"}, Arity: One},
	{Name: "data-parallel-backend", Aliases: []string{"dpb"}, Arity: One},
	{Name: "data-parallel-hybrid-lb", Aliases: []string{"dph"}, Arity: BoolOpt},
	{Name: "enable-expert-parallel", Aliases: []string{"ep"}, Arity: BoolOpt},
	{Name: "all2all-backend", Arity: One},
	{Name: "enable-dbo", Arity: BoolOpt},
	{Name: "dbo-decode-token-threshold", Arity: One},
	{Name: "dbo-prefill-token-threshold", Arity: One},
	{Name: "disable-nccl-for-dp-synchronization", Arity: BoolOpt},
	{Name: "enable-eplb", Arity: BoolOpt},
	{Name: "eplb-config", Arity: One},
	{Name: "expert-placement-strategy", Arity: One},
	{Name: "num-redundant-experts", Arity: One},
	{Name: "eplb-window-size", Arity: One},
	{Name: "eplb-step-interval", Arity: One},
	{Name: "eplb-log-balancedness", Arity: BoolOpt},
	{Name: "max-parallel-loading-workers", Arity: One},
	{Name: "ray-workers-use-nsight", Arity: BoolOpt},
	{Name: "disable-custom-all-reduce", Arity: BoolOpt},
	{Name: "worker-cls", Arity: One},
	{Name: "worker-extension-cls", Arity: One},
	{Name: "enable-multimodal-encoder-data-parallel", Arity: StoreTrue},

	// CacheConfig
	{Name: "block-size", Arity: One},
	{Name: "gpu-memory-utilization", Arity: One},
	{Name: "kv-cache-memory-bytes", Arity: One},
	{Name: "swap-space", Arity: One},
	{Name: "kv-cache-dtype", Arity: One},
	{Name: "num-gpu-blocks-override", Arity: One},
	{Name: "enable-prefix-caching", Arity: BoolOpt},
	{Name: "prefix-caching-hash-algo", Arity: One},
	{Name: "cpu-offload-gb", Arity: One},
	{Name: "calculate-kv-scales", Arity: BoolOpt},
	{Name: "kv-sharing-fast-prefill", Arity: BoolOpt},
	{Name: "mamba-cache-dtype", Arity: One},
	{Name: "mamba-ssm-cache-dtype", Arity: One},
	{Name: "mamba-block-size", Arity: One},

	// MultiModalConfig
	{Name: "limit-mm-per-prompt", Arity: One},
	{Name: "enable-mm-embeds", Arity: BoolOpt},
	{Name: "media-io-kwargs", Arity: One},
	{Name: "mm-processor-kwargs", Arity: One},
	{Name: "mm-processor-cache-gb", Arity: One},
	{Name: "disable-mm-preprocessor-cache", Arity: StoreTrue},
	{Name: "mm-processor-cache-type", Arity: One},
	{Name: "mm-shm-cache-max-object-size-mb", Arity: One},
	{Name: "mm-encoder-tp-mode", Arity: One},
	{Name: "mm-encoder-attn-backend", Arity: One},
	{Name: "interleave-mm-strings", Arity: BoolOpt},
	{Name: "skip-mm-profiling", Arity: BoolOpt},
	{Name: "video-pruning-rate", Arity: One},

	// LoRAConfig
	{Name: "enable-lora", Arity: BoolOpt},
	{Name: "max-loras", Arity: One},
	{Name: "max-lora-rank", Arity: One},
	{Name: "lora-extra-vocab-size", Arity: One},
	{Name: "lora-dtype", Arity: One},
	{Name: "max-cpu-loras", Arity: One},
	{Name: "fully-sharded-loras", Arity: BoolOpt},
	{Name: "default-mm-loras", Arity: One},

	// ObservabilityConfig
	{Name: "show-hidden-metrics-for-version", Arity: One},
	{Name: "otlp-traces-endpoint", Arity: One},
	{Name: "collect-detailed-traces", Arity: List},

	// SchedulerConfig
	{Name: "max-num-batched-tokens", Arity: One},
	{Name: "max-num-seqs", Arity: One},
	{Name: "max-num-partial-prefills", Arity: One},
	{Name: "max-long-partial-prefills", Arity: One},
	{Name: "long-prefill-token-threshold", Arity: One},
	{Name: "num-lookahead-slots", Arity: One},
	{Name: "scheduling-policy", Arity: One},
	{Name: "enable-chunked-prefill", Arity: BoolOpt},
	{Name: "disable-chunked-mm-input", Arity: BoolOpt},
	{Name: "scheduler-cls", Arity: One},
	{Name: "disable-hybrid-kv-cache-manager", Arity: BoolOpt},
	{Name: "async-scheduling", Arity: BoolOpt},

	// CompilationConfig
	{Name: "cudagraph-capture-sizes", Arity: List},
	{Name: "cuda-graph-sizes", Arity: List},
	{Name: "max-cudagraph-capture-size", Arity: One},
	{Name: "optimization-level", Arity: One},

	// VllmConfig
	{Name: "speculative-config", Arity: One},
	{Name: "kv-transfer-config", Arity: One},
	{Name: "kv-events-config", Arity: One},
	{Name: "compilation-config", Aliases: []string{"O", "cc"}, Arity: One},
	{Name: "additional-config", Arity: One},
	{Name: "structured-outputs-config", Arity: One},

	// EngineArgs' own and AsyncEngineArgs
	{Name: "disable-log-stats", Arity: StoreTrue},
	{Name: "aggregate-engine-logging", Arity: StoreTrue},
	{Name: "enable-log-requests", Arity: BoolOpt},
	{Name: "disable-log-requests", Arity: BoolOpt},

	// The later arg_utils.py snapshot's additions
	{Name: "allow-deprecated-quantization", Arity: BoolOpt},
	{Name: "enable-return-routed-experts", Arity: BoolOpt},
	{Name: "attention-backend", Arity: One},
	{Name: "reasoning-parser-plugin", Arity: One},
	{Name: "master-addr", Arity: One},
	{Name: "master-port", Arity: One},
	{Name: "nnodes", Aliases: []string{"n"}, Arity: One},
	{Name: "node-rank", Aliases: []string{"r"}, Arity: One},
	{Name: "dcp-kv-cache-interleave-size", Arity: One},
	{Name: "cp-kv-cache-interleave-size", Arity: One},
	{Name: "prefill-context-parallel-size", Aliases: []string{"pcp"}, Arity: One},
	{Name: "data-parallel-external-lb", Aliases: []string{"dpe"}, Arity: BoolOpt},
	{Name: "ubatch-size", Arity: One},
	{Name: "mamba-cache-mode", Arity: One},
	{Name: "kv-offloading-size", Arity: One},
	{Name: "kv-offloading-backend", Arity: One},
	{Name: "mm-encoder-only", Arity: BoolOpt},
	{Name: "enable-tower-connector-lora", Arity: BoolOpt},
	{Name: "specialize-active-lora", Arity: BoolOpt},
	{Name: "kv-cache-metrics", Arity: BoolOpt},
	{Name: "kv-cache-metrics-sample", Arity: One},
	{Name: "cudagraph-metrics", Arity: BoolOpt},
	{Name: "enable-layerwise-nvtx-tracing", Arity: BoolOpt},
	{Name: "enable-mfu-metrics", Arity: BoolOpt},
	{Name: "enable-logging-iteration-details", Arity: BoolOpt},
	{Name: "stream-interval", Arity: One},
	{Name: "ec-transfer-config", Arity: One},
	{Name: "attention-config", Aliases: []string{"ac"}, Arity: One},
	{Name: "profiler-config", Arity: One},
	{Name: "weight-transfer-config", Arity: One},
}

// Lookup finds a long option by name (dashes, no "--"); a --no-<name> spelling is found
// through its BoolOpt flag, with negated set.
func Lookup(name string) (f *Flag, negated bool) {
	if f := byName[name]; f != nil {
		return f, false
	}
	if rest, ok := strings.CutPrefix(name, "no-"); ok {
		if f := byName[rest]; f != nil && f.Arity == BoolOpt {
			return f, true
		}
	}
	return nil, false
}

// Short finds an option by one of its single-dash aliases (without "-").
func Short(alias string) *Flag { return byAlias[alias] }

var byName, byAlias = func() (map[string]*Flag, map[string]*Flag) {
	n, a := map[string]*Flag{}, map[string]*Flag{}
	for i := range Flags {
		f := &Flags[i]
		n[f.Name] = f
		for _, s := range f.Aliases {
			a[s] = f
		}
	}
	return n, a
}()
