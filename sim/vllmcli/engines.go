package vllmcli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/engineflags"
	"github.com/kvroute/kvroute/internal/suggest"
	"github.com/kvroute/kvroute/internal/vllmrelease"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// SGLang's and TensorRT-LLM's servers as the operator renders them (controllers/render
// sglang.go, trtllm.go), read onto the simulator with its engine kind set, so the rendered
// engine runs on vllm-sim as vLLM's does. The option names are internal/engineflags' (the
// operator's argument check reads the same lists); what each mapped option means is read from:
//   - SGLang: python/sglang/srt/server_args.py of sgl-project/sglang at 001067fffe33 (defaults:
//     --host 127.0.0.1, --port 30000, --page-size 1, --dp-size 1; --enable-cache-report puts
//     cached_tokens in usage; argparse with dashes only and unique-prefix abbreviations, no
//     positional arguments) and python/sglang/srt/disaggregation/kv_events.py at 006d053f182f
//     (KVEventsConfig; publisher "null" unless given; each DP rank offsets both ports by its
//     rank). Newer SGLang (612d579090db) also wants enable_kv_cache_events true to publish;
//     the simulator follows the pinned image's reading and publishes on publisher "zmq" unless
//     enable_kv_cache_events is given false.
//   - TensorRT-LLM: tensorrt_llm/commands/serve.py of NVIDIA/TensorRT-LLM at 00209af149e7 (click:
//     MODEL positional, served under that name; --host localhost, --port 8000; options spelt
//     with underscores as declared; trust_remote_code, enable_chunked_prefill and
//     fail_fast_on_attention_window_too_large are switches; --config / --extra_llm_api_options
//     name a YAML file of LLM API arguments) and tensorrt_llm/llmapi/llm_args.py (KvCacheConfig:
//     enable_block_reuse default true, tokens_per_block default 32; with enable_attention_dp
//     each of the tp_size ranks is an attention-DP rank with its own cache and event stream on
//     base port + rank; the publisher always binds).

// SGLangModule is the module `python3 -m` runs for SGLang's server.
const SGLangModule = "sglang.launch_server"

// engineOpt is one option the simulator reads for an engine other than vLLM.
type engineOpt struct {
	takesValue bool // false: a switch (store_true / is_flag)
	use        use
}

// sglangOpts are the SGLang options with a meaning for the simulator or none it can give; every
// other name in engineflags.SGLang is accepted, its values skipped, and reported as ignored.
var sglangOpts = map[string]engineOpt{
	"model-path": {true, mapped}, "model": {true, mapped}, "served-model-name": {true, mapped},
	"host": {true, mapped}, "port": {true, mapped}, "dp-size": {true, mapped},
	"data-parallel-size": {true, mapped}, "page-size": {true, mapped},
	"context-length": {true, mapped}, "max-running-requests": {true, mapped},
	"api-key": {true, mapped}, "kv-events-config": {true, mapped},
	"enable-metrics": {false, mapped}, "enable-cache-report": {false, mapped},
	"enable-lora": {false, mapped}, "lora-paths": {true, mapped},
	"disable-radix-cache": {false, unsupported}, "config": {true, unsupported},
	"ssl-keyfile": {true, unsupported}, "ssl-certfile": {true, unsupported},
	"ssl-ca-certs": {true, unsupported}, "ssl-keyfile-password": {true, unsupported},
	"enable-ssl-refresh": {false, unsupported}, "nnodes": {true, unsupported},
	"node-rank": {true, unsupported}, "dist-init-addr": {true, unsupported},
	"grpc-mode": {false, unsupported}, "smg-grpc-mode": {false, unsupported},
	"skip-tokenizer-init": {false, unsupported},
}

