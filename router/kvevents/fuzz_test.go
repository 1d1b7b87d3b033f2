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
	// vLLM's 2026 contract: copies, shared residency, ownership, session_id, token-less tier
	// updates (testdata/vllm/kv-contract).
	for _, frames := range contractSeeds(f) {
		f.Add(frames[2])
	}
	tokenless := ev2
	tokenless.Stored.TokenIDs, tokenless.Stored.ParentBlockHash, tokenless.Stored.Medium = nil, kvwire.Opt[kvwire.Hash]{}, kvwire.Some("CPU")
	if p, err := enc.AppendBatch(nil, &kvwire.Batch{TS: 1, Events: []kvwire.Event{ev1, tokenless}}, kvwire.LayoutMap); err == nil {
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

// FuzzStoredSizes builds BlockStored events from typed sizes (hash count, block size, token
// count, parent, extra keys) and runs them through AppendRouterKeys and Ingester.Apply, so the
// arithmetic on wire sizes is fuzzed directly rather than reached by chance through msgpack
// bytes. The seed corpus holds the event of issue 15 (4 hashes, block size 2^62, no tokens).
func FuzzStoredSizes(f *testing.F) {
	f.Add(uint16(4), int64(1)<<62, uint16(0), false, uint64(0), uint8(0))                      // issue 15
	f.Add(uint16(2), int64(testBS), uint16(2*testBS), false, uint64(0), uint8(0))              // valid
	f.Add(uint16(2), int64(testBS), uint16(2*testBS), true, uint64(7), uint8(2))               // unknown parent, extras
	f.Add(uint16(3), int64(-1), uint16(3), false, uint64(0), uint8(3))                         // negative
	f.Add(uint16(1), int64(blockkey.MaxBlockSize+1), uint16(4097), false, uint64(0), uint8(1)) // oversized
	f.Add(uint16(8), int64(1)<<61, uint16(0), false, uint64(0), uint8(9))                      // wraps, extras short
	f.Fuzz(func(t *testing.T, nHashes uint16, blockSize int64, nTokens uint16, hasParent bool, parent uint64, nExtras uint8) {
		nHashes %= 512 // bounded work per input; the sizes, not the counts, are what is fuzzed
		ev := storedEvent(1, int(nHashes), blockSize, toks(3, int(nTokens)))
		if hasParent {
			ev.Stored.ParentBlockHash = kvwire.Some(kvwire.IntHash(parent))
		}
		if nExtras > 0 {
			ex := make([]blockkey.Extras, int(nExtras)-1) // one short of nExtras-1 hashes or more
			ev.Stored.ExtraKeys = kvwire.Some(ex)
		}
		s := &ev.Stored
		keys, err := s.AppendRouterKeys(nil, blockkey.RootKey)
		valid := s.CheckTokens() == nil
		if err == nil && (!valid || len(keys) != int(nHashes)) {
			t.Fatalf("keys %d for %d hashes, sizes valid %v", len(keys), nHashes, valid)
		}
		ix := index.New(index.Options{})
		id, _ := ix.AddReplica("e", 0)
		g, err := NewIngester(ix, id, IngestOptions{Parity: &Parity{Algo: blockkey.AlgoSHA256CBOR, Seed: "0", Every: 1}})
		if err != nil {
			t.Fatal(err)
		}
		g.Apply(&kvwire.Batch{Events: []kvwire.Event{ev}})
		st := g.Stats()
		if st.BlockSize != 0 && !valid {
			t.Fatalf("block size %d learned from an event whose sizes are invalid", st.BlockSize)
		}
		if st.BlocksStored > uint64(nHashes) {
			t.Fatalf("%d blocks stored from %d hashes", st.BlocksStored, nHashes)
		}
	})
}
