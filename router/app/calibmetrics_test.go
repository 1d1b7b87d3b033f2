package app

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// The drain the ledger fits from first tokens is on /metrics: the rate is 0 before any first
// token and positive after requests were served.
func TestCalibrationOnMetrics(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	read := func() map[string]float64 {
		resp, err := http.Get(rt.admin.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		out := map[string]float64{}
		for _, line := range strings.Split(string(body), "\n") {
			name, val, ok := strings.Cut(line, " ")
			if !ok || !strings.HasPrefix(name, "kvroute_router_") {
				continue
			}
			if v, err := strconv.ParseFloat(val, 64); err == nil {
				out[strings.TrimPrefix(name, "kvroute_router_")] = v
			}
		}
		return out
	}
	m := read()
	for _, k := range []string{"prefill_drain_tokens_per_second", "prefill_drain_attention_weight"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("/metrics lacks kvroute_router_%s", k)
		}
	}
	if m["prefill_drain_tokens_per_second"] != 0 {
		t.Fatalf("before any request: drain %v; want 0", m["prefill_drain_tokens_per_second"])
	}
	for i := range 4 {
		postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(10+i, 256, 0, 0, 2))
	}
	eventually(t, "the drain rate on /metrics", func() bool {
		return read()["prefill_drain_tokens_per_second"] > 0
	})
}
