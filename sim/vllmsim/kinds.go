package vllmsim

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Engine kinds (Config.EngineKind): which engine's HTTP surface and KV-event wire the sim
// speaks. The scheduler, cache and tokenizer are the same for all three; only what an outside
// reader sees changes, so a router can be tested against an SGLang- or TensorRT-LLM-shaped
// fleet. Written from each engine's source (read through public source indexes), not from the
// router's codecs:
//
//   - SGLang: events from python/sglang/srt/disaggregation/kv_events.py (sgl-project/sglang at
//     612d579090db): an array batch [ts, events, attn_dp_rank] of positional events
//     (array_like), BlockStored [tag, block_hashes, parent_block_hash, token_ids, block_size,
//     lora_id, medium], BlockRemoved [tag, block_hashes, medium], AllBlocksCleared [tag]; hashes
//     are signed int64; replay replies carry no topic frame. HTTP: /tokenize takes text only
//     (entrypoints/openai/serving_tokenize.py at 0351c1fafe4c), /detokenize answers {"text"}, no
//     render routes; /metrics names sglang:num_queue_reqs, sglang:num_running_reqs and
//     sglang:token_usage per dp_rank.
//   - TensorRT-LLM: events as vLLM's map events (an array batch of {"type", ...} maps) with
//     signed int64 hashes (tensorrt_llm/_torch/pyexecutor/kv_cache_events.py, NVIDIA/TensorRT-LLM
//     at 44004b3864a7, after #17023). HTTP: POST /_internal/tokenize {model, prompt} ->
//     {count, tokens}, text only; request bodies refuse unknown fields (extra="forbid"), so
//     vllm_xargs is a 400 (tensorrt_llm/serve/openai_protocol.py at 0076e9390e1e); usage carries
//     prompt_tokens_details.cached_tokens; metrics at /prometheus/metrics with
//     trtllm_kv_cache_utilization (tensorrt_llm/metrics/collector.py at 89fd9b74ab7a).
const (
	KindVLLM   = "vllm"
	KindSGLang = "sglang"
	KindTRTLLM = "trtllm"
)

func checkEngineKind(k string) error {
	switch k {
	case "", KindVLLM, KindSGLang, KindTRTLLM:
		return nil
	}
	return fmt.Errorf("engine kind must be vllm, sglang or trtllm, got %q", k)
}

// kind is the configured kind, vLLM when unset.
func (cfg *Config) kind() string {
	if cfg.EngineKind == "" {
		return KindVLLM
	}
	return cfg.EngineKind
}

// encodeKind encodes a batch as the publisher of kind k does.
func (e *eventEncoder) encodeKind(b *wireBatch, shape eventShape, k string) ([]byte, error) {
	switch k {
	case KindSGLang:
		return e.encodeSGLang(b)
	case KindTRTLLM:
		e.signed = true
		defer func() { e.signed = false }()
		return e.encode(b, shapeE3)
	}
	return e.encode(b, shape)
}

// encodeSGLang writes SGLang's positional batch. A BlockStored of a salted request starting a
// chain carries SGLang's trailing metadata map {"cache_salt": ...} (BlockStoredWithMetadata);
// the sim has no sessions, so session_id is never set. SGLang sends lora_id, not the adapter
// name, so a LoRA request's blocks cannot be keyed by adapter from SGLang's wire (docs/engines.md).
func (e *eventEncoder) encodeSGLang(b *wireBatch) ([]byte, error) {
	e.buf.Reset()
	e.err = nil
	e.signed = true
	defer func() { e.signed = false }()
	e.check(e.enc.EncodeArrayLen(3))
	e.check(e.enc.EncodeFloat64(b.ts))
	e.check(e.enc.EncodeArrayLen(len(b.events)))
	for i := range b.events {
		ev := &b.events[i]
		switch ev.kind {
		case evStored:
			salt, salted := sglangSalt(ev)
			if salted {
				e.check(e.enc.EncodeArrayLen(8))
			} else {
				e.check(e.enc.EncodeArrayLen(7))
			}
			e.str(eventTags[ev.kind])
			e.hashList(ev.hashes)
			e.optUint(ev.parent)
			e.check(e.enc.EncodeArrayLen(len(ev.tokens)))
			for _, t := range ev.tokens {
				e.check(e.enc.EncodeUint(uint64(t)))
			}
			e.check(e.enc.EncodeInt(ev.blockSize))
			e.optInt(ev.loraID)
			e.optStr(ev.medium)
			if salted {
				e.check(e.enc.EncodeMapLen(1))
				e.str("cache_salt")
				e.str(salt)
			}
		case evRemoved:
			e.check(e.enc.EncodeArrayLen(3))
			e.str(eventTags[ev.kind])
			e.hashList(ev.hashes)
			e.optStr(ev.medium)
		default:
			e.check(e.enc.EncodeArrayLen(1))
			e.str(eventTags[ev.kind])
		}
	}
	e.optInt(b.rank)
	if e.err != nil {
		return nil, e.err
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

// kindRoutes mounts the routes that differ by kind.
func (s *Sim) kindRoutes(mux *http.ServeMux) {
	switch s.cfg.kind() {
	case KindSGLang:
		mux.HandleFunc("POST /tokenize", s.handleTokenizeText)
		mux.HandleFunc("POST /detokenize", s.handleDetokenize)
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.kindReg, promhttp.HandlerOpts{}))
	case KindTRTLLM:
		mux.HandleFunc("POST /_internal/tokenize", s.handleTokenizeText)
		mux.Handle("GET /prometheus/metrics", promhttp.HandlerFor(s.kindReg, promhttp.HandlerOpts{}))
	default:
		mux.HandleFunc("POST /v1/completions/render", s.handleCompletionsRender)
		mux.HandleFunc("POST /v1/chat/completions/render", s.handleChatRender)
		mux.HandleFunc("POST /tokenize", s.handleTokenize)
		mux.HandleFunc("POST /detokenize", s.handleDetokenize)
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	}
}

