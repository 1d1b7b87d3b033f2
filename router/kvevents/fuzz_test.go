package kvevents

import (
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvwire"
)

// FuzzIngest feeds arbitrary payloads through the decoder and the ingester (parity on every
// event): whatever decodes must apply without a panic and leave the index consistent.
func FuzzIngest(f *testing.F) {
	c, err := kvtestCache()
	if err != nil {
		f.Fatal(err)
	}
	enc := kvwire.NewEncoder()
	a := toks(1, 3*testBS)
	ev1, _ := c.Store(a, 0)
	ev2, _ := c.Store(append(append([]uint32(nil), a...), toks(2, testBS)...), 3)
	ev3, _ := c.Evict(c.Hashes(a)[2])
	for _, layout := range []kvwire.Layout{kvwire.LayoutMap, kvwire.LayoutArray} {
		p, err := enc.AppendBatch(nil, &kvwire.Batch{TS: 1, Events: []kvwire.Event{ev1, ev2, ev3, c.Clear()}}, layout)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		ix := index.New(index.Options{})
		id, _ := ix.AddReplica("e", 0)
		g, err := NewIngester(ix, id, IngestOptions{BlockSize: testBS, Parity: &Parity{Algo: blockkey.AlgoSHA256CBOR, Seed: "0", Every: 1}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := kvwire.NewDecoder().DecodeBatch(payload)
		if err != nil {
			return
		}
		g.Apply(b)
		g.Apply(b) // a replayed duplicate too
		st, err := ix.Stats(id)
		if err != nil {
			t.Fatal(err)
		}
		for tier, n := range st.Blocks {
			if n < 0 || st.Copies[tier] < n {
				t.Fatalf("tier %d: %d blocks, %d copies", tier, n, st.Copies[tier])
			}
		}
	})
}
