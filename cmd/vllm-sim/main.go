// Command vllm-sim runs the vLLM-compatible engine simulator (package sim/vllmsim) with
// vLLM-style flags. PYTHONHASHSEED is read from the environment ("0" when unset: unlike vLLM,
// whose unset seed is random, the simulator stays reproducible). Like vLLM, --api-key (here
// repeatable) takes precedence over VLLM_API_KEY, and the environment variable keeps the key
// out of the process's argument list.
//
// Run as `vllm-sim serve MODEL ...`, or through a link named vllm as `vllm serve MODEL ...`
// (the image has one), it takes vLLM's own command line instead (package sim/vllmcli): the
// engine command kvroute's operator renders runs unchanged. The simulator's own settings
// (timing, faults, cache size) then come from VLLM_SIM_ARGS, in this command's flag syntax,
// separated by spaces; vLLM's flags win where both set a field.
//
// Likewise, invoked through a link named python3 as `python3 -m sglang.launch_server ...` it
// reads SGLang's launch-server options, and through a link named trtllm-serve it reads
// trtllm-serve's options and its --config file, with the engine kind set to match: the
// operator's rendered SGLang and TensorRT-LLM engines run on it too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/version"
	"github.com/kvroute/kvroute/sim/vllmcli"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[0], os.Args[1:], os.Stderr))
}

// config reads the command line: vLLM's when invoked as vllm or with serve first, the
// simulator's otherwise.
func config(argv0 string, args []string, stderr io.Writer) (vllmsim.Config, error) {
	switch filepath.Base(argv0) {
	case "python3", "python":
		if len(args) < 2 || args[0] != "-m" || args[1] != vllmcli.SGLangModule {
			return vllmsim.Config{}, fmt.Errorf("run as python3, the simulator takes `python3 -m %s [flags]` only", vllmcli.SGLangModule)
		}
		return engineConfig("SGLang", stderr, func(base vllmsim.Config) (vllmcli.Result, error) {
			return vllmcli.SGLang(base, args[2:], os.LookupEnv)
		})
	case "trtllm-serve":
		return engineConfig("trtllm-serve", stderr, func(base vllmsim.Config) (vllmcli.Result, error) {
			return vllmcli.TRTLLM(base, args, os.LookupEnv, os.ReadFile)
		})
	}
	asVLLM := filepath.Base(argv0) == "vllm"
	if asVLLM && (len(args) == 0 || args[0] != "serve") {
		return vllmsim.Config{}, fmt.Errorf("run as vllm, the simulator takes `vllm serve MODEL [flags]` only")
	}
	if len(args) == 0 || args[0] != "serve" {
		return parseFlags(args, stderr)
	}
	base, err := parseFlags(strings.Fields(os.Getenv(vllmcli.SimArgsEnv)), stderr)
	if err != nil {
		return base, fmt.Errorf("%s: %w", vllmcli.SimArgsEnv, err)
	}
	res, err := vllmcli.Serve(base, args[1:], os.LookupEnv)
	if errors.Is(err, vllmcli.ErrHelp) {
		fmt.Fprint(stderr, serveUsage)
		return base, flag.ErrHelp
	}
	if err != nil {
		return base, err
	}
	if len(res.Ignored) > 0 {
		fmt.Fprintf(stderr, "vllm-sim: ignoring vLLM flags the simulator does not model: %s\n", strings.Join(res.Ignored, " "))
	}
	return res.Config, nil
}

