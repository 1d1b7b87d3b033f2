// Package vllmsim is a vLLM-compatible engine simulator: vLLM's OpenAI HTTP surface, a
// block-based prefix cache with vLLM's allocation and eviction order, vLLM-exact block hashes,
// ZMQ KV events (batch shapes E1, E2, E3) with a replay ring, a step-based timing model and fault
// switches. It runs in-process (New, Start, Addr, Close) or as the vllm-sim binary.
package vllmsim

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// VocabSize is the simulated vocabulary (Qwen2's): every token id is below it.
const VocabSize = 151936

// Config is everything one simulated vLLM server needs. The zero value of a field means
// "vLLM's default" (see Defaults); New fills them in.
type Config struct {
	Host  string // listen host for HTTP and bound ZMQ sockets (default 127.0.0.1)
	Port  int    // HTTP port; 0 picks a free one (see Sim.Addr)
	Model string // served model name (default "vllm-sim")
	// LoRAAdapters are the served LoRA adapter names (vLLM's --lora-modules NAME=PATH);
	// a request whose model is one of them hashes with the adapter name as an extra key.
	LoRAAdapters []string
	// APIKeys, when any, protect the paths vLLM's --api-key protects (see auth.go): vLLM
	// accepts any of several keys (--api-key K1 K2, or VLLM_API_KEY when the flag is absent).
	APIKeys []string

	BlockSize    int    // tokens per KV block (default 16)
	NumGPUBlocks int    // blocks per rank, including vLLM's reserved null block (default 4096)
	MaxModelLen  int    // longest prompt+output in tokens (default 131072)
	HashAlgo     string // sha256 (default), sha256_cbor, xxhash, xxhash_cbor
	HashSeed     string // PYTHONHASHSEED string; the binary reads it from the env, default "0"

	DataParallelSize int // ranks, each with its own cache, scheduler and event stream (default 1)

	KVEventsPort    int    // PUB bind port of rank 0 (rank r binds port+r); 0 = no bound PUB, -1 = any free port
	KVEventsConnect string // dial this address instead (tcp://host:port, rank r dials port+r)
	KVReplayPort    int    // ROUTER replay bind port of rank 0; 0 = no replay socket, -1 = any free port
	// KVEventsBind and KVReplayBind are whole ZMQ endpoints to bind (tcp://*:5557,
	// tcp://[::]:5557, tcp://10.0.0.5:5557), rank r on port+r, as vLLM's --kv-events-config
	// gives them; they take the place of the ports above, which bind on Host.
	KVEventsBind string
	KVReplayBind string
	// KVEventsTopic is the first frame of every event message. nil means
	// "kv@<host>:<http port>@<model>" (see DefaultTopic); a pointer to "" sends vLLM's default
	// empty topic.
	KVEventsTopic *string
	// EventLayout is the KV-event batch shape (spec §4.4 erratum): "E1" array batch of array
	// events (kv_events.py before #42892), "E2" map batch of map events (newest upstream
	// kv_events.py), "E3" array batch of map events (a live v0.26.0 capture; the default). The
	// older values "array" and "map" are accepted as E1 and E3.
	EventLayout string
	// ReplayNoTopicFrame sends replay replies without the topic frame, as vLLM did before PR
	// #45177 (merged June 2026): [seq, payload] and the end marker [ff*8, ""].
	ReplayNoTopicFrame bool
	// EngineKind is whose HTTP surface and KV-event wire the sim speaks: "vllm" (the default),
	// "sglang" or "trtllm" (kinds.go). An SGLang sim replays without the topic frame.
	EngineKind string
	// KVSnapshotPort is vLLM's snapshot_endpoint (PR #57789) for rank 0 (rank r: port+r); 0 =
	// off. Set, the data frames carry a 24-byte sequence (seq and a per-process publisher id) and
	// an idle publisher sends an empty batch every second.
	KVSnapshotPort int
	BufferSteps    int // replay ring length in batches (default 10000)
	HWM            int // PUB send high-water mark (default 100000)

	// StepModel is the step-time model: "vllm-0.20.1-b300" (the default: stepmodel.go, fitted to
	// vLLM 0.20.1's own per-step records, Qwen3-32B TP1 on a B300), "splitwise-h100" (the same
	// formula fitted to the Splitwise paper's H100 Llama2-70B measurements; "calibrated" is
	// accepted as its alias and Defaults resolves it) or "flat", the older model where a step
	// takes uncached prefill tokens / PrefillTokensPerS plus DecodeMsPerToken when it decodes.
	// Empty means "flat" when PrefillTokensPerS or DecodeMsPerToken is set (callers that tuned
	// those rates keep them), DefaultStepModel otherwise.
	StepModel string
	// StepTokenScale makes a calibrated model read every simulated token as this many model
	// tokens (prefill and decode context; attention by its square), for harnesses that shrink
	// prompts: `kvbench replay` turns each 512-token trace block into 32 tokens and sets 16, so a
	// shrunk prompt costs what the trace's prompt would. Default 1; the flat model ignores it.
	StepTokenScale    float64
	PrefillTokensPerS float64 // flat model: prefill throughput for uncached tokens (default 20000)
	DecodeMsPerToken  float64 // flat model: time of one decode step, i.e. per generated token (default 20)
	MaxNumSeqs        int     // running requests per rank (default 256, vLLM's)
	MaxBatchedTokens  int     // token budget per scheduler step, prefill and decode (default 8192)
	// TimeScale divides every simulated duration (2 = twice as fast). Ordering and ratios are
	// kept; absolute latencies shrink. Default 1 (real wall-clock).
	TimeScale float64
	// DefaultMaxTokens is used when a chat request gives no max_tokens (vLLM would allow up to
	// max-model-len; a simulator needs a bound). Completions default to 16 like vLLM.
	DefaultMaxTokens int

	DropEventEvery   int     // drop every Nth batch on the PUB socket (kept in the replay ring)
	StallEventsAfter int     // stop sending after this many batches until unstalled (0 = never)
	FailRate         float64 // share of completion requests answered with HTTP 500 (an in-stream error after acceptance unless HoldHeaders)
	// StreamErrorAfter > 0 ends every stream with an in-stream error after that many tokens
	// (vLLM's `data: {"error": ...}` under status 200, then `data: [DONE]`).
	StreamErrorAfter int

	// By default a stream's status and headers go out when the request is accepted, before its
	// first token, as vLLM's OpenAI server does (its StreamingResponse starts before the engine
	// produced anything; see vllm/entrypoints/openai/chat_completion/serving.py, "we return a
	// success status before we actually start generating text"), and errors after that point
	// are in-stream `data: {"error": ...}` events under 200. HoldHeaders restores the
	// simulator's old timing: the headers wait for the first token, so a failure before it is
	// a plain HTTP error (--headers-at-acceptance=false).
	HoldHeaders bool
	// SSEKeepAliveInterval > 0 writes an SSE comment line `: keep-alive` on a stream each time
	// it sent nothing for that long since its last line (vLLM's --sse-keep-alive-interval; wall
	// time, not scaled). A comment commits the headers.
	SSEKeepAliveInterval time.Duration
	// OmitPromptTokensDetails leaves usage.prompt_tokens_details (the cached token count) out,
	// as vLLM does without --enable-prompt-tokens-details; the simulator reports it by default.
	OmitPromptTokensDetails bool
	Seed                    int64 // seeds the fail-rate draw

	// KVTransfer is --kv-transfer-config (nil: no connector; kv_transfer_params are ignored).
	KVTransfer *KVTransfer
	// KVTransferBytesPerS and KVBytesPerToken give a decode's transfer time for the blocks it
	// pulls (defaults DefaultKVTransferBytesPerS, DefaultKVBytesPerToken; see pd.go).
	KVTransferBytesPerS float64
	KVBytesPerToken     int

	eventClock func() float64 // batch timestamps (tests pin it); nil = time.Now
}

