// Package perf holds measurements that need real processes: the router's proxy overhead
// against an engine reached directly. They run only when asked (KVROUTE_OVERHEAD=1).
package perf

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/sim/simproc"
	"github.com/kvroute/kvroute/sim/simproc/simproctest"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// proc is a process the test started, killed at its end; its output is kept for failures.
type proc struct {
	name string
	done chan struct{} // closed once it has exited and its output is copied
	err  error
	out  testkit.LockedBuffer
}

func (p *proc) output() string { return p.out.String() }

func start(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	p := &proc{name: name, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-p.done })
	return p
}

// waitUp polls url until it answers 200; it fails at once, with the output, if p exits first.
func waitUp(t *testing.T, p *proc, url string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before %s answered:\n%s", p.name, p.err, url, p.output())
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("%s not up:\n%s", url, p.output())
}

// build builds pkg of the module in dir (a router under comparison may be another checkout).
func build(t *testing.T, dir, pkg, out string) string {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s in %s: %v\n%s", pkg, dir, err, b)
	}
	return out
}

// phase is one load level against one target.
type phase struct {
	done  int
	ttfts []time.Duration
	fails int
}

// load keeps conc streams in flight against base for d and measures what completed.
func load(base string, conc int, d time.Duration, seq *atomic.Int64) phase {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: 0}}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var p phase
	var wg sync.WaitGroup
	text := strings.Repeat("a fleet of engines behind one router. ", 20)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				body, _ := json.Marshal(map[string]any{"model": "vllm-sim", "max_tokens": 16, "stream": true,
					"prompt": fmt.Sprintf("%d %s", seq.Add(1), text)})
				t0 := time.Now()
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/v1/completions", strings.NewReader(string(body)))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					mu.Lock()
					p.fails++
					mu.Unlock()
					continue
				}
				br := bufio.NewReader(resp.Body)
				var ttft time.Duration
				for {
					line, err := br.ReadString('\n')
					if ttft == 0 && strings.HasPrefix(line, "data: {") {
						ttft = time.Since(t0)
					}
					if err != nil {
						break
					}
				}
				resp.Body.Close()
				mu.Lock()
				if resp.StatusCode == 200 && ttft > 0 && ctx.Err() == nil {
					p.done++
					p.ttfts = append(p.ttfts, ttft)
				} else if resp.StatusCode != 200 {
					p.fails++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	client.CloseIdleConnections()
	return p
}

// TestProxyOverhead compares requests per second and TTFT p50 through kvrouter builds with
// the engine reached directly, at 100 and 200 concurrent streams, all in one run and
// interleaved (direct, then each router, rotating the order every round). KVROUTE_ROUTERS
// lists the builds as name=module-dir,... (default: this tree as "this").
func TestProxyOverhead(t *testing.T) {
	if os.Getenv("KVROUTE_OVERHEAD") != "1" {
		t.Skip("set KVROUTE_OVERHEAD=1 to measure (minutes of CPU)")
	}
	tmp := t.TempDir()
	sim := testkit.Build(t, "./cmd/vllm-sim")
	routers := os.Getenv("KVROUTE_ROUTERS")
	if routers == "" {
		routers = "this=../.."
	}
	engine := simproctest.Start(t, sim, simproc.Options{}, "--max-num-seqs", "512", "--kv-events-port", "0", "--kv-replay-port", "0",
		"--decode-ms-per-token", "10", "--step-model", "flat", "--prefill-tokens-per-s", "200000", "--max-batched-tokens", "65536")
	direct := engine.URL
	targets := []struct{ name, url string }{{"direct", direct}}
	for _, nd := range strings.Split(routers, ",") {
		name, dir, _ := strings.Cut(nd, "=")
		bin := build(t, dir, "./cmd/kvrouter", filepath.Join(tmp, "kvrouter-"+name))
		// Ports picked before the start: the measured routers run at --log-level error, which
		// hides the "kvrouter listening" line that would report kernel-picked ones; a port taken
		// in between fails the start at once, with the router's output (waitUp).
		api, adm := testkit.FreePort(t), testkit.FreePort(t)
		p := start(t, "kvrouter "+name, bin, "--listen", fmt.Sprintf("127.0.0.1:%d", api), "--admin-listen", fmt.Sprintf("127.0.0.1:%d", adm),
			"--engine", "e0="+direct, "--block-size", "16", "--no-events", "--log-level", "error")
		url := fmt.Sprintf("http://127.0.0.1:%d", api)
		waitUp(t, p, url+"/readyz")
		targets = append(targets, struct{ name, url string }{name, url})
	}
	d := 4 * time.Second
	if s := os.Getenv("KVROUTE_OVERHEAD_SECONDS"); s != "" {
		n, _ := strconv.Atoi(s)
		d = time.Duration(n) * time.Second
	}
	rounds := 3
	var seq atomic.Int64
	for _, conc := range []int{100, 200} {
		all := make([]phase, len(targets))
		for round := range rounds {
			for k := range targets {
				i := (k + round) % len(targets)
				p := load(targets[i].url, conc, d, &seq)
				all[i].done += p.done
				all[i].fails += p.fails
				all[i].ttfts = append(all[i].ttfts, p.ttfts...)
			}
		}
		secs := d.Seconds() * float64(rounds)
		rps0 := float64(all[0].done) / secs
		slices.Sort(all[0].ttfts)
		p50 := func(ts []time.Duration) time.Duration {
			if len(ts) == 0 {
				return 0
			}
			return ts[len(ts)/2]
		}
		for i, tg := range targets {
			slices.Sort(all[i].ttfts)
			rps := float64(all[i].done) / secs
			t.Logf("conc=%d %-8s rps=%7.1f (x%.3f of direct)  ttft_p50=%6.1fms (%+.1f ms)  failures=%d", conc, tg.name, rps, rps/rps0,
				float64(p50(all[i].ttfts).Microseconds())/1e3, float64((p50(all[i].ttfts)-p50(all[0].ttfts)).Microseconds())/1e3, all[i].fails)
		}
	}
}