// engineConfig reads another engine's command line (SGLang's launch server, trtllm-serve) onto
// the simulator's own settings from VLLM_SIM_ARGS, as `vllm serve` is read.
func engineConfig(engine string, stderr io.Writer, parse func(vllmsim.Config) (vllmcli.Result, error)) (vllmsim.Config, error) {
	base, err := parseFlags(strings.Fields(os.Getenv(vllmcli.SimArgsEnv)), stderr)
	if err != nil {
		return base, fmt.Errorf("%s: %w", vllmcli.SimArgsEnv, err)
	}
	res, err := parse(base)
	if errors.Is(err, vllmcli.ErrHelp) {
		fmt.Fprintf(stderr, "vllm-sim, simulating %s: the options the operator renders are read (internal/engineflags lists the rest);\nthe simulator's own flags (vllm-sim -h) go in %s.\n", engine, vllmcli.SimArgsEnv)
		return base, flag.ErrHelp
	}
	if err != nil {
		return base, err
	}
	if len(res.Ignored) > 0 {
		fmt.Fprintf(stderr, "vllm-sim: ignoring %s options the simulator does not model: %s\n", engine, strings.Join(res.Ignored, " "))
	}
	return res.Config, nil
}

const serveUsage = `usage: vllm serve MODEL [vLLM flags]   (vllm-sim, simulating vLLM)

Simulated: --served-model-name, --host, --port, --block-size, --prefix-caching-hash-algo,
--enable-prefix-caching, --data-parallel-size/-dp, --max-model-len, --max-num-seqs,
--max-num-batched-tokens, --num-gpu-blocks-override, --enable-prompt-tokens-details,
--lora-modules, --api-key, --sse-keep-alive-interval, --kv-events-config (endpoint, replay_endpoint,
topic, hwm, buffer_steps), --kv-transfer-config (kv_connector, kv_role, engine_id,
kv_load_failure_policy; VLLM_NIXL_SIDE_CHANNEL_HOST/PORT, VLLM_NIXL_ABORT_REQUEST_TIMEOUT). Other vLLM flags are accepted and ignored (one log line names them),
except those whose effect the simulator cannot give (TLS, --uds, multi-node DP, --config,
--no-enable-prefix-caching). $(VAR) in arguments expands from the environment as in Kubernetes.
The simulator's own flags (vllm-sim -h) go in VLLM_SIM_ARGS.
`

// errVersion is parseFlags' answer to --version; run prints the version to versionOut.
var errVersion = errors.New("version requested")

// versionOut is where --version prints (a test swaps it).
var versionOut io.Writer = os.Stdout

type keyFlags []string

func (k *keyFlags) String() string     { return strings.Repeat("*", len(*k)) } // never print keys
func (k *keyFlags) Set(v string) error { *k = append(*k, v); return nil }

