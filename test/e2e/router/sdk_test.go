// Package router holds kvrouter end-to-end checks that drive it from outside Go: the official
// openai npm SDK against a router in front of vllm-sim engines.
package router

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/app"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

const sdkDir = "../openai-sdk"

// sdkModules returns a directory holding check.mjs with the SDK installed: sdkDir itself when
// `npm ci` already ran there (CI), else a temporary copy installed now.
func sdkModules(t *testing.T) string {
	if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "openai")); err == nil {
		return sdkDir
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		skipUnlessCI(t, "npm not installed and no node_modules in test/e2e/openai-sdk")
	}
	dir := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "check.mjs", "faults.mjs"} {
		b, err := os.ReadFile(filepath.Join(sdkDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci (run it in test/e2e/openai-sdk to use a local copy): %v\n%s", err, out)
	}
	return dir
}

// The official openai SDK works unchanged through the router: completions, chat, streaming
// (no usage chunk unless asked for), and an OpenAI-shaped 400.
func TestOpenAISDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		skipUnlessCI(t, "node not installed")
	}
	dir := sdkModules(t)
	var es []discovery.Engine
	for i := range 2 {
		sim, err := vllmsim.New(vllmsim.Config{KVEventsPort: -1, KVReplayPort: -1, TimeScale: 20,
			HoldHeaders: os.Getenv(holdHeadersEnv) == "1"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(func() { cancel(); _ = sim.Close() })
		if err := sim.Start(ctx); err != nil {
			t.Fatal(err)
		}
		es = append(es, discovery.Engine{Name: "e" + string(rune('0'+i)), URL: sim.URL(), Events: sim.EventEndpoints(),
			Replay: sim.ReplayEndpoints(), Ready: true})
	}
	s, err := app.New(app.Options{Config: config.Default(), Source: discovery.NewStatic(es),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-s.Synced()
	api := httptest.NewServer(s.APIHandler())
	defer api.Close()

	rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
	defer rcancel()
	cmd := exec.CommandContext(rctx, node, "check.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KVROUTE_URL="+api.URL+"/v1")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("node check.mjs: %v\n%s%s", err, out, stderr)
	}
	var got struct {
		CompletionText string `json:"completion_text"`
		StreamChunks   int    `json:"stream_chunks"`
		StreamUsage    int    `json:"stream_usage_prompt_tokens"`
		BadType        string `json:"bad_request_type"`
	}
	line := strings.TrimSpace(string(out))
	if err := json.Unmarshal([]byte(line[strings.LastIndex(line, "\n")+1:]), &got); err != nil {
		t.Fatalf("sdk output %q: %v", out, err)
	}
	if got.CompletionText == "" || got.StreamChunks < 2 || got.StreamUsage == 0 || got.BadType != "BadRequestError" {
		t.Fatalf("sdk saw %+v", got)
	}
}

// skipUnlessCI skips a test whose tool is missing on a developer's machine, but fails it under
// CI (CI=true), where .ci/run installs Node.js: there a missing tool must not hide the test.
func skipUnlessCI(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true: .ci/run should have installed it)", why)
	}
	t.Skip(why)
}
