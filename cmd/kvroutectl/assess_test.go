package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/sim/vllmsim"
)

func TestAssessUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{nil, "exactly one of --prometheus and --engines"},
		{[]string{"--prometheus", "http://p:9090", "--engines", "http://e:8000"}, "exactly one of"},
		{[]string{"--engines", "http://e:8000", "--output", "yaml"}, "--output must be table, json or markdown"},
		{[]string{"--engines", "http://e:8000", "--window", "0s"}, "--window must be positive"},
		{[]string{"--engines", "http://e:8000", "--high-hit-rate", "1.5"}, "high hit rate must be in (0, 1]"},
		{[]string{"--prometheus", "http://p:9090", "--api-key-file", "k"}, "apply to --engines"},
		{[]string{"--engines", "http://e:8000", "--selector", `job="x"`}, "apply to --prometheus"},
		{[]string{"--prometheus", "http://p:9090", "stray"}, `unexpected argument "stray"`},
		{[]string{"--no-such-flag"}, "flag provided but not defined"},
	} {
		rc, out, errs := runCmd(t, runAssess, "", c.args...)
		if rc != 2 || !strings.Contains(errs, c.msg) || out != "" {
			t.Errorf("%v: rc %d, stderr %q (want %q)", c.args, rc, errs, c.msg)
		}
	}
	var help bytes.Buffer
	if rc := run([]string{"--help"}, nil, nil, &help); rc != 0 || !strings.Contains(help.String(), "assess") {
		t.Errorf("kvroutectl --help does not list assess: %q", help.String())
	}
}

// promStub answers every instant query with one sample per pod, the value chosen by the metric
// the query names; it checks the bearer token and records the queries.
func promStub(t *testing.T, token string, values map[string][2]float64) (string, *[]string) {
	t.Helper()
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		_ = r.ParseForm()
		q := r.Form.Get("query")
		queries = append(queries, q)
		result := []any{}
		for metric, v := range values {
			if strings.Contains(q, "("+metric+"{") || strings.Contains(q, "("+metric+"[") {
				for i, pod := range []string{"vllm-0", "vllm-1"} {
					result = append(result, map[string]any{
						"metric": map[string]string{"pod": pod, "engine": "0", "model_name": "qwen"},
						"value":  []any{1.7e9, fmt.Sprint(v[i])}})
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success",
			"data": map[string]any{"resultType": "vector", "result": result}})
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &queries
}

func TestAssessPrometheus(t *testing.T) {
	url, queries := promStub(t, "tok", map[string][2]float64{
		"vllm:prefix_cache_queries_total": {100000, 100000},
		"vllm:prefix_cache_hits_total":    {90000, 85000},
		"vllm:request_success_total":      {200, 210},
		"vllm:num_preemptions_total":      {0, 0},
		"vllm:kv_cache_usage_perc":        {0.2, 0.3},
	})
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rc, out, errs := runCmd(t, runAssess, "", "--prometheus", url, "--prometheus-token-file", tokenFile,
		"--window", "15m", "--selector", `namespace="llm"`, "--output", "markdown")
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, errs)
	}
	for _, w := range []string{"**Verdict: `already-high`**", "| vllm-0/0 | 90.0% |", "| vllm-1/0 | 85.0% |", "model qwen, 2 replicas, window 15m0s"} {
		if !strings.Contains(out, w) {
			t.Errorf("markdown lacks %q:\n%s", w, out)
		}
	}
	if len(*queries) == 0 || !strings.Contains((*queries)[0], `{namespace="llm"}[15m]`) {
		t.Errorf("queries %q", *queries)
	}
	// Stricter threshold: the same counters are no longer "already high", and with two replicas
	// at 87.5% even the favourable reading leaves less than +10 points to gain.
	rc, out, _ = runCmd(t, runAssess, "", "--prometheus", url, "--prometheus-token-file", tokenFile, "--high-hit-rate", "0.95", "--output", "json")
	var a struct {
		Verdict string `json:"verdict"`
	}
	if rc != 0 || json.Unmarshal([]byte(out), &a) != nil || a.Verdict != "not-worth-it" {
		t.Errorf("rc %d, verdict %q", rc, a.Verdict)
	}
	// Without the token Prometheus refuses, and the message says which flag fixes it.
	rc, _, errs = runCmd(t, runAssess, "", "--prometheus", url)
	if rc != 1 || !strings.Contains(errs, "--prometheus-token-file") {
		t.Errorf("rc %d: %s", rc, errs)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	rc, out, errs = runCmd(t, runAssess, "", "--prometheus", dead)
	if rc != 1 || out != "" || !strings.Contains(errs, "cannot query Prometheus at "+dead) {
		t.Errorf("unreachable: rc %d, %q", rc, errs)
	}
}

// End to end over real simulators: URLs given after one --engines, traffic inside the window,
// and the key for an auth proxy from the environment.
func TestAssessEngines(t *testing.T) {
	var urls []string
	var sims []*vllmsim.Sim
	for range 3 {
		sim, err := vllmsim.New(vllmsim.Config{TimeScale: 50})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(func() { cancel(); _ = sim.Close() })
		if err := sim.Start(ctx); err != nil {
			t.Fatal(err)
		}
		h := sim.Handler()
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/metrics" && r.Header.Get("Authorization") != "Bearer env-key" {
				http.Error(w, "key required", http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		}))
		t.Cleanup(proxy.Close)
		sims = append(sims, sim)
		urls = append(urls, proxy.URL)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	engineWait = func(ctx context.Context) error {
		for i := range 30 { // unique prompts, round-robin
			prompt := make([]uint32, 600)
			for j := range prompt {
				prompt[j] = uint32(rng.IntN(150000))
			}
			body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1})
			resp, err := http.Post(sims[i%3].URL()+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				return err
			}
			resp.Body.Close()
		}
		return nil
	}
	t.Cleanup(func() { engineWait = nil })

	rc, _, errs := runCmd(t, runAssess, "", append([]string{"--engines"}, urls...)...)
	if rc != 1 || !strings.Contains(errs, "401 Unauthorized") || !strings.Contains(errs, "VLLM_API_KEY") {
		t.Fatalf("without a key: rc %d, %s", rc, errs)
	}
	t.Setenv("VLLM_API_KEY", "env-key")
	args := append(append([]string{"--engines", urls[0]}, urls[1:]...), "--output", "table")
	rc, out, errs := runCmd(t, runAssess, "", args...)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, errs)
	}
	for _, w := range []string{"VERDICT: not-worth-it", "model vllm-sim, 3 replicas", "from engines", "0.0%",
		"preempted_* stats that", "Counters: two scrapes"} {
		if !strings.Contains(out, w) {
			t.Errorf("table lacks %q:\n%s", w, out)
		}
	}
	// A key file wins over the environment; a wrong one is refused by the proxy.
	keyFile := filepath.Join(t.TempDir(), "key")
	_ = os.WriteFile(keyFile, []byte("wrong"), 0o600)
	rc, _, errs = runCmd(t, runAssess, "", "--engines", strings.Join(urls, ","), "--api-key-file", keyFile)
	if rc != 1 || !strings.Contains(errs, "the API key given was refused") {
		t.Errorf("wrong key file: rc %d, %s", rc, errs)
	}
}
