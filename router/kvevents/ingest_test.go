package kvevents

import (
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

// roundTrip encodes events as a payload and decodes it, as the stream worker sees them.
func roundTrip(t *testing.T, evs ...kvwire.Event) *kvwire.Batch {
	t.Helper()
	payload, err := kvwire.NewEncoder().AppendBatch(nil, &kvwire.Batch{TS: 1, Events: evs, DataParallelRank: kvwire.Some(int64(0))}, kvwire.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kvwire.NewDecoder().DecodeBatch(payload)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newIngest(t *testing.T, opts IngestOptions) (*Ingester, *index.Index, index.ReplicaID) {
	t.Helper()
	ix := index.New(index.Options{})
	id, err := ix.AddReplica("e", 0)
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewIngester(ix, id, opts)
	if err != nil {
		t.Fatal(err)
	}
	return g, ix, id
}

func TestParityCatchesSeedAndAlgorithmMismatch(t *testing.T) {
	st := must[kvwire.Event](t)
	for _, tc := range []struct {
		name     string
		parity   Parity
		mismatch bool
	}{
		{"same", Parity{Algo: blockkey.AlgoSHA256, Seed: "0", Every: 1}, false},
		{"seed", Parity{Algo: blockkey.AlgoSHA256, Seed: "1", Every: 1}, true},
		{"algo", Parity{Algo: blockkey.AlgoXXHash, Seed: "0", Every: 1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, _, _ := newIngest(t, IngestOptions{BlockSize: testBS, Parity: &tc.parity})
			c := newCache(t)
			for i := range 5 {
				g.Apply(roundTrip(t, st(c.Store(toks(uint32(i), 2*testBS), 0))))
			}
			s := g.Stats()
			want := uint64(0)
			if tc.mismatch {
				want = 5
			}
			if s.ParityChecked != 5 || s.ParityMismatches != want {
				t.Errorf("checked %d mismatches %d; want 5, %d", s.ParityChecked, s.ParityMismatches, want)
			}
		})
	}
}

func TestParityIsSampledAndBlockSizeChecked(t *testing.T) {
	g, _, _ := newIngest(t, IngestOptions{BlockSize: 32, Parity: &Parity{Algo: blockkey.AlgoSHA256, Seed: "0"}})
	c := newCache(t)
	st := must[kvwire.Event](t)
	for i := range 2 * DefaultParityEvery {
		g.Apply(roundTrip(t, st(c.Store(toks(uint32(i), testBS), 0))))
	}
	s := g.Stats()
	if s.ParityChecked != 2 || s.ParityMismatches != 0 || s.BlockSizeMismatches != 2*DefaultParityEvery || s.BlockSize != testBS {
		t.Errorf("checked %d mismatches %d block-size mismatches %d block size %d", s.ParityChecked, s.ParityMismatches, s.BlockSizeMismatches, s.BlockSize)
	}
}

func TestIngestSkipsOtherGroupsMediaAndUnknownParents(t *testing.T) {
	g, ix, id := newIngest(t, IngestOptions{})
	c := newCache(t)
	st := must[kvwire.Event](t)
	a := toks(1, 3*testBS)
	stored := st(c.Store(a, 0))
	g.Apply(roundTrip(t, stored))

	// A sliding-window group announcing the same hashes: skipped, and so is its BlockRemoved,
	// which must not take the attention group's block away.
	sw := stored
	sw.Stored.GroupIdx = kvwire.Some(int64(1))
	sw.Stored.KVCacheSpecKind = kvwire.Some("sliding_window")
	h := c.Hashes(a)
	swRemoved := kvwire.Event{Type: kvwire.EventBlockRemoved, Removed: kvwire.BlockRemoved{
		BlockHashes: []kvwire.Hash{kvwire.IntHash(h[0])}, Medium: kvwire.Some("GPU"), GroupIdx: kvwire.Some(int64(1))}}
	// An unknown medium (a new connector tier) and a CPU copy.
	odd := stored
	odd.Stored.Medium = kvwire.Some("NVME_OF")
	cpu := stored
	cpu.Stored.Medium = kvwire.Some("CPU")
	// A BlockStored whose parent this replica never saw.
	orphan := stored
	orphan.Stored.ParentBlockHash = kvwire.Some(kvwire.IntHash(12345))
	g.Apply(roundTrip(t, sw, swRemoved, odd, cpu, orphan))
	g.Apply(&kvwire.Batch{Events: []kvwire.Event{{Type: kvwire.EventUnknown, Tag: "BlockInactive"}}})

	s := g.Stats()
	if s.SkippedGroups != 2 || s.SkippedMedia != 1 || s.UnknownParent != 1 || s.UnknownEvents != 1 {
		t.Errorf("skipped groups %d media %d unknown parent %d unknown events %d; want 2, 1, 1, 1", s.SkippedGroups, s.SkippedMedia, s.UnknownParent, s.UnknownEvents)
	}
	if d := kvtest.Diff(ix, id, c.Resident()); d != "" {
		t.Error(d)
	}
	ist, _ := ix.Stats(id)
	if ist.Blocks[index.CPU] != 3 {
		t.Errorf("%d CPU blocks, want 3", ist.Blocks[index.CPU])
	}
	// Chained children re-key from the parent's router key: the index key equals the request's.
	child := append(append([]uint32(nil), a...), toks(2, testBS)...)
	g.Apply(roundTrip(t, st(c.Store(child, 3))))
	keys, _ := blockkey.AppendPromptKeys(nil, child, testBS, blockkey.Identity{})
	m := ix.Match(keys, nil)
	if len(m) <= int(id) || m[id].Blocks != 4 {
		t.Errorf("match %+v, want 4 blocks on replica %d", m, id)
	}
	if cleared := g.Apply(roundTrip(t, c.Clear())); !cleared {
		t.Error("AllBlocksCleared not reported")
	}
	// AllBlocksCleared comes from the GPU block pool: the CPU copies stay
	// (docs/features/kv_events.md, read at commit 0aa3ce853c7d).
	if ist, _ := ix.Stats(id); ist.Blocks != [index.NumTiers]int{0, 3, 0} {
		t.Errorf("blocks after clear: %v, want the 3 CPU blocks only", ist.Blocks)
	}
}

func kvtestCache() (*kvtest.Cache, error) { return kvtest.NewCache(blockkey.AlgoSHA256, "0", testBS) }
