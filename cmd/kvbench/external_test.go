package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"
)

// The documented flow for an external router, end to end through the command line: a kvrouter
// (kvbench's router, this test binary) started first on an engines file that names no engine of
// the replay yet, and `kvbench replay --engines-out` that file with --router-url and --ext-proc
// pointing at that router. The router picks the engines up when kvbench writes the file,
// kvbench waits for it (probe requests), and the replay's table gets a row per external router
// with every request answered and the engine of each known.
func TestReplayDrivesAnExternalRouterAndPicker(t *testing.T) {
	if testing.Short() {
		t.Skip("starts engines and routers")
	}
	binDir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, "vllm-sim"), "../vllm-sim").CombinedOutput(); err != nil {
		t.Fatalf("go build vllm-sim: %v\n%s", err, out)
	}
	engines := filepath.Join(t.TempDir(), "engines.txt")
	// A placeholder the router starts on (it needs one engine); kvbench replaces the file.
	if err := os.WriteFile(engines, []byte("placeholder=http://127.0.0.1:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "router", "--engines-file", engines, "--policy", "kv", "--block-size", "16", "--model", "vllm-sim",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--ext-proc-listen", "127.0.0.1:0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	addrs := make(chan map[string]string, 1)
	go func() {
		attr := regexp.MustCompile(`(api|admin|ext_proc)=(\S+)`)
		sc := bufio.NewScanner(pipe)
		sent := false
		for sc.Scan() { // read to the end, so the router never blocks on a full pipe
			if line := sc.Text(); !sent && regexp.MustCompile(`msg="kvrouter listening"`).MatchString(line) {
				m := map[string]string{}
				for _, kv := range attr.FindAllStringSubmatch(line, -1) {
					m[kv[1]] = kv[2]
				}
				addrs <- m
				sent = true
			}
		}
	}()
	var a map[string]string
	select {
	case a = <-addrs:
	case <-time.After(30 * time.Second):
		t.Fatal("the router logged no listening line in 30s")
	}
	out, stderr, rc := kvbench(t, "replay", "--regime", "hot-prefix", "--replicas", "2", "--seeds", "1", "--policies", "kv",
		"--max-requests", "16", "--rate", "40", "--tokens-per-trace-block", "16", "--max-output-tokens", "4", "--bin-dir", binDir,
		"--engines-out", engines, "--external-ready-timeout", "60s",
		"--router-url", "ext=http://"+a["api"]+";admin=http://"+a["admin"], "--ext-proc", "epp="+a["ext_proc"], "--json")
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, stderr)
	}
	var doc replayOutput
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != 3 {
		t.Fatalf("results %+v, want kv, ext and epp", doc.Results)
	}
	for _, r := range doc.Results {
		t.Logf("%s: cached %.3f, max share %.2f, accuracy %+v", r.Policy, r.CachedRatio.Mean, r.MaxEngineShare.Mean, r.Accuracy)
		if r.Errors != 0 || r.Requests != 16 || !(r.MaxEngineShare.Mean >= 1) {
			t.Errorf("%s: %d requests, %d errors (%v), max share %v; want 16 answered on known engines", r.Policy, r.Requests, r.Errors,
				r.FirstErrors, r.MaxEngineShare.Mean)
		}
	}
	if doc.Results[1].Accuracy == nil {
		t.Errorf("ext: no accuracy counters read from its admin listener")
	}
	if b, err := os.ReadFile(engines); err != nil || !regexp.MustCompile(`(?m)^engine-1=http://127\.0\.0\.1:\d+;events=`).Match(b) {
		t.Errorf("engines file (%v):\n%s", err, b)
	}
}
