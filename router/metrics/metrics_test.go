package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestStateCollector(t *testing.T) {
	specs := []CounterSpec{{"stream_resets_total", "Resets.", false}, {"stream_panics_total", "Panics.", false}}
	sc := NewStateCollector(func() []Stream {
		return []Stream{{Engine: "e0", Rank: "1", State: "inexact", Counters: []float64{2, 0}, BlocksGPU: 7, Healthy: true},
			{Engine: "e1", Rank: "0", State: "none"}} // no stream: no counter series
	}, func() float64 { return 42 }, func() (float64, float64) { return 3, 4 }, func() float64 { return 5 }, specs)
	sc.SideEvicted = func() (float64, float64) { return 6, 0 }
	m := New(sc)
	m.Requests.WithLabelValues("e0", "kv", "200").Inc()
	want := `
# HELP kvroute_router_stream_state 1 for the stream's current state.
# TYPE kvroute_router_stream_state gauge
kvroute_router_stream_state{engine="e0",rank="1",state="approximate"} 0
kvroute_router_stream_state{engine="e0",rank="1",state="exact"} 0
kvroute_router_stream_state{engine="e0",rank="1",state="inexact"} 1
kvroute_router_stream_state{engine="e0",rank="1",state="replaying"} 0
kvroute_router_stream_state{engine="e1",rank="0",state="approximate"} 0
kvroute_router_stream_state{engine="e1",rank="0",state="exact"} 0
kvroute_router_stream_state{engine="e1",rank="0",state="inexact"} 0
kvroute_router_stream_state{engine="e1",rank="0",state="replaying"} 0
# HELP kvroute_router_index_entries Distinct router keys in the exact index.
# TYPE kvroute_router_index_entries gauge
kvroute_router_index_entries 42
# HELP kvroute_router_index_blocks_gpu Blocks indexed on GPU.
# TYPE kvroute_router_index_blocks_gpu gauge
kvroute_router_index_blocks_gpu{engine="e0",rank="1"} 7
kvroute_router_index_blocks_gpu{engine="e1",rank="0"} 0
# HELP kvroute_router_stream_resets_total Resets.
# TYPE kvroute_router_stream_resets_total counter
kvroute_router_stream_resets_total{engine="e0",rank="1"} 2
# HELP kvroute_router_stream_panics_total Panics.
# TYPE kvroute_router_stream_panics_total counter
kvroute_router_stream_panics_total{engine="e0",rank="1"} 0
# HELP kvroute_router_events_unroutable_total Messages on the bound events socket whose topic names no known engine (dropped).
# TYPE kvroute_router_events_unroutable_total counter
kvroute_router_events_unroutable_total 5
# HELP kvroute_router_side_index_evicted_total Side-index entries dropped because the replica's KV capacity (num_gpu_blocks) was full, as the engine evicts.
# TYPE kvroute_router_side_index_evicted_total counter
kvroute_router_side_index_evicted_total{index="approximate"} 0
kvroute_router_side_index_evicted_total{index="predicted"} 6
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want),
		"kvroute_router_stream_state", "kvroute_router_index_entries", "kvroute_router_index_blocks_gpu",
		"kvroute_router_stream_resets_total", "kvroute_router_stream_panics_total", "kvroute_router_events_unroutable_total",
		"kvroute_router_side_index_evicted_total"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(m.Registry, "kvroute_router_requests_total"); err != nil || n != 1 {
		t.Fatalf("requests_total series %d %v", n, err)
	}
	// Which build is running, on the router's own registry.
	if n, err := testutil.GatherAndCount(m.Registry, "kvroute_build_info"); err != nil || n != 1 {
		t.Fatalf("kvroute_build_info series %d %v", n, err)
	}
}
