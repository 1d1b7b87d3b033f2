package fleet

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestParseVLLMPage(t *testing.T) {
	for _, deprecated := range []bool{false, true} {
		s, err := Parse([]byte(vllmPage(2, 7, 3, 0.42, deprecated)))
		if err != nil {
			t.Fatal(err)
		}
		want := []Rank{{Waiting: 7, Running: 3, KVUsage: 0.42}, {Waiting: 8, Running: 4, KVUsage: 0.42}}
		if len(s.Ranks) != 2 || s.Ranks[0] != want[0] || s.Ranks[1] != want[1] || s.GPUBlocks != 27450 {
			t.Fatalf("deprecated=%v: %+v, want ranks %+v and 27450 blocks", deprecated, s, want)
		}
	}
	// Both usage names: the current one wins, whatever the order.
	page := "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:gpu_cache_usage_perc{engine=\"0\"} 0.9\n"
	if s, _ := Parse([]byte(page)); s.Ranks[0].KVUsage != 0.5 {
		t.Fatalf("usage %v, want the current metric's 0.5", s.Ranks[0].KVUsage)
	}
	// No engine label (an old single-engine page): rank 0.
	if s, _ := Parse([]byte("vllm:num_requests_waiting 3\n")); len(s.Ranks) != 1 || s.Ranks[0].Waiting != 3 {
		t.Fatalf("unlabelled: %+v", s)
	}
	for _, bad := range []string{"vllm:num_requests_waiting{engine=\"x\"} 1\n", "vllm:num_requests_waiting{engine=\"99999\"} 1\n",
		"vllm:num_requests_running{engine=\"0\"} many\n"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestReaderRound(t *testing.T) {
	page := vllmPage(1, 5, 2, 0.25, false)
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, page)
	}))
	defer ok.Close()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer down.Close()
	var mu sync.Mutex
	got, errs := map[string]*Sample{}, map[string]error{}
	rd := NewReader(ReaderOptions{Timeout: 5 * time.Second,
		OnSample: func(e string, s *Sample) { mu.Lock(); got[e] = s; mu.Unlock() },
		OnError:  func(e string, err error) { mu.Lock(); errs[e] = err; mu.Unlock() }})
	rd.SetTargets([]Target{{Name: "a", URL: ok.URL}, {Name: "b", URL: down.URL}})
	rd.Round(context.Background())
	if r, _ := got["a"].Rank(0); r != (Rank{Waiting: 5, Running: 2, KVUsage: 0.25}) {
		t.Fatalf("a: %+v", got["a"])
	}
	if errs["b"] == nil || got["b"] != nil {
		t.Fatalf("b: sample %+v, error %v", got["b"], errs["b"])
	}
}

// farmEnv makes the test binary serve endpoints instead of testing: the benchmark's engines
// run in a child process, so the benchmark's own CPU time is the reader's alone.
const farmEnv = "KVROUTE_FLEET_METRICS_FARM"

func TestMain(m *testing.M) {
	if n := os.Getenv(farmEnv); n != "" {
		serveFarm(n)
		return
	}
	os.Exit(m.Run())
}

// serveFarm starts n servers of a 1-rank vLLM page, prints their URLs and serves until stdin
// closes.
func serveFarm(n string) {
	count, err := strconv.Atoi(n)
	if err != nil {
		panic(err)
	}
	page := []byte(vllmPage(1, 3, 12, 0.61, false))
	for range count {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			w.Write(page)
		}))
		fmt.Println(s.URL)
	}
	fmt.Println("ready")
	buf := make([]byte, 1)
	_, _ = os.Stdin.Read(buf) // any byte or EOF: the parent is done
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReaderRound is one round over 100 engines serving a realistic vLLM page (served by
// a child process). cpu-ms/round is this process's CPU per round; cores@interval is the share
// of a core the reader takes at DefaultInterval (the budget: 0.05 for 100 engines).
func BenchmarkReaderRound(b *testing.B) {
	const engines = 100
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", farmEnv, engines))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	var ts []Target
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && sc.Text() != "ready" {
		ts = append(ts, Target{Name: fmt.Sprintf("e%03d", len(ts)), URL: strings.TrimSpace(sc.Text())})
	}
	if len(ts) != engines {
		b.Fatalf("farm started %d endpoints", len(ts))
	}
	var n sync.Map
	rd := NewReader(ReaderOptions{OnSample: func(e string, s *Sample) { n.Store(e, s.Ranks[0].Running) },
		OnError: func(e string, err error) { b.Errorf("%s: %v", e, err) }})
	rd.SetTargets(ts)
	rd.Round(context.Background()) // connections opened outside the measurement, as in steady state
	b.ResetTimer()
	c0 := cpuTime()
	for b.Loop() {
		rd.Round(context.Background())
	}
	cpu := cpuTime() - c0
	b.StopTimer()
	perRound := float64(cpu) / float64(b.N)
	b.ReportMetric(perRound/1e6, "cpu-ms/round")
	b.ReportMetric(perRound/float64(DefaultInterval), "cores@interval")
	b.ReportMetric(float64(len(vllmPage(1, 3, 12, 0.61, false)))/1024, "page-KiB")
	seen := 0
	n.Range(func(_, v any) bool {
		if v.(int) == 12 {
			seen++
		}
		return true
	})
	if seen != engines {
		b.Fatalf("%d engines read, want %d", seen, engines)
	}
}

// block_size comes from vllm:cache_config_info as vLLM writes it (every CacheConfig field a
// label); a figure that is not a plausible block size is not taken.
func TestParseBlockSize(t *testing.T) {
	line := func(bs string) []byte {
		return []byte(`vllm:cache_config_info{block_size="` + bs + `",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="27391",prefix_caching_hash_algo="sha256"} 1.0` + "\n")
	}
	if s, err := Parse(line("32")); err != nil || s.BlockSize != 32 || s.GPUBlocks != 27391 {
		t.Fatalf("block size %d, blocks %d (%v), want 32 and 27391", s.BlockSize, s.GPUBlocks, err)
	}
	for _, bad := range []string{"None", "0", "-16", "99999999", ""} {
		if s, _ := Parse(line(bad)); s.BlockSize != 0 {
			t.Errorf("block_size=%q read as %d, want 0 (not shown)", bad, s.BlockSize)
		}
	}
	if s, _ := Parse([]byte("vllm:num_requests_waiting 3\n")); s.BlockSize != 0 {
		t.Fatalf("a page without cache_config_info gave block size %d", s.BlockSize)
	}
}
