package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/capture"
	"github.com/kvroute/kvroute/sim/replay"
)

// `kvbench replay --capacity --trace` on what kvrouter's capture writes (issue 23: TTFT and
// capacity at SLO for captured traffic): 16 requests over 1.5 s sharing a 4-block system
// prompt, replayed on 2 vllm-sim engines under kv and round-robin, 2 probes each, as seed 3
// (--first-seed). The ramp is
// the trace's own timing scaled: speed 1 replays the capture's 1.5 s, speed 2 the same requests
// in 0.75 s. Every probe meets a generous SLO, so each policy's capacity is the second speed;
// a probe that failed, lost requests or kept the capture's timing unscaled fails the test.
func TestCapacityOnACapturedTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts engines and routers")
	}
	capDir := t.TempDir()
	rec, err := capture.New(capture.Options{Dir: capDir})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now() // the capture counts arrivals from its own start
	for i := range 16 {
		toks := make([]uint32, 4*512+300)
		for j := range toks {
			toks[j] = uint32(1000 + j)
			if j >= 4*512 {
				toks[j] = uint32(50_000 + 1000*i + j)
			}
		}
		rec.Observe(capture.Request{Arrival: start.Add(time.Duration(i) * 100 * time.Millisecond), Tokens: toks, OutputTokens: 8})
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	binDir := t.TempDir()
	for _, b := range []string{"vllm-sim"} { // the routers are this test binary's (TestMain)
		if out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, b), "../"+b).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b, err, out)
		}
	}
	// The search's temporary log directory goes where os.MkdirTemp puts it: here, so the test
	// can check that a search that ends without an error removes it.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	out, stderr, rc := kvbench(t, "replay", "--capacity", "--trace", capDir, "--replicas", "2", "--policies", "kv,round-robin",
		"--seeds", "1", "--first-seed", "3", "--max-probes", "2", "--speed", "1", "--slo", "60s", "--duration", "0", "--max-requests", "0",
		"--tokens-per-trace-block", "16", "--max-output-tokens", "4", "--bin-dir", binDir, "--json")
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, stderr)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "kvbench-capacity-*")); len(left) != 0 {
		t.Errorf("the search ended without an error and left its log directory behind: %v", left)
	}
	var res replay.CapacityResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var order []string
	for _, p := range res.Probes {
		order = append(order, fmt.Sprintf("%s@%g", p.Policy, p.Rate))
		if p.Requests != 16 || math.Abs(p.Span-1.5/p.Rate) > 0.002 {
			t.Errorf("probe %+v: want the capture's 16 requests over 1.5 s / speed %g", p, p.Rate)
		}
		if p.Seed != 3 {
			t.Errorf("probe %+v: want seed 3 (--first-seed)", p)
		}
		if !p.Met || p.Failed != 0 || !(p.P99 > 0) {
			t.Errorf("probe %+v: want every request answered and TTFT p99 > 0 within the SLO", p)
		}
	}
	if want := "[kv@1 round-robin@1 kv@2 round-robin@2]"; fmt.Sprint(order) != want {
		t.Errorf("probes %v, want %s (the policies interleaved, the speed doubling)", order, want)
	}
	for _, pol := range []string{"kv", "round-robin"} {
		if c := res.Capacity[pol]; len(c) != 1 || c[0] != 2 {
			t.Errorf("%s: capacity %v, want [2] (the highest speed probed, met)", pol, c)
		}
	}
	if len(res.RatioPerSeed) != 1 || res.RatioPerSeed[0] == nil || *res.RatioPerSeed[0] != 1 {
		t.Errorf("kv / best other per seed %v, want [1]", res.RatioPerSeed)
	}
}
