// Package engine names the LLM engines the router routes to (vLLM, SGLang, TensorRT-LLM) and
// says, per engine, what differs for the router: the /metrics names and page, the tokenize
// route, and which of the router's vLLM-specific checks apply. It is data only: the packages
// that speak each surface (kvwire, tokens, fleet) read it.
//
// Sources read for each profile (through public source indexes; see docs/engines.md):
//   - SGLang: python/sglang/srt/disaggregation/kv_events.py and mem_cache/events.py
//     (sgl-project/sglang at 612d579090db and cc6971b740d8), entrypoints/openai/serving_tokenize.py
//     (0351c1fafe4c).
//   - TensorRT-LLM: tensorrt_llm/_torch/pyexecutor/kv_cache_events.py (NVIDIA/TensorRT-LLM at
//     44004b3864a7), tensorrt_llm/metrics/collector.py (89fd9b74ab7a), tensorrt_llm/serve/openai_protocol.py
//     (0076e9390e1e: /_internal/tokenize, usage.prompt_tokens_details.cached_tokens, extra="forbid"),
//     docs/source/commands/trtllm-serve.rst.
package engine

import (
	"fmt"
	"strings"
)

// Kind is an engine family. The zero value is not a kind: Or gives the default.
type Kind string

// The engines the router knows.
const (
	VLLM   Kind = "vllm"
	SGLang Kind = "sglang"
	TRTLLM Kind = "trtllm"
)

// Kinds lists every kind, default first.
var Kinds = []Kind{VLLM, SGLang, TRTLLM}

// Parse reads a kind as written in a flag or a config file; "" is vLLM, the default.
func Parse(s string) (Kind, error) {
	switch k := Kind(strings.ToLower(strings.TrimSpace(s))); k {
	case "":
		return VLLM, nil
	case VLLM, SGLang, TRTLLM:
		return k, nil
	}
	return "", fmt.Errorf("engine kind %q is not one of vllm, sglang, trtllm", s)
}

// Or returns k, or def when k is unset.
func (k Kind) Or(def Kind) Kind {
	if k == "" {
		return def
	}
	return k
}

func (k Kind) String() string { return string(k.Or(VLLM)) }

// Metrics are the Prometheus names an engine exports for the figures the router reads.
type Metrics struct {
	// Path is the page's path on the engine's HTTP port.
	Path string
	// Waiting, Running and KVUsage (0..1) name the gauges ("" when the engine has none).
	Waiting, Running, KVUsage string
	// RankLabel is the label that carries the DP rank ("" when the page is per engine).
	RankLabel string
	// ConfigInfo is an info gauge whose labels carry the cache configuration: BlockSizeLabel and
	// GPUBlocksLabel name them ("" when absent).
	ConfigInfo, BlockSizeLabel, GPUBlocksLabel string
}

// Profile is what the router does differently for one kind.
type Profile struct {
	Kind    Kind
	Metrics Metrics
	// TokenizePath answers {"model","prompt"} with {"tokens": [...]}.
	TokenizePath string
	// Render: the engine serves /v1/completions/render and /v1/chat/completions/render (vLLM).
	Render bool
	// ChatTokenize: the tokenize route also applies the chat template to {"messages": ...}.
	ChatTokenize bool
	// HashParity: the engine's block hash is vLLM's (pickle/CBOR + SHA-256/XXH3 with
	// PYTHONHASHSEED), so the router can recompute it.
	HashParity bool
	// ReportMode: the engine reads vllm_xargs.kv_cache_report_mode, so the router may pin it.
	ReportMode bool
	// Snapshots: the engine may serve a snapshot endpoint (vLLM's snapshot_endpoint).
	Snapshots bool
	// AnyModelName: the engine serves one model under whatever name a request gives and
	// serves no adapters by name, so every request is the base model (never a LoRA key).
	AnyModelName bool
	// NotApplicable are the router's checks that do not apply to this engine, each with why:
	// shown in /debug/engines so nothing is silently skipped.
	NotApplicable []string
}

// Profile returns k's profile (vLLM's for an unset kind).
func (k Kind) Profile() Profile {
	switch k.Or(VLLM) {
	case SGLang:
		return Profile{Kind: SGLang,
			Metrics: Metrics{Path: "/metrics", Waiting: "sglang:num_queue_reqs", Running: "sglang:num_running_reqs",
				KVUsage: "sglang:token_usage", RankLabel: "dp_rank",
				// page_size and num_pages: the labels GIE's model-server protocol and llm-d's
				// picker read (llm-d/llm-d-router v0.10.0, datalayer/extractor).
				ConfigInfo: "sglang:cache_config_info", BlockSizeLabel: "page_size", GPUBlocksLabel: "num_pages"},
			TokenizePath: "/tokenize",
			NotApplicable: []string{
				"hash parity: SGLang hashes pages with its own SHA-256 chain truncated to int64, not vLLM's; router keys come from the events' token ids",
				"kv_cache_report_mode: SGLang has no report modes; every stored page is announced once",
				"snapshots: SGLang serves no snapshot endpoint; a gap past the replay ring leaves the stream approximate until it heals",
				"chat render: SGLang's /tokenize takes text only, so chat requests are routed by load (unkeyed reason engine_no_chat_render)",
			}}
	case TRTLLM:
		return Profile{Kind: TRTLLM,
			Metrics: Metrics{Path: "/prometheus/metrics", KVUsage: "trtllm_kv_cache_utilization"},
			// POST /_internal/tokenize {model, prompt} -> {count, tokens}: plain text only
			// (tensorrt_llm/serve/openai_protocol.py TokenizeRequest, NVIDIA/TensorRT-LLM at 0076e9390e1e).
			TokenizePath: "/_internal/tokenize",
			// trtllm-serve has no served-name option (tensorrt_llm/commands/serve.py at
			// 00209af149e7); /v1/models lists MODEL, or its directory's name, and the completion
			// and chat handlers never check request.model, answering with it as given
			// (tensorrt_llm/serve/openai_server.py at 00057725d959, postprocess_handlers.py).
			AnyModelName: true,
			NotApplicable: []string{
				"served model name: trtllm-serve has no --served-model-name; its /v1/models lists the model path and it answers any request model name, so the router keys every request as the base model",
				"hash parity: TensorRT-LLM truncates its radix SHA-256 key to a signed int64, not vLLM's hash; router keys come from the events' token ids",
				"kv_cache_report_mode: trtllm-serve refuses unknown request fields, so the router sends no vllm_xargs",
				"snapshots: TensorRT-LLM serves no snapshot endpoint",
				"chat render: trtllm-serve's /_internal/tokenize takes text only (no messages), so chat requests are routed by load (unkeyed reason engine_no_chat_render)",
				"queue and running gauges: not exported; load comes from the router's own ledger",
			}}
	}
	return Profile{Kind: VLLM,
		Metrics: Metrics{Path: "/metrics", Waiting: "vllm:num_requests_waiting", Running: "vllm:num_requests_running",
			KVUsage: "vllm:kv_cache_usage_perc", RankLabel: "engine",
			ConfigInfo: "vllm:cache_config_info", BlockSizeLabel: "block_size", GPUBlocksLabel: "num_gpu_blocks"},
		TokenizePath: "/tokenize", Render: true, ChatTokenize: true, HashParity: true, ReportMode: true, Snapshots: true}
}

// CanTokenize reports whether the router can get a prompt's token ids from the engine for a
// chat request (chat) or a text completion (!chat).
func (p Profile) CanTokenize(chat bool) bool {
	if chat {
		return p.Render || p.ChatTokenize
	}
	return p.Render || p.TokenizePath != ""
}