// handleTokenizeText is SGLang's /tokenize and TensorRT-LLM's /_internal/tokenize: a text
// prompt only (neither renders messages).
func (s *Sim) handleTokenizeText(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string  `json:"model"`
		Prompt *string `json:"prompt"`
	}
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Prompt == nil {
		writeError(w, badRequest("prompt is required (a string)"))
		return
	}
	toks := Tokenize(*req.Prompt)
	out := map[string]any{"count": len(toks), "tokens": toks}
	if s.cfg.kind() == KindSGLang {
		out["max_model_len"] = s.cfg.MaxModelLen
	}
	writeJSON(w, http.StatusOK, out)
}

var (
	descSGLQueue   = prometheus.NewDesc("sglang:num_queue_reqs", "The number of requests in the waiting queue.", []string{"model_name", "dp_rank"}, nil)
	descSGLRunning = prometheus.NewDesc("sglang:num_running_reqs", "The number of running requests.", []string{"model_name", "dp_rank"}, nil)
	descSGLUsage   = prometheus.NewDesc("sglang:token_usage", "The token usage.", []string{"model_name", "dp_rank"}, nil)
	descSGLConfig  = prometheus.NewDesc("sglang:cache_config_info", "Information of the cache configuration.", []string{"page_size", "num_pages"}, nil)
	descTRTUsage   = prometheus.NewDesc("trtllm_kv_cache_utilization", "KV cache utilization.", []string{"model_name"}, nil)
)

// kindMetrics is the /metrics page of SGLang or TensorRT-LLM, from the same rank snapshots as
// vLLM's.
type kindMetrics struct{ m *simMetrics }

func (k kindMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSGLQueue, descSGLRunning, descSGLUsage, descSGLConfig, descTRTUsage} {
		ch <- d
	}
}

func (k kindMetrics) Collect(ch chan<- prometheus.Metric) {
	g := prometheus.GaugeValue
	var usage float64
	for i, rm := range k.m.ranks {
		rm.mu.Lock()
		running, waiting, u := rm.running, rm.waiting, rm.usage
		rm.mu.Unlock()
		usage += u / float64(len(k.m.ranks))
		if k.m.cfg.kind() == KindSGLang {
			l := []string{rm.model, strconv.Itoa(i)}
			ch <- prometheus.MustNewConstMetric(descSGLQueue, g, float64(waiting), l...)
			ch <- prometheus.MustNewConstMetric(descSGLRunning, g, float64(running), l...)
			ch <- prometheus.MustNewConstMetric(descSGLUsage, g, u, l...)
		}
	}
	if k.m.cfg.kind() == KindSGLang {
		ch <- prometheus.MustNewConstMetric(descSGLConfig, g, 1, strconv.Itoa(k.m.cfg.BlockSize), strconv.Itoa(k.m.cfg.NumGPUBlocks))
	}
	if k.m.cfg.kind() == KindTRTLLM {
		ch <- prometheus.MustNewConstMetric(descTRTUsage, g, usage, k.m.cfg.Model)
	}
}

// sglangSalt is the cache salt of a BlockStored that starts a chain: the last entry of block
// 0's vLLM extra keys after the adapter name (simIdentity.blockExtras puts the salt there).
func sglangSalt(ev *wireEvent) (string, bool) {
	if ev.parent != nil || len(ev.extraKeys) == 0 {
		return "", false
	}
	n := 0
	if ev.loraName != nil && *ev.loraName != "" {
		n = 1
	}
	if ek := ev.extraKeys[0]; len(ek) > n {
		return ek[n], true
	}
	return "", false
}