// SGLang maps the arguments after `python3 -m sglang.launch_server` onto base, as Serve does
// for vLLM's: $(VAR) expanded from env, SGLang's defaults for the fields its options own,
// EngineKind sglang. An option SGLang does not have, or one whose effect the simulator cannot
// give, is refused.
func SGLang(base vllmsim.Config, args []string, env func(string) (string, bool)) (Result, error) {
	cfg := base
	cfg.EngineKind = vllmsim.KindSGLang
	cfg.Host, cfg.Port, cfg.BlockSize, cfg.HashAlgo, cfg.DataParallelSize = "127.0.0.1", 30000, 1, "sha256", 1
	cfg.KVEventsPort, cfg.KVEventsConnect, cfg.KVReplayPort, cfg.KVEventsBind, cfg.KVReplayBind, cfg.KVSnapshotPort = 0, "", 0, "", "", 0
	cfg.OmitPromptTokensDetails = true
	empty := ""
	cfg.KVEventsTopic = &empty
	var ignoredFlags []string
	var model, served, events string
	for i := 0; i < len(args); i++ {
		a := Expand(args[i], env)
		if a == "-h" || a == "--help" {
			return Result{}, ErrHelp
		}
		if !strings.HasPrefix(a, "--") {
			return Result{}, fmt.Errorf("%q: SGLang's launch server takes no positional arguments (the model is --model-path)", a)
		}
		name, value, hasValue := strings.Cut(a[2:], "=")
		name, err := sglangName(name)
		if err != nil {
			return Result{}, err
		}
		opt, known := sglangOpts[name]
		if !known {
			// Options the simulator does not model: their values are every argument up to the
			// next option (SGLang has no positional arguments, so nothing else can follow).
			for !hasValue && i+1 < len(args) && !isOptionArg(args[i+1]) {
				i++
			}
			ignoredFlags = append(ignoredFlags, "--"+name)
			continue
		}
		if opt.use == unsupported {
			return Result{}, fmt.Errorf("--%s: vllm-sim does not simulate this SGLang option", name)
		}
		var vals []string
		switch {
		case !opt.takesValue && hasValue:
			return Result{}, fmt.Errorf("--%s=%s: --%s takes no value", name, value, name)
		case !opt.takesValue:
		case hasValue:
			vals = []string{value}
		default:
			for i+1 < len(args) && !isOptionArg(args[i+1]) {
				i++
				vals = append(vals, Expand(args[i], env))
				if name != "lora-paths" {
					break
				}
			}
			if len(vals) == 0 {
				return Result{}, fmt.Errorf("--%s: expected a value", name)
			}
		}
		spelt := "--" + name
		switch name {
		case "model-path", "model":
			model = vals[0]
		case "served-model-name":
			served = vals[0]
		case "host":
			cfg.Host = vals[0]
		case "port":
			err = setInt(&cfg.Port, spelt, vals[0])
		case "dp-size", "data-parallel-size":
			err = setInt(&cfg.DataParallelSize, spelt, vals[0])
		case "page-size":
			err = setInt(&cfg.BlockSize, spelt, vals[0])
		case "context-length":
			err = setInt(&cfg.MaxModelLen, spelt, vals[0])
		case "max-running-requests":
			err = setInt(&cfg.MaxNumSeqs, spelt, vals[0])
		case "api-key":
			cfg.APIKeys = []string{vals[0]}
		case "kv-events-config":
			events = vals[0]
		case "enable-cache-report":
			cfg.OmitPromptTokensDetails = false
		case "enable-metrics", "enable-lora":
			// The simulator always serves /metrics; adapters are served when --lora-paths names them.
		case "lora-paths":
			cfg.LoRAAdapters = nil
			for _, v := range vals {
				// NAME=PATH, or a path served under itself (server_args.py's LoRA paths).
				n, _, _ := strings.Cut(v, "=")
				cfg.LoRAAdapters = append(cfg.LoRAAdapters, n)
			}
		}
		if err != nil {
			return Result{}, err
		}
	}
	cfg.Model = served
	if cfg.Model == "" {
		cfg.Model = model
	}
	if cfg.Model == "" {
		return Result{}, errors.New("--model-path is required")
	}
	wild := applyWildHost(&cfg, env)
	if events != "" {
		if err := applyPublisher(&cfg, "--kv-events-config", events, wild, false); err != nil {
			return Result{}, err
		}
	}
	return Result{Config: cfg, Ignored: ignoredFlags}, nil
}

