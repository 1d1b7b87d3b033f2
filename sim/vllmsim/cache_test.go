package vllmsim

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
)

// metricValue reads one sample from /metrics text, e.g. name `vllm:prefix_cache_hits_total`
// with labels `engine="0"`.
func metricValue(t *testing.T, s *Sim, name, labelSubstr string) float64 {
	t.Helper()
	res := get(t, s, "/metrics")
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\{([^}]*)\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(string(res.body), -1) {
		if strings.Contains(m[1], labelSubstr) {
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("metric %s{%s} not in /metrics:\n%s", name, labelSubstr, res.body)
	return 0
}

// The done-when: two requests sharing a 2,000-token prefix, pinned to one rank.
func TestSharedPrefixHitsOnPinnedRank(t *testing.T) {
	cfg := fastConfig()
	cfg.DataParallelSize = 2
	s := startSim(t, cfg)
	prefix := seqTokens(10000, 2000)
	first := post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": concat(prefix, seqTokens(1, 100)), "max_tokens": 2},
		"X-data-parallel-rank", "1")
	second := post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": concat(prefix, seqTokens(50000, 77)), "max_tokens": 2},
		"X-data-parallel-rank", "1")
	c1, c2 := decodeJSON[completionResponse](t, first), decodeJSON[completionResponse](t, second)
	if first.header.Get("x-vllm-sim-rank") != "1" || second.header.Get("x-vllm-sim-rank") != "1" {
		t.Fatalf("served by ranks %q and %q, want 1 and 1", first.header.Get("x-vllm-sim-rank"), second.header.Get("x-vllm-sim-rank"))
	}
	// 2,000 = 125 whole blocks of 16: all of the shared prefix hits.
	if c1.Usage.PromptTokensDetails.CachedTokens != 0 || c2.Usage.PromptTokensDetails.CachedTokens != 2000 {
		t.Fatalf("cached_tokens %d then %d, want 0 then 2000", c1.Usage.PromptTokensDetails.CachedTokens, c2.Usage.PromptTokensDetails.CachedTokens)
	}
	st := s.CacheState()
	if len(st.Ranks[0].Hashes) != 0 || len(st.Ranks[1].Hashes) == 0 {
		t.Errorf("blocks per rank %d / %d, want all on rank 1", len(st.Ranks[0].Hashes), len(st.Ranks[1].Hashes))
	}
	// Counters in tokens, per engine: queries are prompt tokens, hits the cached ones.
	if q := metricValue(t, s, "vllm:prefix_cache_queries_total", `engine="1"`); q != 2100+2077 {
		t.Errorf("queries %v, want %d", q, 2100+2077)
	}
	if h := metricValue(t, s, "vllm:prefix_cache_hits_total", `engine="1"`); h != 2000 {
		t.Errorf("hits %v, want 2000", h)
	}
	if q := metricValue(t, s, "vllm:prefix_cache_queries_total", `engine="0"`); q != 0 {
		t.Errorf("rank 0 queries %v, want 0", q)
	}
}

// vLLM always recomputes the last prompt token: the hit is capped at prompt-1, whole blocks.
func TestHitCappedBelowPromptLength(t *testing.T) {
	s := startSim(t, fastConfig())
	cases := []struct{ n, want int }{{64, 48}, {65, 64}, {16, 0}, {17, 16}}
	for i, c := range cases {
		p := seqTokens(1000*(i+1), c.n)
		complete(t, s, map[string]any{"prompt": p})
		got := complete(t, s, map[string]any{"prompt": p}).Usage.PromptTokensDetails.CachedTokens
		if got != c.want {
			t.Errorf("prompt of %d tokens repeated: cached %d, want %d", c.n, got, c.want)
		}
	}
	// Generated tokens are hashed too: the prompt plus the first completion's output hits
	// the decode blocks it filled.
	p := seqTokens(90000, 20)
	out := complete(t, s, map[string]any{"prompt": p, "max_tokens": 30})
	follow := concat(p, Tokenize(out.Choices[0].Text), seqTokens(7, 3))
	got := complete(t, s, map[string]any{"prompt": follow}).Usage.PromptTokensDetails.CachedTokens
	// 20 prompt + 29 computed output tokens = 49 computed: 3 full blocks cached.
	if got != 48 {
		t.Errorf("follow-up on prompt+output cached %d, want 48", got)
	}
}