func parseFlags(args []string, stderr io.Writer) (vllmsim.Config, error) {
	var cfg vllmsim.Config
	var keys keyFlags
	fs := flag.NewFlagSet("vllm-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Host, "host", "127.0.0.1", "listen host (HTTP and bound ZMQ sockets)")
	fs.IntVar(&cfg.Port, "port", 8000, "HTTP port (0 = any free port)")
	fs.StringVar(&cfg.Model, "model", "vllm-sim", "served model name")
	lora := fs.String("lora-modules", "", "comma-separated LoRA adapter names (NAME or NAME=PATH)")
	fs.IntVar(&cfg.BlockSize, "block-size", 16, "tokens per KV block")
	fs.IntVar(&cfg.NumGPUBlocks, "num-gpu-blocks", 4096, "KV blocks per rank (one is vLLM's null block)")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", 131072, "longest prompt+output in tokens")
	fs.StringVar(&cfg.HashAlgo, "hash-algo", "sha256", "prefix caching hash: sha256, sha256_cbor, xxhash, xxhash_cbor")
	fs.StringVar(&cfg.HashAlgo, "prefix-caching-hash-algo", "sha256", "alias of --hash-algo (vLLM's name)")
	fs.IntVar(&cfg.DataParallelSize, "data-parallel-size", 1, "DP ranks, each with its own cache, scheduler and event stream")
	fs.IntVar(&cfg.KVEventsPort, "kv-events-port", 0, "PUB bind port of rank 0 (rank r: port+r); 0 = off, -1 = any free port")
	fs.StringVar(&cfg.KVEventsConnect, "kv-events-connect", "", "dial this tcp://HOST:PORT instead of binding (rank r: port+r)")
	fs.IntVar(&cfg.KVReplayPort, "kv-replay-port", 0, "ROUTER replay bind port of rank 0 (rank r: port+r); 0 = off")
	fs.IntVar(&cfg.KVSnapshotPort, "kv-snapshot-port", 0, "vLLM's snapshot_endpoint port of rank 0 (rank r: port+r): 24-byte sequence frames with a per-process publisher id, 1-s heartbeats, and a snapshot ROUTER; 0 = off, -1 = any free port")
	topic := fs.String("kv-events-topic", "", "event topic (default kv@HOST:PORT@MODEL; pass an empty value for vLLM's empty topic)")
	fs.StringVar(&cfg.EventLayout, "event-layout", "E3", "KV-event batch shape: E1 (array batch, array events; kv_events.py before #42892), "+
		"E2 (map batch, map events; newest upstream kv_events.py), E3 (array batch, map events; seen in a live v0.26.0 capture); aliases array = E1, map = E3")
	fs.StringVar(&cfg.EngineKind, "engine-kind", "vllm", "whose HTTP surface and KV-event wire to speak: vllm, sglang (positional events, no replay topic frame, /tokenize text only, sglang: metrics) or trtllm (map events with int64 hashes, /_internal/tokenize, /prometheus/metrics)")
	replayTopic := fs.Bool("replay-topic-frame", true, "send the topic frame in replay replies (vLLM PR #45177, June 2026); false = the older [seq, payload] replies")
	fs.IntVar(&cfg.BufferSteps, "kv-buffer-steps", 10000, "replay ring length in batches")
	fs.IntVar(&cfg.HWM, "kv-hwm", 100000, "PUB send high-water mark")
	fs.StringVar(&cfg.StepModel, "step-model", "", "step-time model: vllm-0.20.1-b300 (fitted to vLLM 0.20.1's per-step records, Qwen3-32B TP1 on one B300; README), "+
		"splitwise-h100 (the same formula fitted to the Splitwise paper's H100 Llama2-70B measurements; the old name calibrated is accepted) or flat "+
		"(the two rates below); default vllm-0.20.1-b300, or flat when either rate is given")
	fs.Float64Var(&cfg.StepTokenScale, "step-token-scale", 1, "calibrated step models: each token counts as this many (for shrunk prompts, e.g. kvbench replay's 512/32 = 16)")
	fs.Float64Var(&cfg.PrefillTokensPerS, "prefill-tokens-per-s", 20000, "flat step model: prefill throughput for uncached tokens")
	fs.Float64Var(&cfg.DecodeMsPerToken, "decode-ms-per-token", 20, "flat step model: decode step time, i.e. per generated token")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", 256, "running requests per rank")
	fs.IntVar(&cfg.MaxBatchedTokens, "max-batched-tokens", 8192, "token budget per scheduler step")
	fs.IntVar(&cfg.MaxBatchedTokens, "max-num-batched-tokens", 8192, "alias of --max-batched-tokens (vLLM's name)")
	fs.Float64Var(&cfg.TimeScale, "time-scale", 1, "divide every simulated duration by this")
	fs.IntVar(&cfg.DefaultMaxTokens, "default-max-tokens", 16, "max_tokens of a chat request that gives none")
	fs.IntVar(&cfg.DropEventEvery, "drop-event-every", 0, "drop every Nth event batch on PUB (kept for replay)")
	fs.IntVar(&cfg.StallEventsAfter, "stall-events-after", 0, "stop publishing after N batches until POST /debug/events {\"stall\":false}")
	fs.Float64Var(&cfg.FailRate, "fail-rate", 0, "share of completion requests answered with HTTP 500")
	fs.Int64Var(&cfg.Seed, "seed", 0, "seed of the fail-rate draw")
	fs.Var(&keys, "api-key", "require Authorization: Bearer KEY on /v1/... as vLLM does (repeatable; default $VLLM_API_KEY)")
	fs.IntVar(&cfg.StreamErrorAfter, "stream-error-after", 0, "end every stream with an in-stream error event after N tokens (0 = never)")
	atAcceptance := fs.Bool("headers-at-acceptance", true, "send a stream's 200 and headers on acceptance, before the first token, as vLLM does (errors after that are in-stream events); false holds them until the first token")
	// vLLM's flag (PR #51034, FrontendArgs in vllm/entrypoints/openai/cli_args.py): seconds,
	// default 0 = off. vLLM takes whole seconds; the sim also takes fractions, so tests can run
	// keep-alives in milliseconds.
	keepAlive := fs.Float64("sse-keep-alive-interval", 0, "seconds of silence after which a stream gets a ': keep-alive' comment, as vLLM writes it (0 = off; vLLM takes whole seconds)")
	fs.Float64Var(&cfg.KVTransferBytesPerS, "kv-transfer-bytes-per-s", vllmsim.DefaultKVTransferBytesPerS,
		"P/D: bandwidth a decode pulls a prefill engine's KV blocks at (default a 200 Gb/s RDMA NIC's line rate)")
	fs.IntVar(&cfg.KVBytesPerToken, "kv-bytes-per-token", vllmsim.DefaultKVBytesPerToken,
		"P/D: KV bytes per token moved (default Llama-3.1-8B in bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes)")
	kvTransfer := fs.String("kv-transfer-config", "", `P/D: vLLM's --kv-transfer-config JSON, e.g. {"kv_connector":"NixlConnector","kv_role":"kv_both"} (the side channel from VLLM_NIXL_SIDE_CHANNEL_HOST/PORT, as under serve)`)
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if *kvTransfer != "" {
		if err := vllmcli.ApplyKVTransfer(&cfg, *kvTransfer, os.LookupEnv); err != nil {
			return cfg, err
		}
	}
	if *showVersion {
		return cfg, errVersion
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	rates := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "kv-events-topic":
			cfg.KVEventsTopic = topic
		case "prefill-tokens-per-s", "decode-ms-per-token":
			rates = true
		}
	})
	if !rates && cfg.StepModel == "" {
		cfg.PrefillTokensPerS, cfg.DecodeMsPerToken = 0, 0 // the default calibrated model (Config.Defaults)
	}
	if *lora != "" {
		for _, m := range strings.Split(*lora, ",") {
			name, _, _ := strings.Cut(m, "=")
			cfg.LoRAAdapters = append(cfg.LoRAAdapters, name)
		}
	}
	cfg.ReplayNoTopicFrame = !*replayTopic
	cfg.HashSeed = os.Getenv("PYTHONHASHSEED")
	// vLLM: tokens = args.api_key or [VLLM_API_KEY], empty ones dropped.
	cfg.APIKeys = keys
	if len(keys) == 0 {
		if k := os.Getenv("VLLM_API_KEY"); k != "" {
			cfg.APIKeys = []string{k}
		}
	}
	if !(*keepAlive >= 0 && *keepAlive <= 86400) {
		return cfg, fmt.Errorf("--sse-keep-alive-interval must be within 0..86400 seconds, got %v", *keepAlive)
	}
	cfg.SSEKeepAliveInterval = time.Duration(*keepAlive * float64(time.Second))
	cfg.HoldHeaders = !*atAcceptance
	return cfg, nil
}

func run(ctx context.Context, argv0 string, args []string, stderr io.Writer) int {
	cfg, err := config(argv0, args, stderr)
	if err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		if err == errVersion {
			version.Print(versionOut, "vllm-sim")
			return 0
		}
		fmt.Fprintln(stderr, "vllm-sim:", err)
		return 2
	}
	sim, err := vllmsim.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "vllm-sim:", err)
		return 2
	}
	if err := sim.Start(ctx); err != nil {
		fmt.Fprintln(stderr, "vllm-sim:", err)
		return 1
	}
	fmt.Fprintf(stderr, "vllm-sim: serving %s on http://%s (%d ranks, topic %q, events %v, replay %v)\n",
		sim.Config().Model, sim.Addr(), sim.Config().DataParallelSize, sim.Topic(),
		sim.EventEndpoints(), sim.ReplayEndpoints())
	<-ctx.Done()
	_ = sim.Close()
	return 0
}