// sglangName resolves a long option name as SGLang's argparse does: exact, or a unique prefix.
func sglangName(name string) (string, error) {
	if _, ok := engineflags.SGLang[name]; ok {
		return name, nil
	}
	if strings.HasPrefix(name, "no-") {
		if neg, ok := engineflags.SGLang[name[3:]]; ok && neg {
			return name[3:], nil // --no-X of a BooleanOptionalAction: none the simulator maps
		}
	}
	var matches []string
	for n := range engineflags.SGLang {
		if strings.HasPrefix(n, name) {
			matches = append(matches, n)
		}
	}
	switch len(matches) {
	case 1:
		return matches[0], nil
	case 0:
		all := make([]string, 0, len(engineflags.SGLang))
		for n := range engineflags.SGLang {
			all = append(all, "--"+n)
		}
		sort.Strings(all)
		msg := fmt.Sprintf("--%s: not an option of `python3 -m %s`", name, SGLangModule)
		if near := suggest.Nearest("--"+name, all); near != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", near)
		}
		return "", errors.New(msg)
	}
	slices.Sort(matches)
	return "", fmt.Errorf("--%s: ambiguous, could be --%s", name, strings.Join(matches, ", --"))
}

// trtllmSwitches are trtllm-serve's is_flag options (serve.py at 00209af149e7: bool
// parameters of get_llm_args); every other option takes one value.
var trtllmSwitches = map[string]bool{
	"trust_remote_code": true, "enable_chunked_prefill": true, "fail_fast_on_attention_window_too_large": true,
}

// trtllmUnsupported are trtllm-serve options the simulator cannot give: a disaggregated role,
// a cluster or metadata server it would have to join.
var trtllmUnsupported = map[string]bool{
	"server_role": true, "disagg_cluster_uri": true, "metadata_server_config_file": true,
}

