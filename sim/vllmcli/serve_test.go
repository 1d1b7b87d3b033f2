package vllmcli

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim/vllmsim"
)

func envOf(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestExpandAsKubernetes(t *testing.T) {
	env := envOf("POD_IP", "10.0.0.7", "EMPTY", "")
	for _, c := range []struct{ in, want string }{
		{"kv@$(POD_IP)@m", "kv@10.0.0.7@m"},
		{"$(POD_IP)$(POD_IP)", "10.0.0.710.0.0.7"},
		{"$(NOPE)", "$(NOPE)"},      // unknown: left as written
		{"a$(EMPTY)b", "ab"},        // known and empty
		{"$$(POD_IP)", "$(POD_IP)"}, // escaped
		{"cost $$5", "cost $5"},     // "$$" is one "$"
		{"$x $ $", "$x $ $"},        // "$" before anything else stays
		{"$(POD_IP", "$(POD_IP"},    // unclosed
		{"$()", "$()"},              // empty name
		{`{"topic":"$(POD_IP)"}`, `{"topic":"10.0.0.7"}`},
	} {
		if got := Expand(c.in, env); got != c.want {
			t.Errorf("Expand(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestServeFlags(t *testing.T) {
	base := vllmsim.Config{Model: "base", Port: 1234, Host: "127.0.0.1", MaxModelLen: 777, NumGPUBlocks: 99}
	env := envOf("POD_IP", "10.1.2.3")
	for _, c := range []struct {
		name    string
		args    []string
		env     func(string) (string, bool)
		check   func(vllmsim.Config) bool
		ignored string // the ignored flags, space-separated
		err     string // a substring of the error; empty: no error
	}{
		{name: "vLLM defaults for the fields its flags own", args: []string{"org/m"},
			check: func(c vllmsim.Config) bool {
				return c.Model == "org/m" && c.Host == "0.0.0.0" && c.Port == 8000 && c.BlockSize == 16 && c.HashAlgo == "sha256" &&
					c.DataParallelSize == 1 && c.KVEventsTopic != nil && *c.KVEventsTopic == "" && !eventsOn(c) &&
					c.OmitPromptTokensDetails && c.MaxModelLen == 777 && c.NumGPUBlocks == 99
			}},
		{name: "both value spellings and underscores", args: []string{"m", "--port=9001", "--block_size", "32", "--max_num_seqs=7"},
			check: func(c vllmsim.Config) bool { return c.Port == 9001 && c.BlockSize == 32 && c.MaxNumSeqs == 7 }},
		{name: "model after the flags, served name", args: []string{"--served-model-name", "alias", "--port", "8001", "org/m"},
			check: func(c vllmsim.Config) bool { return c.Model == "alias" && c.Port == 8001 }},
		{name: "--model (deprecated) is the model", args: []string{"--model", "org/m"},
			check: func(c vllmsim.Config) bool { return c.Model == "org/m" }},
		{name: "short aliases", args: []string{"m", "-dp", "3", "-tp=4", "-pp", "2"},
			check: func(c vllmsim.Config) bool { return c.DataParallelSize == 3 }, ignored: "-tp -pp"},
		{name: "human-readable lengths", args: []string{"m", "--max-model-len", "32k", "--max-num-batched-tokens=2K"},
			check: func(c vllmsim.Config) bool { return c.MaxModelLen == 32000 && c.MaxBatchedTokens == 2048 }},
		{name: "cache size and hash", args: []string{"m", "--num-gpu-blocks-override", "512", "--prefix-caching-hash-algo", "xxhash", "--enable-prefix-caching"},
			check: func(c vllmsim.Config) bool { return c.NumGPUBlocks == 512 && c.HashAlgo == "xxhash" }},
		{name: "prompt tokens details", args: []string{"m", "--enable-prompt-tokens-details"},
			check: func(c vllmsim.Config) bool { return !c.OmitPromptTokensDetails }},
		{name: "unique prefix, as argparse", args: []string{"m", "--max-num-seq", "9"},
			check: func(c vllmsim.Config) bool { return c.MaxNumSeqs == 9 }},
		{name: "LoRA in both forms", args: []string{"m", "--enable-lora", "--lora-modules", "a=/w/a", `{"name": "b", "path": "/w/b"}`, "--max-loras", "2"},
			check: func(c vllmsim.Config) bool { return reflect.DeepEqual(c.LoRAAdapters, []string{"a", "b"}) }, ignored: "--max-loras"},
		{name: "several API keys", args: []string{"m", "--api-key", "k1", "k2", "--port", "8002"},
			check: func(c vllmsim.Config) bool {
				return reflect.DeepEqual(c.APIKeys, []string{"k1", "k2"}) && c.Port == 8002
			}},
		{name: "keep-alive seconds", args: []string{"m", "--sse-keep-alive-interval", "15"},
			check: func(c vllmsim.Config) bool { return c.SSEKeepAliveInterval == 15*time.Second }},
		{name: "GPU-only flags are ignored, named once", args: []string{"m", "--gpu-memory-utilization=0.92", "--dtype", "bfloat16",
			"--quantization", "fp8", "--enforce-eager", "--kv-cache-dtype", "fp8", "--trust-remote-code", "-O3", "--hf-token", "--revision", "abc",
			"--cudagraph-capture-sizes", "1", "2", "4", "--swap-space", "0"},
			check:   func(c vllmsim.Config) bool { return c.Model == "m" },
			ignored: "--gpu-memory-utilization --dtype --quantization --enforce-eager --kv-cache-dtype --trust-remote-code -O3 --hf-token --revision --cudagraph-capture-sizes --swap-space"},
		{name: "explicit host is kept", args: []string{"m", "--host", "127.0.0.1"},
			check: func(c vllmsim.Config) bool { return c.Host == "127.0.0.1" }},
		{name: "wildcard host from the environment", args: []string{"m", "--kv-events-config",
			`{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","replay_endpoint":"tcp://0.0.0.0:5600"}`},
			env: envOf(WildcardHostEnv, "127.0.0.9"),
			check: func(c vllmsim.Config) bool {
				return c.Host == "127.0.0.9" && c.KVEventsBind == "tcp://127.0.0.9:5557" && c.KVReplayBind == "tcp://127.0.0.9:5600"
			}},
		{name: "kv events bind with *, topic expanded", args: []string{"m", "--kv-events-config",
			`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:6000","replay_endpoint":"tcp://*:6100","topic":"kv@$(POD_IP)@m","hwm":5,"buffer_steps":7,"max_queue_size":9}`},
			check: func(c vllmsim.Config) bool {
				return c.KVEventsBind == "tcp://*:6000" && c.KVReplayBind == "tcp://*:6100" && c.KVEventsConnect == "" &&
					*c.KVEventsTopic == "kv@10.1.2.3@m" && c.HWM == 5 && c.BufferSteps == 7
			}},
		{name: "kv events bind with ::", args: []string{"m", "--kv-events-config", `{"enable_kv_cache_events":true,"endpoint":"tcp://[::]:6000"}`},
			check: func(c vllmsim.Config) bool { return c.KVEventsBind == "tcp://[::]:6000" && c.KVReplayBind == "" }},
		// vLLM connects to any endpoint without "*" or "::", 0.0.0.0 included; so does the sim.
		{name: "kv events connect", args: []string{"m", "--kv-events-config", `{"enable_kv_cache_events":true,"endpoint":"tcp://0.0.0.0:5557"}`},
			check: func(c vllmsim.Config) bool { return c.KVEventsConnect == "tcp://0.0.0.0:5557" && c.KVEventsBind == "" }},
		{name: "kv events default endpoint", args: []string{"m", "--kv-events-config", `{"enable_kv_cache_events":true}`},
			check: func(c vllmsim.Config) bool { return c.KVEventsBind == "tcp://*:5557" }},
		{name: "kv events snapshot endpoint", args: []string{"m", "--kv-events-config", `{"enable_kv_cache_events":true,"snapshot_endpoint":"tcp://*:6200"}`},
			check: func(c vllmsim.Config) bool { return c.KVSnapshotPort == 6200 && c.KVEventsBind == "tcp://*:5557" }},
		{name: "kv events snapshot on another host", args: []string{"m", "--kv-events-config", `{"enable_kv_cache_events":true,"snapshot_endpoint":"tcp://10.9.9.9:6200"}`},
			err: "snapshot_endpoint"},
		{name: "kv events off", args: []string{"m", "--kv-events-config", `{"enable_kv_cache_events":false,"endpoint":"tcp://*:5557"}`},
			check: func(c vllmsim.Config) bool { return !eventsOn(c) }},
		{name: "null publisher", args: []string{"m", "--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"null"}`},
			check: func(c vllmsim.Config) bool { return !eventsOn(c) }},

		{name: "NIXL connector with its environment", args: []string{"m", "--kv-transfer-config",
			`{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_load_failure_policy":"fail","kv_connector_extra_config":{"backends":["UCX"]}}`},
			env: envOf("VLLM_NIXL_SIDE_CHANNEL_HOST", "10.1.2.3", "VLLM_NIXL_SIDE_CHANNEL_PORT", "5601", "VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "30"),
			check: func(c vllmsim.Config) bool {
				k := c.KVTransfer
				return k != nil && k.Connector == "NixlConnector" && k.Role == "kv_producer" && k.LoadFailurePolicy == "fail" &&
					k.SideChannelHost == "10.1.2.3" && k.SideChannelPort == 5601 && k.AbortTimeout == 30*time.Second
			}},
		{name: "NIXL defaults", args: []string{"m", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`},
			check: func(c vllmsim.Config) bool {
				k := c.KVTransfer
				return k != nil && k.SideChannelHost == "localhost" && k.SideChannelPort == 5600 && k.AbortTimeout == 0
			}},
		{name: "connector without a role", args: []string{"m", "--kv-transfer-config", `{"kv_connector":"NixlConnector"}`}, err: "kv_role"},
		{name: "unknown kv-transfer key", args: []string{"m", "--kv-transfer-config", `{"kv_conector":"NixlConnector"}`}, err: `unknown field "kv_conector"`},
		{name: "bad side-channel port", args: []string{"m", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`},
			env: envOf("VLLM_NIXL_SIDE_CHANNEL_PORT", "x"), err: "VLLM_NIXL_SIDE_CHANNEL_PORT"},
		{name: "unknown flag", args: []string{"m", "--frobnicate"}, err: "--frobnicate: not a flag of `vllm serve`"},
		{name: "misspelt flag", args: []string{"m", "--gpu-memory-utilisation", "0.9"}, err: "did you mean --gpu-memory-utilization?"},
		{name: "ambiguous prefix", args: []string{"m", "--max-num", "3"}, err: "ambiguous"},
		{name: "prefix caching off", args: []string{"m", "--no-enable-prefix-caching"}, err: "always caches prefixes"},
		{name: "bool with a value", args: []string{"m", "--enable-prefix-caching=false"}, err: "without a value"},
		{name: "missing value", args: []string{"m", "--port"}, err: "--port: expected one value"},
		{name: "value that is a flag", args: []string{"m", "--port", "--block-size", "16"}, err: "--port: expected one value"},
		{name: "not an integer", args: []string{"m", "--port", "x"}, err: `--port "x": want an integer`},
		{name: "two models", args: []string{"a", "b"}, err: "takes one model"},
		{name: "two served names", args: []string{"m", "--served-model-name", "a", "b"}, err: "serves one name"},
		{name: "TLS", args: []string{"m", "--ssl-keyfile", "k.pem"}, err: "--ssl-keyfile: vllm-sim does not simulate"},
		{name: "multi-node DP", args: []string{"m", "-dpl", "1"}, err: "-dpl (--data-parallel-size-local): vllm-sim does not simulate"},
		{name: "dotted JSON key", args: []string{"m", "--kv-events-config.topic", "x"}, err: "takes JSON flags whole"},
		{name: "unknown kv-events key", args: []string{"m", "--kv-events-config", `{"enable_kv_cache_events":true,"endpont":"tcp://*:1"}`}, err: `unknown field "endpont"`},
		{name: "bad publisher", args: []string{"m", "--kv-events-config", `{"publisher":"kafka"}`}, err: `publisher "kafka"`},
		{name: "bad LoRA module", args: []string{"m", "--lora-modules", "nameonly"}, err: "want NAME=PATH"},
		{name: "help", args: []string{"--help"}, err: "help requested"},
		{name: "help on a group", args: []string{"m", "--help=CacheConfig"}, err: "help requested"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := env
			if c.env != nil {
				e = c.env
			}
			res, err := Serve(base, c.args, e)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(res.Config) {
				t.Errorf("config %+v", res.Config)
			}
			if got := strings.Join(res.Ignored, " "); got != c.ignored {
				t.Errorf("ignored %q, want %q", got, c.ignored)
			}
			if err := res.Config.Defaults().Validate(); err != nil {
				t.Errorf("the simulator refuses the config: %v", err)
			}
		})
	}
}

// eventsOn: some event socket is configured.
func eventsOn(c vllmsim.Config) bool {
	return c.KVEventsPort != 0 || c.KVEventsConnect != "" || c.KVEventsBind != "" || c.KVReplayPort != 0 || c.KVReplayBind != ""
}
