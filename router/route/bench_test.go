package route_test

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/route"
)

// BenchmarkDecide is a warm decision (keys, exact match, side-index match, every candidate's
// load and window read) over 16 replicas for a 32k-token prompt, each replica holding a
// different share of it and carrying load.
func BenchmarkDecide(b *testing.B) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	ix := index.New(index.Options{Now: clock})
	led := load.New(load.Options{Now: clock, Policy: pickFirst{}})
	toks := make([]uint32, 32_000)
	for i := range toks {
		toks[i] = uint32(1000 + i*31%100_000)
	}
	const size = 16
	keys, err := blockkey.AppendPromptKeys(nil, toks, size, blockkey.Identity{})
	if err != nil {
		b.Fatal(err)
	}
	hashes := make([]uint64, len(keys))
	for i := range hashes {
		hashes[i] = uint64(1 + i)
	}
	var reps []route.Replica
	for r := range 16 {
		id, err := ix.AddReplica("e", r)
		if err != nil {
			b.Fatal(err)
		}
		n := len(keys) * r / 16
		if err := ix.Store(id, hashes[:n], keys[:n], index.GPU); err != nil {
			b.Fatal(err)
		}
		ld := led.NewReplica(id, "e/")
		led.Routed(load.Routing{Replica: ld, Uncached: 100 * r, Held: 1000 * r})
		reps = append(reps, route.Replica{Name: "e/" + string(rune('a'+r)), ID: id, Ready: true, Healthy: true})
	}
	in := route.Input{Tokens: toks, BlockSize: size, NowNs: now.UnixNano()}
	var d route.Decision
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Decide(in, reps, ix, led); err != nil {
			b.Fatal(err)
		}
	}
}