// Defaults returns cfg with every unset field set to the simulator's default.
func (cfg Config) Defaults() Config {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Model == "" {
		cfg.Model = "vllm-sim"
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.NumGPUBlocks == 0 {
		cfg.NumGPUBlocks = 4096
	}
	if cfg.MaxModelLen == 0 {
		cfg.MaxModelLen = 131072
	}
	if cfg.HashAlgo == "" {
		cfg.HashAlgo = "sha256"
	}
	if cfg.HashSeed == "" {
		cfg.HashSeed = "0"
	}
	if cfg.DataParallelSize == 0 {
		cfg.DataParallelSize = 1
	}
	if cfg.KVTransferBytesPerS == 0 {
		cfg.KVTransferBytesPerS = DefaultKVTransferBytesPerS
	}
	if cfg.KVBytesPerToken == 0 {
		cfg.KVBytesPerToken = DefaultKVBytesPerToken
	}
	if kt := cfg.KVTransfer; kt != nil {
		c := *kt
		if c.LoadFailurePolicy == "" {
			c.LoadFailurePolicy = "recompute"
		}
		if c.AbortTimeout == 0 {
			c.AbortTimeout = defaultNixlAbortTimeout
		}
		cfg.KVTransfer = &c
	}
	if cfg.EventLayout == "" {
		cfg.EventLayout = "E3"
	}
	if cfg.BufferSteps == 0 {
		cfg.BufferSteps = 10000
	}
	if cfg.HWM == 0 {
		cfg.HWM = 100000
	}
	cfg.StepModel = CanonicalStepModel(cfg.StepModel)
	if cfg.StepModel == "" {
		cfg.StepModel = DefaultStepModel
		if cfg.PrefillTokensPerS != 0 || cfg.DecodeMsPerToken != 0 {
			cfg.StepModel = "flat"
		}
	}
	if cfg.PrefillTokensPerS == 0 {
		cfg.PrefillTokensPerS = 20000
	}
	if cfg.DecodeMsPerToken == 0 {
		cfg.DecodeMsPerToken = 20
	}
	if cfg.MaxNumSeqs == 0 {
		cfg.MaxNumSeqs = 256
	}
	if cfg.MaxBatchedTokens == 0 {
		cfg.MaxBatchedTokens = 8192
	}
	if cfg.StepTokenScale == 0 {
		cfg.StepTokenScale = 1
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.DefaultMaxTokens == 0 {
		cfg.DefaultMaxTokens = 16
	}
	return cfg
}

// Validate reports the first setting vLLM (or the simulator) would refuse.
func (cfg Config) Validate() error {
	switch {
	case cfg.Port < 0 || cfg.Port > 65535:
		return fmt.Errorf("port %d out of range", cfg.Port)
	case checkEngineKind(cfg.EngineKind) != nil:
		return checkEngineKind(cfg.EngineKind)
	case cfg.BlockSize < 1:
		return fmt.Errorf("block size must be positive, got %d", cfg.BlockSize)
	case cfg.NumGPUBlocks < 2:
		return fmt.Errorf("num-gpu-blocks must be at least 2 (one is vLLM's null block), got %d", cfg.NumGPUBlocks)
	case cfg.MaxModelLen < 1:
		return fmt.Errorf("max-model-len must be positive, got %d", cfg.MaxModelLen)
	case cfg.DataParallelSize < 1 || cfg.DataParallelSize > 1024:
		return fmt.Errorf("data-parallel-size must be 1..1024, got %d", cfg.DataParallelSize)
	case cfg.KVEventsPort < -1 || cfg.KVEventsPort+cfg.DataParallelSize-1 > 65535:
		return fmt.Errorf("kv-events-port %d out of range for %d ranks", cfg.KVEventsPort, cfg.DataParallelSize)
	case cfg.KVReplayPort < -1 || cfg.KVReplayPort+cfg.DataParallelSize-1 > 65535:
		return fmt.Errorf("kv-replay-port %d out of range for %d ranks", cfg.KVReplayPort, cfg.DataParallelSize)
	case cfg.KVSnapshotPort < -1 || cfg.KVSnapshotPort+cfg.DataParallelSize-1 > 65535:
		return fmt.Errorf("kv-snapshot-port %d out of range for %d ranks", cfg.KVSnapshotPort, cfg.DataParallelSize)
	case cfg.KVEventsPort != 0 && cfg.KVEventsConnect != "",
		cfg.KVEventsBind != "" && (cfg.KVEventsPort != 0 || cfg.KVEventsConnect != ""):
		return fmt.Errorf("kv-events-port, kv-events-connect and a kv events bind endpoint are exclusive")
	case cfg.KVReplayBind != "" && cfg.KVReplayPort != 0:
		return fmt.Errorf("kv-replay-port and a kv replay bind endpoint are exclusive")
	case cfg.BufferSteps < 1 || cfg.HWM < 0:
		return fmt.Errorf("buffer steps must be positive and hwm non-negative")
	case cfg.PrefillTokensPerS <= 0 || cfg.DecodeMsPerToken < 0 || cfg.TimeScale <= 0:
		return fmt.Errorf("prefill-tokens-per-s and time-scale must be positive, decode-ms-per-token non-negative")
	case cfg.StepTokenScale < 1 || cfg.StepTokenScale > 1<<16:
		return fmt.Errorf("step-token-scale must be within 1..65536, got %v", cfg.StepTokenScale)
	case !isStepModel(cfg.StepModel) && cfg.StepModel != "flat":
		return fmt.Errorf("step model must be one of %s or flat, got %q", strings.Join(StepModels(), ", "), cfg.StepModel)
	case cfg.MaxNumSeqs < 1 || cfg.MaxBatchedTokens < 1 || cfg.DefaultMaxTokens < 1:
		return fmt.Errorf("max-num-seqs, max-batched-tokens and default max tokens must be positive")
	case cfg.DropEventEvery < 0 || cfg.StallEventsAfter < 0:
		return fmt.Errorf("drop-event-every and stall-events-after must be non-negative")
	case cfg.FailRate < 0 || cfg.FailRate > 1:
		return fmt.Errorf("fail-rate must be within 0..1, got %v", cfg.FailRate)
	case cfg.StreamErrorAfter < 0 || cfg.SSEKeepAliveInterval < 0:
		return fmt.Errorf("stream-error-after and sse-keep-alive-interval must be non-negative")
	}
	if _, err := parseEventShape(cfg.EventLayout); err != nil {
		return err
	}
	if err := cfg.validateKVTransfer(); err != nil {
		return err
	}
	if _, err := strconv.ParseUint(cfg.HashSeed, 10, 32); err != nil && cfg.HashSeed != "random" {
		// What CPython accepts at start-up; vLLM then hashes the string literally.
		return fmt.Errorf("PYTHONHASHSEED must be \"random\" or a decimal integer 0..4294967295, got %q", cfg.HashSeed)
	}
	for _, k := range cfg.APIKeys {
		if k == "" || strings.ContainsAny(k, "\r\n") {
			return fmt.Errorf("api key must be non-empty and one line")
		}
	}
	for _, name := range cfg.LoRAAdapters {
		if name == "" || name == cfg.Model {
			return fmt.Errorf("lora adapter name %q is empty or equals the base model", name)
		}
	}
	return nil
}

// eventsEnabled reports whether the ranks publish KV events (bound or dialled).
func (cfg *Config) eventsEnabled() bool {
	return cfg.KVEventsPort != 0 || cfg.KVEventsConnect != "" || cfg.KVEventsBind != ""
}

// pubBindAddr and replayBindAddr are the endpoints rank binds: the whole endpoint offset by the
// rank when one is given, else Host and the port.
func (cfg *Config) pubBindAddr(rank int) (string, error) {
	if cfg.KVEventsBind != "" {
		return endpointForRank(cfg.KVEventsBind, rank)
	}
	return bindAddr(cfg.Host, cfg.KVEventsPort, rank), nil
}

func (cfg *Config) replayBindAddr(rank int) (string, error) {
	if cfg.KVReplayBind != "" {
		return endpointForRank(cfg.KVReplayBind, rank)
	}
	return bindAddr(cfg.Host, cfg.KVReplayPort, rank), nil
}

// ipv6Endpoint: libzmq binds an IPv6 address only on a socket with ZMQ_IPV6 set.
func ipv6Endpoint(addr string) bool { return strings.Contains(addr, "[") }

// DefaultTopic is the topic used when Config.KVEventsTopic is nil: kvroute's
// "<prefix>@<host>[:<port>]@<model>" with the HTTP port, so sims sharing one host stay apart.
func DefaultTopic(host string, httpPort int, model string) string {
	return fmt.Sprintf("kv@%s:%d@%s", host, httpPort, model)
}

// scaled converts simulated seconds into wall time under the time scale.
func (cfg Config) scaled(seconds float64) time.Duration {
	return time.Duration(seconds / cfg.TimeScale * float64(time.Second))
}

// validateKVTransfer checks what vLLM's KVTransferConfig checks (kv_role among its roles and
// required with a connector; kv_load_failure_policy recompute or fail) and the simulator's
// own figures.
func (cfg Config) validateKVTransfer() error {
	if cfg.KVTransferBytesPerS < 0 || cfg.KVBytesPerToken < 0 {
		return fmt.Errorf("kv-transfer-bytes-per-s and kv-bytes-per-token must be non-negative")
	}
	kt := cfg.KVTransfer
	if kt == nil {
		return nil
	}
	switch {
	case kt.Connector == "":
		return fmt.Errorf("kv-transfer-config: kv_connector is required")
	case kt.Role == "":
		return fmt.Errorf("kv-transfer-config: please specify kv_role when kv_connector is set, supported roles are kv_producer, kv_consumer, kv_both")
	case kt.Role != "kv_producer" && kt.Role != "kv_consumer" && kt.Role != "kv_both":
		return fmt.Errorf("kv-transfer-config: unsupported kv_role %q, supported roles are kv_producer, kv_consumer, kv_both", kt.Role)
	case kt.LoadFailurePolicy != "recompute" && kt.LoadFailurePolicy != "fail":
		return fmt.Errorf("kv-transfer-config: kv_load_failure_policy %q: want recompute or fail", kt.LoadFailurePolicy)
	case kt.SideChannelPort < 0 || kt.SideChannelPort+cfg.DataParallelSize-1 > 65535:
		return fmt.Errorf("side channel port %d out of range for %d ranks", kt.SideChannelPort, cfg.DataParallelSize)
	case kt.AbortTimeout < 0:
		return fmt.Errorf("abort timeout must be non-negative")
	}
	return nil
}
