package app

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/backlog"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// The backlog's seconds are left off /metrics until the drain rate is measured, and come once
// requests were served; /debug/engines shows it per replica. (The peers' shared totals in it:
// test/peers.)
func TestBacklogOnMetricsAndDebug(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	m := modelGauges(t, rt)
	if m["backlog_prefill_tokens"] != 0 || m["backlog_measured"] != 0 {
		t.Fatalf("before any request: tokens %v measured %v, want 0 0", m["backlog_prefill_tokens"], m["backlog_measured"])
	}
	if _, ok := m["backlog_seconds"]; ok {
		t.Fatal("backlog_seconds exported before the drain rate is measured")
	}
	for i := range 4 {
		postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(10+i, 256, 0, 0, 2))
	}
	testkit.WaitFor(t, waitBound, "backlog_seconds on /metrics", func() bool {
		m = modelGauges(t, rt)
		_, ok := m["backlog_seconds"]
		return ok && m["backlog_measured"] == 1
	})
	resp, err := http.Get(rt.admin.URL + "/debug/engines")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var page struct{ Backlog backlog.Fleet }
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		t.Fatal(err)
	}
	if !page.Backlog.Measured || page.Backlog.Ready != 2 || len(page.Backlog.Replicas) != 2 || page.Backlog.DrainTokensPerS <= 0 {
		t.Fatalf("/debug/engines backlog: %+v", page.Backlog)
	}
}

// modelGauges are the router's model-level series on /metrics by name (labels dropped; the
// per-replica ones are left out).
func modelGauges(t *testing.T, rt *router) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, line := range strings.Split(scrape(t, rt), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(name, "kvroute_router_") || strings.Contains(name, "engine=") {
			continue
		}
		name, _, _ = strings.Cut(strings.TrimPrefix(name, "kvroute_router_"), "{")
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
		}
	}
	return out
}