func TestMetricsNamesAndCacheConfig(t *testing.T) {
	s := startSim(t, fastConfig())
	complete(t, s, map[string]any{"prompt": seqTokens(0, 40)})
	body := string(get(t, s, "/metrics").body)
	for _, name := range []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
		"vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
		"vllm:cache_config_info", "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count"} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if !strings.Contains(body, `block_size="16"`) || !strings.Contains(body, `prefix_caching_hash_algo="sha256"`) {
		t.Errorf("cache_config_info labels missing:\n%s", body)
	}
	if n := metricValue(t, s, "vllm:time_to_first_token_seconds_count", `engine="0"`); n != 1 {
		t.Errorf("TTFT count %v, want 1", n)
	}
	if u := metricValue(t, s, "vllm:kv_cache_usage_perc", `engine="0"`); u != 0 {
		t.Errorf("idle usage %v, want 0 (cached but free blocks do not count)", u)
	}
}

// slowConfig makes a running request last long enough to observe.
func slowConfig() Config {
	cfg := fastConfig()
	cfg.DecodeMsPerToken = 20
	return cfg
}

func TestDataParallelLeastLoaded(t *testing.T) {
	cfg := slowConfig()
	cfg.DataParallelSize = 3
	s := startSim(t, cfg)
	var wg sync.WaitGroup
	// Two long requests: the first goes to rank 0 (all idle, lowest rank), the second to rank 1.
	for i, want := range []string{"0", "1"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(100*i, 10), "max_tokens": 40})
			if got := res.header.Get("x-vllm-sim-rank"); got != want {
				t.Errorf("long request %d on rank %s, want %s", i, got, want)
			}
		}()
		testkit.WaitFor(t, 5*time.Second, "the long request to run", func() bool { return s.CacheState().Ranks[i].Running == 1 })
	}
	res := post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": "x"})
	if got := res.header.Get("x-vllm-sim-rank"); got != "2" {
		t.Errorf("third request on rank %s, want the idle rank 2", got)
	}
	// A pinned request goes where it is told even when that rank is the busiest.
	res = post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": "y"}, "X-data-parallel-rank", "0")
	if got := res.header.Get("x-vllm-sim-rank"); got != "0" || res.status != http.StatusOK {
		t.Errorf("pinned request on rank %s (status %d), want 0", got, res.status)
	}
	wg.Wait()
}

func TestFailRateIsSeededAndShaped(t *testing.T) {
	cfg := fastConfig()
	cfg.FailRate, cfg.Seed = 0.5, 7
	count := func() (fails int) {
		s := startSim(t, cfg)
		for range 40 {
			res := post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": "x"})
			if res.status == http.StatusInternalServerError {
				if e := decodeJSON[errorBody](t, res); e.Error.Code != 500 {
					t.Errorf("500 body %s", res.body)
				}
				fails++
			} else if res.status != http.StatusOK {
				t.Fatalf("status %d", res.status)
			}
		}
		return fails
	}
	a, b := count(), count()
	if a != b || a < 8 || a > 32 {
		t.Errorf("fail counts %d and %d with one seed; want equal and near 20", a, b)
	}
}

func TestClientDisconnectFreesBlocks(t *testing.T) {
	s := startSim(t, slowConfig())
	ctxReq := func() {
		req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/completions",
			strings.NewReader(`{"model":"m","prompt":"hello there","max_tokens":1000}`))
		client := &http.Client{Timeout: 100 * time.Millisecond}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			t.Error("a 1000-token completion at 20 ms a token finished within 100 ms")
		}
	}
	ctxReq()
	testkit.WaitFor(t, 5*time.Second, "the abandoned request to be dropped", func() bool {
		r := s.CacheState().Ranks[0]
		return r.Running == 0 && r.FreeBlocks == r.CapacityBlocks
	})
}

func TestRestartFailsRequestsInFlight(t *testing.T) {
	s := startSim(t, slowConfig())
	done := make(chan httpResult, 1)
	go func() {
		done <- post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": "abc", "max_tokens": 1000})
	}()
	testkit.WaitFor(t, 5*time.Second, "the request to run", func() bool { return s.CacheState().Ranks[0].Running == 1 })
	s.Restart()
	res := <-done
	if e := decodeJSON[errorBody](t, res); res.status != http.StatusInternalServerError || !strings.Contains(e.Error.Message, "restarted") {
		t.Errorf("in-flight request after restart: %d %s", res.status, res.body)
	}
	if q := metricValue(t, s, "vllm:prefix_cache_queries_total", `engine="0"`); q != 0 {
		t.Errorf("counters survived the restart: queries %v", q)
	}
	// The restarted engine serves again.
	if c := complete(t, s, map[string]any{"prompt": "abc"}); len(c.Choices) != 1 {
		t.Errorf("after restart: %+v", c)
	}
}
