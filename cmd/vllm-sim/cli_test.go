package main

import (
	"bytes"
	"context"
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
