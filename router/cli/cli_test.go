package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--policy", "nope", "--engine", "a=http://127.0.0.1:1"},
		{"--engine", "bad"},
		{"--engine", "a=http://127.0.0.1:1", "--engines-file", "x"},
		{"--namespace", "ns"},
		{"--log-format", "xml", "--engine", "a=http://127.0.0.1:1"},
		{"--config", "does-not-exist.yaml"},
		{"--engine", "a=http://127.0.0.1:1;replay=tcp://127.0.0.1:2"},   // replay alone needs --events-bind
		{"--engine", "a=http://127.0.0.1:1;snapshot=tcp://127.0.0.1:2"}, // so does snapshot alone
		{"--engine", "a=http://127.0.0.1:1", "--events-bind", "127.0.0.1:5557"},
		{"--engine", "a=http://127.0.0.1:1", "--response-owners", "-3"},
		{"--engine", "a=http://127.0.0.1:1", "--response-owner-ttl", "-1m"},
	} {
		var stderr bytes.Buffer
		if code := Run(context.Background(), args, &stderr, Options{}); code != 2 || !strings.Contains(stderr.String(), "kvrouter:") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}

// --policy and --shadow-policy take the policies the binary offers: the production ones unless
// its main registers more (kvbench's router adds the benchmark policies).
func TestPoliciesAreTheRegistrysOnly(t *testing.T) {
	eng := []string{"--engine", "a=http://127.0.0.1:1"}
	for _, flag := range []string{"--policy", "--shadow-policy"} {
		var stderr bytes.Buffer
		args := append([]string{flag, "extra"}, eng...)
		if code := Run(context.Background(), args, &stderr, Options{}); code != 2 || !strings.Contains(stderr.String(), `"extra" is not one of`) {
			t.Errorf("%s extra with the production policies: exit %d, stderr %q", flag, code, stderr.String())
		}
		reg := score.Production()
		if err := reg.Register("extra", func(o score.Options) score.Policy { p, _ := score.New("load", o); return p }); err != nil {
			t.Fatal(err)
		}
		if _, err := parse(args, io.Discard, reg); err != nil {
			t.Errorf("%s extra, registered: %v", flag, err)
		}
	}
}

// The engine key comes from a named variable or file; naming one that is unset is a start-up
// error, and the key never reaches the logs.
func TestEngineAPIKeyFlags(t *testing.T) {
	eng := []string{"--engine", "a=http://127.0.0.1:1"}
	t.Setenv("KVR_ENGINE_KEY", "")
	if _, err := parse(append([]string{"--engine-api-key-env", "KVR_ENGINE_KEY"}, eng...), io.Discard, nil); err == nil {
		t.Error("an empty key variable was accepted")
	}
	t.Setenv("KVR_ENGINE_KEY", "k-123")
	st, err := parse(append([]string{"--engine-api-key-env", "KVR_ENGINE_KEY"}, eng...), io.Discard, nil)
	if err != nil || st.engineKey != "k-123" {
		t.Fatalf("%v %v", st, err)
	}
	if _, err := parse(append([]string{"--engine-api-key-env", "KVR_ENGINE_KEY", "--engine-api-key-file", "/k"}, eng...), io.Discard, nil); err == nil {
		t.Error("both sources were accepted")
	}
	if st, err := parse(eng, io.Discard, nil); err != nil || st.engineKey != "" {
		t.Errorf("no key configured: %q %v", st.engineKey, err)
	}
}

// Bound mode from the flag or the file; replay endpoints alone are accepted there.
func TestEventsBind(t *testing.T) {
	st, err := parse([]string{"--engine", "a=http://127.0.0.1:1;replay=tcp://127.0.0.1:2", "--events-bind", "tcp://127.0.0.1:5557"}, io.Discard, nil)
	if err != nil || st.eventsBind != "tcp://127.0.0.1:5557" {
		t.Fatalf("%v %v", st, err)
	}
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("events: {bind: \"tcp://127.0.0.1:5558\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err = parse([]string{"--config", cfg}, io.Discard, nil); err != nil || st.eventsBind != "tcp://127.0.0.1:5558" {
		t.Fatalf("from the file: %v %v", st, err)
	}
}

// The binary's run: static --engine, JSON logs, a completion through it, clean stop.
func TestRunServesThroughEngine(t *testing.T) {
	sim, err := vllmsim.New(vllmsim.Config{KVEventsPort: -1, KVReplayPort: -1, TimeScale: 20})
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	if err := sim.Start(sctx); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	eng := "e0=" + sim.URL() + ";events=" + strings.Join(sim.EventEndpoints(), ",") + ";replay=" + strings.Join(sim.ReplayEndpoints(), ",")
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	var logs syncBuf
	done := make(chan int)
	go func() {
		done <- Run(ctx, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--engine", eng,
			"--policy", "least-loaded", "--log-format", "json"}, &logs, Options{Ready: func(a, b string) { addrs <- [2]string{a, b} }})
	}()
	var a [2]string
	select {
	case a = <-addrs:
	case code := <-done:
		t.Fatalf("exited %d: %s", code, logs.String())
	}
	waitReady(t, a[0], 5*time.Second)
	resp, err := http.Post("http://"+a[0]+"/v1/completions", "application/json", strings.NewReader(`{"model":"vllm-sim","prompt":"hi there","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("x-kvroute-engine") != "e0" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	m, err := http.Get("http://" + a[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(m.Body)
	m.Body.Close()
	if !bytes.Contains(mb, []byte(`kvroute_router_requests_total{code="200",engine="e0",policy="load"} 1`)) {
		t.Fatalf("metrics lack the request:\n%s", mb)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(logs.String(), `"msg":"kvrouter listening"`) {
		t.Fatalf("no JSON log line: %s", logs.String())
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// waitReady waits until the router's API listener at addr answers /readyz with 200.
func waitReady(t *testing.T, addr string, timeout time.Duration) {
	t.Helper()
	testkit.WaitFor(t, timeout, "/readyz 200 on "+addr, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// --disagg-min-uncached-tokens sets the config's disaggregation.minUncachedTokens over the
// file's; 0 leaves the file's; below -1 is refused with the key and the number.
func TestDisaggMinUncachedFlag(t *testing.T) {
	eng := []string{"--engine", "a=http://127.0.0.1:1"}
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("disaggregation: {minUncachedTokens: 700}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want int
	}{
		{append([]string{"--disagg-min-uncached-tokens", "-1"}, eng...), -1},
		{append([]string{"--disagg-min-uncached-tokens", "2000", "--config", cfg}, eng...), 2000},
		{append([]string{"--config", cfg}, eng...), 700},
	} {
		st, err := parse(c.args, io.Discard, nil)
		if err != nil || st.cfg.Disaggregation == nil || st.cfg.Disaggregation.MinUncachedTokens != c.want {
			t.Errorf("%v: %+v %v, want %d", c.args, st, err, c.want)
		}
	}
	if _, err := parse(append([]string{"--disagg-min-uncached-tokens", "-5"}, eng...), io.Discard, nil); err == nil ||
		!strings.Contains(err.Error(), "disaggregation.minUncachedTokens: -5") {
		t.Errorf("-5 accepted or unexplained: %v", err)
	}
}
