package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestStateCollector(t *testing.T) {
	sc := NewStateCollector(func() []Stream {
		return []Stream{{Engine: "e0", Rank: "1", State: "inexact", Resets: 2, BlocksGPU: 7, Healthy: true}}
	}, func() float64 { return 42 }, func() (float64, float64) { return 3, 4 })
	m := New(sc)
	m.Requests.WithLabelValues("e0", "kv", "200").Inc()
	want := `
# HELP kvroute_router_stream_state 1 for the stream's current state.
# TYPE kvroute_router_stream_state gauge
kvroute_router_stream_state{engine="e0",rank="1",state="approximate"} 0
kvroute_router_stream_state{engine="e0",rank="1",state="exact"} 0
kvroute_router_stream_state{engine="e0",rank="1",state="inexact"} 1
kvroute_router_stream_state{engine="e0",rank="1",state="replaying"} 0
# HELP kvroute_router_index_entries Distinct router keys in the exact index.
# TYPE kvroute_router_index_entries gauge
kvroute_router_index_entries 42
# HELP kvroute_router_index_blocks_gpu Blocks indexed on GPU.
# TYPE kvroute_router_index_blocks_gpu gauge
kvroute_router_index_blocks_gpu{engine="e0",rank="1"} 7
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want),
		"kvroute_router_stream_state", "kvroute_router_index_entries", "kvroute_router_index_blocks_gpu"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(m.Registry, "kvroute_router_requests_total"); err != nil || n != 1 {
		t.Fatalf("requests_total series %d %v", n, err)
	}
}
