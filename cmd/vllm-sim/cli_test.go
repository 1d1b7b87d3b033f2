package main

import (
	"bytes"
	"context"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/doccheck"
)

func TestVersionAndHelp(t *testing.T) {
	var out bytes.Buffer
	saved := versionOut
	versionOut = &out
	t.Cleanup(func() { versionOut = saved })
	if code := run(context.Background(), "vllm-sim", []string{"--version"}, &bytes.Buffer{}); code != 0 ||
		!strings.HasPrefix(out.String(), "vllm-sim ") || !strings.Contains(out.String(), runtime.Version()) {
		t.Errorf("--version: exit %d, %q", code, out.String())
	}
	var stderr bytes.Buffer
	if code := run(context.Background(), "vllm-sim", []string{"--help"}, &stderr); code != 0 || !strings.Contains(stderr.String(), "-kv-events-port") {
		t.Errorf("--help: exit %d, %q", code, stderr.String())
	}
	for _, args := range [][]string{{"--no-such-flag"}, {"stray"}, {"--port", "x"}} {
		if code := run(context.Background(), "vllm-sim", args, &bytes.Buffer{}); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

func TestFlagsMatchDocs(t *testing.T) {
	var stderr bytes.Buffer
	run(context.Background(), "vllm-sim", []string{"--help"}, &stderr)
	doccheck.Check(t, "../..", "vllm-sim", doccheck.HelpFlags(stderr.String()))
}

// Invoked through the image's python3 and trtllm-serve links, the binary reads SGLang's and
// trtllm-serve's command lines with the engine kind set, and refuses anything else under
// those names.
func TestOtherEngineLinks(t *testing.T) {
	cfgFile := t.TempDir() + "/trtllm.yaml"
	if err := os.WriteFile(cfgFile, []byte("kv_cache_config:\n  tokens_per_block: 64\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		argv0     string
		args      []string
		kind      string
		block, dp int
	}{
		{"python3", []string{"-m", "sglang.launch_server", "--model-path", "m", "--page-size", "32", "--dp-size", "2"}, "sglang", 32, 2},
		{"/usr/local/bin/trtllm-serve", []string{"m", "--tp_size", "2", "--config", cfgFile}, "trtllm", 64, 1},
	} {
		var stderr bytes.Buffer
		cfg, err := config(c.argv0, c.args, &stderr)
		if err != nil || cfg.EngineKind != c.kind || cfg.BlockSize != c.block || cfg.DataParallelSize != c.dp {
			t.Errorf("%s %q: %v, kind %q block %d dp %d", c.argv0, c.args, err, cfg.EngineKind, cfg.BlockSize, cfg.DataParallelSize)
		}
	}
	if _, err := config("python3", []string{"-c", "print(1)"}, &bytes.Buffer{}); err == nil {
		t.Error("python3 -c: accepted")
	}
}
