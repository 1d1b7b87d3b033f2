package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
)

// The engine's own queue and KV use (its /metrics, read by router/fleet) reach the decision:
// the candidates' queue and kv_util follow the page, per DP rank.
func TestEngineQueueAndKVUseReachTheDecision(t *testing.T) {
	var waiting atomic.Int64
	waiting.Store(7)
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			fmt.Fprintf(w, "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} %d\nvllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 2\n", waiting.Load())
			fmt.Fprint(w, "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.25\n")
		case "/v1/models":
			fmt.Fprint(w, `{"data":[{"id":"m"}]}`)
		default:
			w.WriteHeader(http.StatusOK)
		}
	}))
	defer eng.Close()
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{{Name: "e", URL: eng.URL, Ready: true,
		Events: []string{"tcp://127.0.0.1:1", "tcp://127.0.0.1:2"}}}),
		func(o *Options) { o.Config.Events.Enabled = false; o.ScrapeInterval = 50 * time.Millisecond })
	read := func() RouteAnswer {
		a := postJSON(t, rt.admin.URL+"/debug/route", idsPrompt(1, 64, 1, 1, 1))
		var ans RouteAnswer
		if a.status != 200 || json.Unmarshal(a.body, &ans) != nil || len(ans.Candidates) != 2 {
			t.Fatalf("/debug/route: %d %s", a.status, a.body)
		}
		return ans
	}
	testkit.WaitFor(t, waitBound, "the engine's figures in the decision", func() bool {
		c := read().Candidates
		return c[0].Breakdown.Queue == 7 && c[0].Breakdown.KVUtil == 0.5 && c[1].Breakdown.Queue == 2 && c[1].Breakdown.KVUtil == 0.25
	})
	waiting.Store(11)
	testkit.WaitFor(t, waitBound, "the next page's queue", func() bool { return read().Candidates[0].Breakdown.Queue == 11 })
}
