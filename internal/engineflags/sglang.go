package engineflags

// SGLang are the options of SGLang's launch server, one per ServerArgs field (its name
// with dashes), with the aliases and renamed flags the fields declare, read from
// python/sglang/srt/server_args.py of sgl-project/sglang at commit 001067fffe33: the fields
// from "Model and tokenizer" through "Offloading", plus --config, which add_cli_args registers
// by hand. The file's later groups (LMCache, FlexKV, ktransformers, PD disaggregation, debug
// and deprecated options registered by hand) were not transcribed: a flag from them draws the
// unknown-flag warning, never a refusal. SGLang's argparse takes dashes only; a true value
// means it also takes --no-<name> (BooleanOptionalAction). Re-read the file at the tag when
// render.TestedSGLangReleases[0] moves.
var SGLang = map[string]bool{
	// Model and tokenizer
	"model-path": false, "model": false, "tokenizer-path": false, "tokenizer-mode": false,
	"tokenizer-backend": false, "tokenizer-worker-num": false, "detokenizer-worker-num": false,
	"skip-tokenizer-init": false, "load-format": false, "model-loader-extra-config": false,
	"trust-remote-code": false, "context-length": false, "is-embedding": false,
	"enable-multimodal": false, "revision": false, "model-impl": false,
	"model-config-parser": false, "json-model-override-args": false, "config": false,

	// Quantization and data type
	"dtype": false, "quantization": false, "quantization-param-path": false,
	"kv-cache-dtype": false, "enable-fp32-lm-head": false, "modelopt-quant": false,
	"modelopt-checkpoint-restore-path": false, "modelopt-checkpoint-save-path": false,
	"modelopt-export-path": false, "quantize-and-serve": false, "rl-quant-profile": false,
	"enable-tf32-matmul": false,

	// Memory and scheduling
	"mem-fraction-static": false, "max-running-requests": false, "max-queued-requests": false,
	"max-total-tokens": false, "chunked-prefill-size": false, "prefill-decode-interval": false,
	"enable-dynamic-chunking": false, "max-prefill-tokens": false, "prefill-max-requests": false,
	"schedule-policy": false, "enable-priority-scheduling": false,
	"disable-priority-preemption": false, "default-priority-value": false,
	"abort-on-priority-when-disabled": false, "schedule-low-priority-values-first": false,
	"priority-scheduling-preemption-threshold": false, "retraction-policy": false,
	"schedule-conservativeness": false, "page-size": false, "c128-page-size": false,
	"swa-full-tokens-ratio": false, "disable-hybrid-swa-memory": false,
	"radix-eviction-policy": false, "prefill-only-disable-kv-cache": false,
	"disable-radix-cache": false, "enable-page-major-kv-layout": false,
	"enable-unified-memory": false, "disable-chunked-prefix-cache": false,
	"disable-overlap-schedule": false, "num-continuous-decode-steps": false,
	"scheduler-recv-interval": false, "enable-mixed-chunk": false,

	// Distributed topology and parallelism
	"nccl-port": false, "dist-timeout": false, "dist-init-addr": false, "nccl-init-addr": false,
	"gated-launch-port": false, "nnodes": false, "node-rank": false, "tp-size": false,
	"tensor-parallel-size": false, "dcp-size": false, "decode-context-parallel-size": false,
	"pp-size": false, "pipeline-parallel-size": false, "pp-max-micro-batch-size": false,
	"pp-async-batch-depth": false, "dp-size": false, "data-parallel-size": false,
	"load-balance-method": false, "attn-cp-size": false,
	"attention-context-parallel-size": false, "moe-dp-size": false,
	"moe-data-parallel-size": false, "dwdp-size": false, "dcp-comm-backend": false,
	"dcp-replicate-q-proj": true, "enable-prefill-cp": false, "cp-strategy": false,
	"enable-dsa-cache-layer-split": false, "enable-cp-decode-attn-tp": false,
	"enable-dp-attention": false, "enable-dp-attention-local-control-broadcast": false,
	"enable-dp-lm-head": false, "enable-tp-lm-head-all-to-all": true,
	"enable-attn-tp-input-scattered": false, "enable-shared-experts-attn-tp": false,
	"enable-dense-mlp-attn-tp": false, "disable-attn-tp-gather": false,
	"enable-p2p-check": false,

	// Device info and server timeout
	"device": false, "base-gpu-id": false, "gpu-id-step": false, "random-seed": false,
	"mlx-enable-sampling": false, "watchdog-timeout": false, "soft-watchdog-timeout": false,
	"sleep-on-idle": false, "use-ray": false, "numa-node": false, "gc-threshold": false,

	// HTTP server, SSL, API
	"host": false, "port": false, "fastapi-root-path": false, "smg-grpc-mode": false,
	"grpc-mode": false, "grpc-port": false, "sidecar": false, "sidecar-args": false,
	"skip-server-warmup": false, "warmups": false, "enable-http2": false,
	"http2-max-concurrent-streams": false, "ssl-keyfile": false, "ssl-certfile": false,
	"ssl-ca-certs": false, "ssl-keyfile-password": false, "enable-ssl-refresh": false,
	"api-key": false, "admin-api-key": false, "served-model-name": false,
	"weight-version": false, "chat-template": false, "hf-chat-template-name": false,
	"completion-template": false, "file-storage-path": false, "enable-cache-report": false,
	"reasoning-parser": false, "default-chat-template-kwargs": false,
	"strip-thinking-cache": false, "enable-strict-thinking": false, "tool-call-parser": false,
	"tool-server": false, "sampling-defaults": false, "asr-max-buffer-seconds": false,
	"asr-max-concurrent-sessions": false, "preferred-sampling-params": false,
	"allow-auto-truncate": false,

	// Streaming
	"stream-interval": false, "batch-notify-size": false,
	"stream-response-default-include-usage": false, "incremental-streaming-output": false,
	"enable-streaming-session": false, "enable-session-radix-cache": false,

	// Logging, metrics and tracing
	"log-level": false, "log-level-http": false, "log-requests": false,
	"log-requests-level": false, "log-requests-format": false, "log-requests-target": false,
	"uvicorn-access-log-exclude-prefixes": false, "crash-dump-folder": false,
	"show-time-cost": false, "enable-metrics": false, "smg-http-sidecar-port": false,
	"grpc-http-sidecar-port": false, "enable-mfu-metrics": false,
	"enable-metrics-for-all-schedulers": false, "load-snapshot-publish-interval": false,
	"tokenizer-metrics-custom-labels-header":  false,
	"tokenizer-metrics-allowed-custom-labels": false, "extra-metric-labels": false,
	"bucket-time-to-first-token": false, "bucket-inter-token-latency": false,
	"bucket-e2e-request-latency": false, "prompt-tokens-buckets": false,
	"generation-tokens-buckets": false, "gc-warning-threshold-secs": false,
	"decode-log-interval": false, "enable-request-time-stats-logging": false,
	"kv-events-config": false, "enable-forward-pass-metrics": false,
	"forward-pass-metrics-worker-id": false, "forward-pass-metrics-ipc-name": false,
	"enable-trace": false, "trace-modules": false, "otlp-traces-endpoint": false,
	"export-metrics-to-file": false, "export-metrics-to-file-dir": false,

	// Constrained decoding and kernel backends
	"constrained-json-whitespace-pattern": false, "constrained-json-disable-any-whitespace": false,
	"attention-backend": false, "decode-attention-backend": false,
	"prefill-attention-backend": false, "sampling-backend": false, "grammar-backend": false,
	"radix-cache-backend": false, "mm-attention-backend": false, "fp8-gemm-backend": false,
	"fp4-gemm-backend": false, "bf16-gemm-backend": false, "dsa-prefill-backend": false,
	"dsv4-prefill-backend": false, "dsa-decode-backend": false,
	"dsa-paged-mqa-logits-backend": false, "dsa-topk-backend": false,
	"disable-flashinfer-autotune": false, "flashinfer-autotune-skip-ops": false,
	"mamba-backend": false,

	// CUDA graphs, communication, torch compile
	"cuda-graph-config": false, "cuda-graph-backend-decode": false,
	"cuda-graph-backend-prefill": false, "cuda-graph-max-bs-decode": false,
	"cuda-graph-max-bs-prefill": false, "cuda-graph-bs-decode": false,
	"cuda-graph-bs-prefill": false, "cuda-graph-tc-compiler": false,
	"disable-prefill-cuda-graph": false, "disable-decode-cuda-graph": false,
	"disable-cuda-graph-padding": false, "enable-profile-cuda-graph": false,
	"enable-cudagraph-gc": false, "debug-cuda-graph": false,
	"enable-layerwise-nvtx-marker": false, "enable-nccl-nvls": false, "enable-symm-mem": false,
	"triton-attention-reduce-in-fp32": false, "triton-attention-num-kv-splits": false,
	"triton-attention-split-tile-size": false, "flashinfer-mla-disable-ragged": false,
	"enable-fused-qk-norm-rope": false, "enable-precise-embedding-interpolation": false,
	"enable-fused-moe-sum-all-reduce": false, "enable-deepseek-v4-fp4-indexer": false,
	"disable-custom-all-reduce": false, "enable-mscclpp": false, "enable-torch-symm-mem": false,
	"enable-scattered-sconv": false, "pre-warm-nccl": false,
	"enable-quant-communications":                 false,
	"enforce-disable-flashinfer-allreduce-fusion": false,
	"flashinfer-allreduce-fusion-backend":         false, "enable-aiter-allreduce-fusion": false,
	"enable-torch-compile": false, "enable-torch-compile-debug-mode": false,
	"torch-compile-max-bs": false,

	// Speculative decoding
	"speculative-algorithm": false, "speculative-draft-model-path": false,
	"speculative-draft-model": false, "speculative-draft-model-revision": false,
	"speculative-draft-load-format": false, "speculative-num-steps": false,
	"speculative-eagle-topk": false, "speculative-num-draft-tokens": false,
	"speculative-dflash-block-size": false, "speculative-dspark-block-size": false,
	"speculative-dspark-sps-table-path": false, "speculative-dspark-confidence-sts-path": false,
	"speculative-dspark-align-verify-tokens-to-graph-tier": false,
	"speculative-accept-threshold-single":                  false, "speculative-accept-threshold-acc": false,
	"speculative-use-rejection-sampling": false, "speculative-token-map": false,
	"speculative-attention-mode": false, "speculative-draft-attention-backend": false,
	"speculative-dsa-topk-backend": false, "speculative-draft-kv-cache-dtype": false,
	"speculative-draft-window-size": false, "speculative-moe-runner-backend": false,
	"speculative-moe-a2a-backend": false, "speculative-draft-model-quantization": false,
	"speculative-skip-dp-mlp-sync": false, "enable-multi-layer-eagle": false,
	"speculative-adaptive": false, "speculative-adaptive-config": false,
	"decoupled-spec-bind-endpoint": false, "decoupled-spec-connect-endpoints": false,
	"decoupled-spec-rank": false, "decoupled-spec-role": false, "spec-trace-dir": false,
	"speculative-ngram-min-bfs-breadth": false, "speculative-ngram-max-bfs-breadth": false,
	"speculative-ngram-match-type": false, "speculative-ngram-max-trie-depth": false,
	"speculative-ngram-capacity": false, "speculative-ngram-external-corpus-path": false,
	"speculative-ngram-external-sam-budget":        false,
	"speculative-ngram-external-corpus-max-tokens": false,

	// Expert parallelism
	"ep-size": false, "expert-parallel-size": false, "ep": false, "moe-a2a-backend": false,
	"enable-w4a4-mxfp4-megamoe": false, "deepep-v2-mode": false, "moe-runner-backend": false,
	"flashinfer-mxfp4-moe-precision": false, "deepep-mode": false, "fuseep-mode": false,
	"deepep-dispatcher-output-dtype": false, "ep-num-redundant-experts": false,
	"ep-dispatch-algorithm": false, "init-expert-location": false, "enable-eplb": false,
	"eplb-algorithm": false, "eplb-rebalance-num-iterations": false,
	"eplb-rebalance-layers-per-chunk":            false,
	"eplb-min-rebalancing-utilization-threshold": false,
	"expert-distribution-recorder-mode":          false,
	"expert-distribution-recorder-buffer-size":   false,
	"expert-balancedness-report-mode":            false, "deepep-config": false,
	"moe-dense-tp-size": false, "elastic-ep-backend": false,
	"enable-elastic-expert-backup": false, "mooncake-ib-device": false,
	"enable-waterfill": false, "elastic-ep-join-mode": false,
	"elastic-ep-join-rank-offset": false, "elastic-ep-initial-size": false,
	"max-ep-size": false, "elastic-ep-scale-timeout": false, "elastic-ep-rejoin": false,
	"disable-flashinfer-cutlass-moe-fp4-allgather": false,
	"disable-shared-experts-fusion":                false, "enforce-shared-experts-fusion": false,

	// Mamba cache and linear attention
	"max-mamba-cache-size": false, "mamba-ssm-dtype": false, "mamba-max-states-per-path": false,
	"enable-mamba-cache-stochastic-rounding": false, "mamba-cache-philox-rounds": false,
	"mamba-full-memory-ratio": false, "mamba-radix-cache-strategy": false,
	"mamba-track-interval": false, "enable-int8-mamba-checkpoint": false,
	"int8-mamba-ckpt-size": false, "linear-attn-backend": false,
	"linear-attn-decode-backend": false, "linear-attn-prefill-backend": false,
	"linear-attn-verify-backend": false, "enable-linear-replayssm": false,
	"linear-replayssm-cache-len": false, "enable-linear-replayssm-spec": false,

	// Hierarchical cache and sparse attention
	"enable-hierarchical-cache": false, "hicache-host-memory-mode": false,
	"hicache-ratio": false, "hicache-size": false, "hicache-write-policy": false,
	"hicache-io-backend": false, "hicache-mem-layout": false,
	"hicache-storage-backend": false, "hicache-storage-prefetch-policy": false,
	"hicache-storage-backend-extra-config": false, "enable-hisparse": false,
	"hisparse-config": false, "hierarchical-sparse-attention-extra-config": false,

	// Multimodal
	"enable-broadcast-mm-inputs-process": false, "enable-prefix-mm-cache": false,
	"mm-enable-dp-encoder": false, "mm-process-config": false,
	"mm-processor-worker-num": false, "mm-io-worker-num": false,
	"allowed-media-domains": false, "media-url-max-file-size-mb": false,
	"mm-preprocess-cache-size-mb": false, "trust-mm-content-hashes": false,
	"limit-mm-data-per-request": false, "enable-mm-global-cache": false,
	"image-processor-backend": false, "mm-global-cache-backend": false,
	"disable-fast-image-processor": false, "mm-feature-transport": false,
	"keep-mm-feature-on-device": false,

	// LoRA
	"enable-lora": false, "enable-lora-overlap-loading": false, "max-lora-rank": false,
	"lora-target-modules": false, "lora-paths": false, "max-loaded-loras": false,
	"max-loras-per-batch": false, "lora-eviction-policy": false, "lora-backend": false,
	"max-lora-chunk-size": false, "experts-shared-outer-loras": true,
	"lora-use-virtual-experts": false, "lora-strict-loading": true,
	"lora-drain-wait-threshold": false,

	// Two batch overlap, offloading
	"enable-two-batch-overlap": false, "enable-single-batch-overlap": false,
	"tbo-token-distribution-threshold": false, "cpu-offload-gb": false,
	"offload-group-size": false, "offload-num-in-group": false, "offload-prefetch-step": false,
	"offload-mode": false,
}
