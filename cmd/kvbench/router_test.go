package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets this test binary stand in for kvbench as the replay's router: kvbench replay
// runs its own executable's `router` subcommand, which here is the test binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "router" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// kvbench's router takes the benchmark policies kvrouter refuses, and refuses what neither
// offers, with kvrouter's exit status for a bad command line.
func TestRouterSubcommandPolicies(t *testing.T) {
	var errb bytes.Buffer
	if code := run([]string{"router", "--policy", "nope", "--engine", "a=http://127.0.0.1:1"}, &bytes.Buffer{}, &errb); code != 2 ||
		!strings.Contains(errb.String(), "prefix-char") {
		t.Errorf("router --policy nope: exit %d, stderr %q; want 2 and the offered policies, prefix-char among them", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"replay", "--regime", "hot-prefix", "--policies", "kv,prefix-char", "--kvrouter", "/bin/true", "--vllm-sim", "/bin/true"},
		&bytes.Buffer{}, &errb); code == 0 || !strings.Contains(errb.String(), "prefix-char is kvbench's") {
		t.Errorf("replay prefix-char on a kvrouter binary: exit %d, stderr %q; want it refused", code, errb.String())
	}
}

// The smallest live replay of a benchmark policy: prefix-char beside round-robin on two
// vllm-sim engines, each served by kvbench's router (this test binary, TestMain). Every request
// is answered under both.
func TestReplayServesABenchmarkPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts engines and routers")
	}
	binDir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, "vllm-sim"), "../vllm-sim").CombinedOutput(); err != nil {
		t.Fatalf("go build vllm-sim: %v\n%s", err, out)
	}
	out, stderr, rc := kvbench(t, "replay", "--regime", "hot-prefix", "--replicas", "2", "--seeds", "1", "--policies", "round-robin,prefix-char",
		"--max-requests", "24", "--rate", "40", "--tokens-per-trace-block", "16", "--max-output-tokens", "4", "--bin-dir", binDir, "--json")
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, stderr)
	}
	var doc replayOutput
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != 2 {
		t.Fatalf("results %+v, want round-robin and prefix-char", doc.Results)
	}
	for _, r := range doc.Results {
		if r.Errors != 0 || r.Requests != 24 {
			t.Errorf("%s: %d requests, %d errors (%v); want 24 answered", r.Policy, r.Requests, r.Errors, r.FirstErrors)
		}
	}
}
