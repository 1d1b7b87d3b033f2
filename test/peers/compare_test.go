package peers

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
)

// metric reads one series from the router's /metrics (0 when absent); labels as in testkit.Metric.
func (r *router) metric(name string, labels ...string) float64 {
	resp, err := http.Get("http://" + r.admin + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	v, _ := testkit.Metric(string(b), name, labels...)
	return v
}

type runResult struct {
	hit, balance, bytesPer1k, lagMs float64
}

// runWorkload sends the same shared-prefix workload through the routers in turn: groups of
// requests that share a 256-token prefix, 12 at a time, and returns the engines' cached share of
// prompt tokens, the busiest engine's requests over the mean, and the sync's cost.
func runWorkload(t *testing.T, rs []*router, seed int) runResult {
	t.Helper()
	const n, conc, groups = 240, 12, 8
	var mu sync.Mutex
	perEngine := map[string]int{}
	var cached, promptToks int
	var wg sync.WaitGroup
	sem := make(chan struct{}, conc)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			toks := prompt(seed*100+(i*7)%groups, seed*10000+i, 256, 320)
			eng, c, err := rs[i%len(rs)].completion(toks, 30)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			mu.Lock()
			perEngine[eng]++
			cached += c
			promptToks += len(toks)
			mu.Unlock()
		}()
	}
	wg.Wait()
	most := 0
	for _, c := range perEngine {
		most = max(most, c)
	}
	res := runResult{hit: float64(cached) / float64(promptToks), balance: float64(most) / (float64(n) / 4)}
	var bytes, lagSum, lagN float64
	for _, r := range rs {
		bytes += r.metric("kvroute_router_peer_sync_bytes_total", `direction="sent"`)
		lagSum += r.metric("kvroute_router_peer_sync_lag_seconds_sum")
		lagN += r.metric("kvroute_router_peer_sync_lag_seconds_count")
	}
	res.bytesPer1k = bytes * 1000 / n
	if lagN > 0 {
		res.lagMs = lagSum / lagN * 1000
	}
	return res
}

// TestCompareOneAndThreeRouters measures one router, three routers sharing their load, and three
// routers each on its own (no shared load), on fresh engines each time, per seed. It is a
// measurement, not a check: set KVROUTE_PEERS_COMPARE=1.
func TestCompareOneAndThreeRouters(t *testing.T) {
	if os.Getenv("KVROUTE_PEERS_COMPARE") == "" {
		t.Skip("a measurement; set KVROUTE_PEERS_COMPARE=1")
	}
	seeds := 3
	type cfg struct {
		name string
		mk   func(es []engine) []*router
	}
	cfgs := []cfg{
		{"1 router", func(es []engine) []*router { return []*router{startRouter(t, "solo", es, "")} }},
		{"3 routers, shared load", func(es []engine) []*router { return threeRouters(t, es) }},
		{"3 routers, load local", func(es []engine) []*router {
			return []*router{startRouter(t, "la", es, ""), startRouter(t, "lb", es, ""), startRouter(t, "lc", es, "")}
		}},
	}
	results := map[string][]runResult{}
	for seed := range seeds {
		for _, c := range cfgs {
			t.Run(fmt.Sprintf("%s/seed%d", c.name, seed), func(t *testing.T) {
				es := startEngines(t, 4, "--decode-ms-per-token", "5", "--prefill-tokens-per-s", "40000", "--num-gpu-blocks", "400")
				rs := c.mk(es)
				for _, r := range rs {
					testkit.WaitFor(t, 20*time.Second, r.id+" ready", r.ready)
				}
				res := runWorkload(t, rs, seed)
				results[c.name] = append(results[c.name], res)
				t.Logf("%s seed %d: hit %.3f, busiest/mean %.2f, sync bytes per 1k requests %.0f, mean sync lag %.1f ms",
					c.name, seed, res.hit, res.balance, res.bytesPer1k, res.lagMs)
			})
		}
	}
	for _, c := range cfgs[1:] {
		var ratios []float64
		for i, r := range results[c.name] {
			if i < len(results["1 router"]) && results["1 router"][i].hit > 0 {
				ratios = append(ratios, r.hit/results["1 router"][i].hit)
			}
		}
		m, half := meanCI(ratios)
		t.Logf("%s vs 1 router: hit-rate ratio %.3f ± %.3f (95%%, %d seeds)", c.name, m, half, len(ratios))
	}
}

// meanCI is the mean and the half-width of its 95% interval (t distribution, small n).
func meanCI(xs []float64) (mean, half float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, math.Inf(1)
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	sd := math.Sqrt(ss / float64(len(xs)-1))
	tq := map[int]float64{1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}[len(xs)-1]
	if tq == 0 {
		tq = 2.0
	}
	return mean, tq * sd / math.Sqrt(float64(len(xs)))
}