// TRTLLM maps the arguments after `trtllm-serve` onto base, reading the --config YAML with
// readFile, as Serve does for vLLM's: $(VAR) expanded from env, trtllm-serve's defaults for the
// fields its options own, EngineKind trtllm.
func TRTLLM(base vllmsim.Config, args []string, env func(string) (string, bool), readFile func(string) ([]byte, error)) (Result, error) {
	cfg := base
	cfg.EngineKind = vllmsim.KindTRTLLM
	cfg.Host, cfg.Port, cfg.BlockSize, cfg.HashAlgo, cfg.DataParallelSize = "localhost", 8000, 32, "sha256", 1
	cfg.KVEventsPort, cfg.KVEventsConnect, cfg.KVReplayPort, cfg.KVEventsBind, cfg.KVReplayBind, cfg.KVSnapshotPort = 0, "", 0, "", "", 0
	cfg.OmitPromptTokensDetails = false // usage carries prompt_tokens_details.cached_tokens (kinds.go)
	empty := ""
	cfg.KVEventsTopic = &empty
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:] // trtllm-serve serve MODEL: the group's default command, spelt out
	}
	var ignoredFlags, models []string
	tp, configPath := 1, ""
	for i := 0; i < len(args); i++ {
		a := Expand(args[i], env)
		if a == "-h" || a == "--help" {
			return Result{}, ErrHelp
		}
		if !strings.HasPrefix(a, "--") {
			models = append(models, a)
			continue
		}
		name, value, hasValue := strings.Cut(a[2:], "=")
		if _, ok := engineflags.TRTLLM[name]; !ok {
			msg := fmt.Sprintf("--%s: not an option of `trtllm-serve`", name)
			all := make([]string, 0, len(engineflags.TRTLLM))
			for n := range engineflags.TRTLLM {
				all = append(all, "--"+n)
			}
			sort.Strings(all)
			if near := suggest.Nearest("--"+name, all); near != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", near)
			}
			return Result{}, errors.New(msg)
		}
		if trtllmUnsupported[name] {
			return Result{}, fmt.Errorf("--%s: vllm-sim does not simulate this trtllm-serve option", name)
		}
		if trtllmSwitches[name] {
			if hasValue {
				return Result{}, fmt.Errorf("--%s=%s: --%s takes no value", name, value, name)
			}
			ignoredFlags = append(ignoredFlags, "--"+name)
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return Result{}, fmt.Errorf("--%s: expected a value", name)
			}
			i++
			value = Expand(args[i], env)
		}
		spelt := "--" + name
		var err error
		switch name {
		case "host":
			cfg.Host = value
		case "port":
			err = setInt(&cfg.Port, spelt, value)
		case "tp_size", "tensor_parallel_size":
			err = setInt(&tp, spelt, value)
		case "max_seq_len":
			err = setInt(&cfg.MaxModelLen, spelt, value)
		case "max_batch_size":
			err = setInt(&cfg.MaxNumSeqs, spelt, value)
		case "max_num_tokens":
			err = setInt(&cfg.MaxBatchedTokens, spelt, value)
		case "config", "extra_llm_api_options":
			configPath = value
		default:
			ignoredFlags = append(ignoredFlags, spelt)
		}
		if err != nil {
			return Result{}, err
		}
	}
	if len(models) != 1 {
		return Result{}, fmt.Errorf("trtllm-serve takes one MODEL, got %q", models)
	}
	// trtllm-serve has no served-name option: /v1/models lists MODEL as given, or the
	// directory's name when MODEL is a local directory (OpenAIServer.__init__ in
	// tensorrt_llm/serve/openai_server.py at 00057725d959); requests may name any model.
	cfg.Model = models[0]
	if fi, err := os.Stat(models[0]); err == nil && fi.IsDir() {
		cfg.Model = filepath.Base(models[0])
	}
	wild := applyWildHost(&cfg, env)
	if configPath != "" {
		raw, err := readFile(configPath)
		if err != nil {
			return Result{}, fmt.Errorf("--config: %v", err)
		}
		ign, err := applyTRTLLMConfig(&cfg, raw, tp, wild)
		if err != nil {
			return Result{}, fmt.Errorf("--config %s: %v", configPath, err)
		}
		ignoredFlags = append(ignoredFlags, ign...)
	}
	return Result{Config: cfg, Ignored: ignoredFlags}, nil
}

// trtllmKVCache is the part of KvCacheConfig the simulator models.
type trtllmKVCache struct {
	EnableBlockReuse *bool           `json:"enable_block_reuse"`
	TokensPerBlock   *int            `json:"tokens_per_block"`
	KVEvents         json.RawMessage `json:"kv_events_config"`
}

// applyTRTLLMConfig reads the LLM API arguments the --config file holds: the attention-DP
// switch and the KV cache's block reuse, block size and event publisher. Other keys are
// GPU-side settings, returned as ignored (config.KEY).
func applyTRTLLMConfig(cfg *vllmsim.Config, raw []byte, tp int, wild string) ([]string, error) {
	var top map[string]json.RawMessage
	if err := yaml.Unmarshal(raw, &top); err != nil {
		return nil, err
	}
	var ignoredKeys []string
	dp := false
	for k, v := range top {
		switch k {
		case "enable_attention_dp":
			if err := json.Unmarshal(v, &dp); err != nil {
				return nil, fmt.Errorf("enable_attention_dp: %v", err)
			}
		case "kv_cache_config":
			var kc map[string]json.RawMessage
			if err := json.Unmarshal(v, &kc); err != nil {
				return nil, fmt.Errorf("kv_cache_config: %v", err)
			}
			for kk, vv := range kc {
				var err error
				switch kk {
				case "enable_block_reuse":
					var on bool
					if err = json.Unmarshal(vv, &on); err == nil && !on {
						return nil, errors.New("kv_cache_config.enable_block_reuse false: vllm-sim always caches prefixes (kvroute routes on that cache)")
					}
				case "tokens_per_block":
					err = json.Unmarshal(vv, &cfg.BlockSize)
				case "kv_events_config":
					err = applyPublisher(cfg, "kv_cache_config.kv_events_config", string(vv), wild, true)
				default:
					ignoredKeys = append(ignoredKeys, "config.kv_cache_config."+kk)
				}
				if err != nil {
					return nil, fmt.Errorf("kv_cache_config.%s: %v", kk, err)
				}
			}
		default:
			ignoredKeys = append(ignoredKeys, "config."+k)
		}
	}
	if dp {
		cfg.DataParallelSize = tp
	}
	sort.Strings(ignoredKeys)
	return ignoredKeys, nil
}

