package replay

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/discovery"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// buildBinaries builds vllm-sim (and kvrouter and kvbench, when their packages exist) once per
// test binary.
func buildBinaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "replay-bin-")
		if buildErr != nil {
			return
		}
		for _, c := range []string{"vllm-sim", "kvrouter", "kvbench"} {
			if _, err := os.Stat(filepath.Join("..", "..", "cmd", c)); err != nil {
				continue
			}
			out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, c), "../../cmd/"+c).CombinedOutput()
			if err != nil {
				buildErr = &buildError{c, string(out)}
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

type buildError struct{ cmd, out string }

func (e *buildError) Error() string { return "build " + e.cmd + ": " + e.out }

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// TestSimProcessAndClient starts a real vllm-sim process, reads its addresses, and replays two
// requests sharing a prefix straight to it: the second must report cached tokens.
func TestSimProcessAndClient(t *testing.T) {
	bin := filepath.Join(buildBinaries(t), "vllm-sim")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	logPath := filepath.Join(t.TempDir(), "sim.log")
	s, err := startSim(ctx, bin, "engine-0", []string{"--data-parallel-size", "2", "--decode-ms-per-token", "1", "--time-scale", "10"}, logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer s.stop()
	if b, err := os.ReadFile(logPath); err != nil || !strings.Contains(string(b), "vllm-sim: serving") {
		t.Fatalf("the sim's log holds no start-up line: %v %q", err, b)
	}
	if len(s.Events) != 2 || len(s.Replay) != 2 {
		t.Fatalf("events %v replay %v, want two of each", s.Events, s.Replay)
	}
	if err := waitHTTP(ctx, nil, s.URL+"/health", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	e, err := discovery.ParseEngineFlag(s.EngineLine("engine-0", time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)))
	if err != nil {
		t.Fatalf("engine line does not parse: %v", err)
	}
	if e.URL != s.URL || len(e.Events) != 2 || e.WarmupUntil.Year() != 2030 {
		t.Fatalf("parsed engine %+v", e)
	}

	tk := Tokenizer{PerBlock: 32}
	c := &http.Client{}
	a := &Request{HashIDs: []uint64{1, 2, 3, 4}, InputLength: 4 * 512}
	b := &Request{HashIDs: []uint64{1, 2, 3, 9}, InputLength: 4 * 512}
	oa := complete(ctx, c, s.URL, "vllm-sim", a, tk.Prompt(a), 4)
	if oa.Err != "" {
		t.Fatal(oa.Err)
	}
	if oa.PromptTokens != 128 || oa.OutputTokens != 4 || oa.TTFT <= 0 || oa.E2E < oa.TTFT {
		t.Fatalf("first request %+v", oa)
	}
	// vllm-sim picks the DP rank with the least load; with nothing running both are idle, so
	// pin nothing and retry until the second lands where the first did (at most a few tries).
	var ob Outcome
	for i := 0; i < 8; i++ {
		ob = complete(ctx, c, s.URL, "vllm-sim", b, tk.Prompt(b), 2)
		if ob.Err != "" {
			t.Fatal(ob.Err)
		}
		if ob.CachedTokens > 0 {
			break
		}
	}
	if ob.CachedTokens != 96 {
		t.Fatalf("shared 3 blocks (96 tokens) but cached_tokens = %d", ob.CachedTokens)
	}
	bad := complete(ctx, c, s.URL, "no-such-model", a, tk.Prompt(a), 2)
	if bad.Err == "" {
		t.Fatal("a request for an unknown model did not fail")
	}
}
