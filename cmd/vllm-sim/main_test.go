package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	t.Setenv("PYTHONHASHSEED", "123")
	cfg, err := parseFlags([]string{"--port", "0", "--data-parallel-size", "2", "--kv-events-topic", "",
		"--lora-modules", "a=/path/a,b", "--prefix-caching-hash-algo", "xxhash", "--event-layout", "E2",
		"--replay-topic-frame=false"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HashSeed != "123" || cfg.DataParallelSize != 2 || cfg.HashAlgo != "xxhash" ||
		cfg.KVEventsTopic == nil || *cfg.KVEventsTopic != "" || strings.Join(cfg.LoRAAdapters, ",") != "a,b" ||
		cfg.EventLayout != "E2" || !cfg.ReplayNoTopicFrame || cfg.Defaults().StepModel != "vllm-0.20.1-b300" {
		t.Errorf("parsed %+v", cfg)
	}
	cfg, err = parseFlags(nil, io.Discard)
	if err != nil || cfg.KVEventsTopic != nil || cfg.MaxModelLen != 131072 || cfg.Host != "127.0.0.1" ||
		cfg.EventLayout != "E3" || cfg.ReplayNoTopicFrame || cfg.Defaults().StepModel != "vllm-0.20.1-b300" {
		t.Errorf("defaults %+v (%v)", cfg, err)
	}
	cfg, err = parseFlags([]string{"--step-token-scale", "16"}, io.Discard)
	if d := cfg.Defaults(); err != nil || d.StepModel != "vllm-0.20.1-b300" || d.StepTokenScale != 16 {
		t.Errorf("step token scale %+v (%v)", cfg, err)
	}
	// The Splitwise fit by its name and by "calibrated", its name while it was the default.
	for _, name := range []string{"splitwise-h100", "calibrated"} {
		cfg, err = parseFlags([]string{"--step-model", name}, io.Discard)
		if d := cfg.Defaults(); err != nil || d.StepModel != "splitwise-h100" || d.Validate() != nil {
			t.Errorf("--step-model %s: %+v (%v)", name, cfg, err)
		}
	}
	cfg, err = parseFlags([]string{"--decode-ms-per-token", "2"}, io.Discard)
	if d := cfg.Defaults(); err != nil || d.StepModel != "flat" || d.DecodeMsPerToken != 2 || d.PrefillTokensPerS != 20000 {
		t.Errorf("defaults %+v (%v)", cfg, err)
	}
}

// --api-key wins over VLLM_API_KEY, as in vLLM; without the flag the variable is used.
func TestParseAPIKey(t *testing.T) {
	t.Setenv("VLLM_API_KEY", "from-env")
	cfg, err := parseFlags([]string{"--api-key", "a", "--api-key", "b"}, io.Discard)
	if err != nil || strings.Join(cfg.APIKeys, ",") != "a,b" {
		t.Errorf("flags: %v (%v)", cfg.APIKeys, err)
	}
	cfg, err = parseFlags(nil, io.Discard)
	if err != nil || strings.Join(cfg.APIKeys, ",") != "from-env" {
		t.Errorf("env: %v (%v)", cfg.APIKeys, err)
	}
	t.Setenv("VLLM_API_KEY", "")
	if cfg, _ = parseFlags(nil, io.Discard); len(cfg.APIKeys) != 0 {
		t.Errorf("empty env gave keys %v", cfg.APIKeys)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	var stderr strings.Builder
	if code := run(context.Background(), "vllm-sim", []string{"--event-layout", "json"}, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "event layout") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
	if code := run(context.Background(), "vllm-sim", []string{"--no-such-flag"}, io.Discard); code != 2 {
		t.Errorf("unknown flag: exit %d", code)
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var stderr strings.Builder
	if code := run(ctx, "vllm-sim", []string{"--port", "0", "--kv-events-port", "-1", "--kv-replay-port", "-1"}, &stderr); code != 0 ||
		!strings.Contains(stderr.String(), "serving vllm-sim on http://127.0.0.1:") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestParseRequestPathFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--headers-at-acceptance=false", "--sse-keep-alive-interval", "15", "--stream-error-after", "7"}, io.Discard)
	if err != nil || !cfg.HoldHeaders || cfg.SSEKeepAliveInterval != 15*time.Second || cfg.StreamErrorAfter != 7 {
		t.Fatalf("parsed %+v, %v", cfg, err)
	}
	// Fractions are the sim's extension (vLLM takes whole seconds); negative ones are refused.
	if cfg, err = parseFlags([]string{"--sse-keep-alive-interval", "0.02"}, io.Discard); err != nil || cfg.SSEKeepAliveInterval != 20*time.Millisecond {
		t.Fatalf("--sse-keep-alive-interval 0.02: %v, %v", cfg.SSEKeepAliveInterval, err)
	}
	for _, bad := range []string{"-1", "x", "NaN", "1e9"} {
		if _, err := parseFlags([]string{"--sse-keep-alive-interval", bad}, io.Discard); err == nil {
			t.Errorf("--sse-keep-alive-interval %s accepted", bad)
		}
	}
	if cfg, _ = parseFlags([]string{"--headers-at-acceptance"}, io.Discard); cfg.HoldHeaders {
		t.Fatalf("--headers-at-acceptance: %+v", cfg)
	}
	if cfg, _ = parseFlags(nil, io.Discard); cfg.HoldHeaders || cfg.SSEKeepAliveInterval != 0 {
		t.Fatalf("defaults %+v: headers at acceptance (vLLM's timing) is the default", cfg)
	}
}

// Invoked as vllm (or with serve first) the command line is vLLM's: an unknown flag exits 2
// naming it, another subcommand is refused, --help prints the serve usage.
func TestRunAsVLLM(t *testing.T) {
	for _, c := range []struct {
		argv0 string
		args  []string
		code  int
		want  string
	}{
		{"vllm", []string{"serve", "m", "--gpu-memory-utilisation", "0.9"}, 2, "--gpu-memory-utilisation: not a flag of `vllm serve` (did you mean --gpu-memory-utilization?)"},
		{"/usr/local/bin/vllm", []string{"chat"}, 2, "takes `vllm serve MODEL [flags]` only"},
		{"vllm-sim", []string{"serve", "m", "--no-enable-prefix-caching"}, 2, "always caches prefixes"},
		{"vllm", []string{"serve", "--help"}, 0, "usage: vllm serve MODEL"},
	} {
		var stderr strings.Builder
		if code := run(context.Background(), c.argv0, c.args, &stderr); code != c.code || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%s %q: exit %d, stderr %q; want exit %d and %q", c.argv0, c.args, code, stderr.String(), c.code, c.want)
		}
	}
	t.Setenv("VLLM_SIM_ARGS", "--num-gpu-blocks=nope")
	var stderr strings.Builder
	if code := run(context.Background(), "vllm", []string{"serve", "m"}, &stderr); code != 2 || !strings.Contains(stderr.String(), "VLLM_SIM_ARGS") {
		t.Errorf("bad VLLM_SIM_ARGS: exit %d, stderr %q", code, stderr.String())
	}
}