// publisher is the KVEventsConfig SGLang and TensorRT-LLM take (the fields of vLLM's, which
// both mirror); unknown keys are refused, as both engines' pydantic models do.
type publisher struct {
	Enable         *bool   `json:"enable_kv_cache_events"`
	Publisher      *string `json:"publisher"`
	Endpoint       *string `json:"endpoint"`
	ReplayEndpoint *string `json:"replay_endpoint"`
	BufferSteps    *int    `json:"buffer_steps"`
	HWM            *int    `json:"hwm"`
	MaxQueueSize   *int    `json:"max_queue_size"`
	Topic          *string `json:"topic"`
}

// applyPublisher sets the event sockets. needEnable: TensorRT-LLM publishes only with
// enable_kv_cache_events true; SGLang (the pinned reading) when publisher is zmq, unless
// enable_kv_cache_events is given false. TensorRT-LLM always binds its endpoint; SGLang binds
// one holding "*" (or "::", ipc, inproc) and connects to any other, as vLLM does.
func applyPublisher(cfg *vllmsim.Config, what, raw, wild string, needEnable bool) error {
	var pc publisher
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&pc); err != nil {
		return fmt.Errorf("%s: %v", what, err)
	}
	enabled := pc.Enable != nil && *pc.Enable
	kind := "null"
	if needEnable && enabled {
		kind = "zmq"
	}
	if pc.Publisher != nil {
		kind = *pc.Publisher
	}
	if kind != "zmq" && kind != "null" {
		return fmt.Errorf("%s: publisher %q: want zmq or null", what, kind)
	}
	if pc.Topic != nil {
		cfg.KVEventsTopic = pc.Topic
	}
	if pc.BufferSteps != nil {
		cfg.BufferSteps = *pc.BufferSteps
	}
	if pc.HWM != nil {
		cfg.HWM = *pc.HWM
	}
	if kind != "zmq" || (needEnable && !enabled) || (pc.Enable != nil && !*pc.Enable) {
		return nil
	}
	endpoint := "tcp://*:5557"
	if pc.Endpoint != nil {
		endpoint = *pc.Endpoint
	}
	if needEnable || vllmrelease.BindsEndpoint(endpoint) {
		cfg.KVEventsBind = wildcardTo(endpoint, wild)
	} else {
		cfg.KVEventsConnect = endpoint
	}
	if pc.ReplayEndpoint != nil && *pc.ReplayEndpoint != "" {
		cfg.KVReplayBind = wildcardTo(*pc.ReplayEndpoint, wild)
	}
	return nil
}

// applyWildHost binds every interface, or the address WildcardHostEnv gives, when the host is
// a wildcard, and returns that address for the event endpoints.
func applyWildHost(cfg *vllmsim.Config, env func(string) (string, bool)) string {
	wild, _ := env(WildcardHostEnv)
	if isWildcardHost(cfg.Host) && wild != "" {
		cfg.Host = wild
	}
	return wild
}

// isOptionArg: an argument starting with "-" is an option unless it reads as a number.
func isOptionArg(a string) bool {
	if !strings.HasPrefix(a, "-") || a == "-" {
		return false
	}
	_, err := strconv.ParseFloat(a, 64)
	return err != nil
}
