package kvevents

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

// vLLM's contract (tests/v1/core/test_kv_events_contract.py at commit a0db8d8a0eb8,
// test_each_copy_of_a_hash_is_stored_and_removed): two physical copies of the same hashes, both
// cached with no parent, each get a BlockStored, and each eviction its own BlockRemoved; freeing
// emits nothing. With CopyPerStore the block leaves the index with its last copy; without it (a
// router that injects full report mode) the second store is taken for a re-announcement.
func TestEachCopyIsStoredAndRemoved(t *testing.T) {
	for _, perStore := range []bool{true, false} {
		g, ix, id := newIngest(t, IngestOptions{BlockSize: testBS, CopyPerStore: perStore})
		c := newCache(t)
		st := must[kvwire.Event](t)
		a := toks(1, 2*testBS)
		g.Apply(roundTrip(t, st(c.Store(a, 0)), st(c.Store(a, 0))))
		hs := c.Hashes(a)
		first := roundTrip(t, st(c.Evict(hs[0])), st(c.Evict(hs[1])))
		g.Apply(first)
		ist, _ := ix.Stats(id)
		if perStore {
			if d := kvtest.Diff(ix, id, c.Resident()); d != "" || ist.Copies[index.GPU] != 2 {
				t.Fatalf("after the first copy's eviction: %s, %d copies; want both blocks, 2 copies", d, ist.Copies[index.GPU])
			}
			if s := g.Stats(); s.CopiesStored != 2 || s.BlocksReannounced != 0 {
				t.Fatalf("copies stored %d reannounced %d; want 2, 0", s.CopiesStored, s.BlocksReannounced)
			}
		} else if ist.Blocks[index.GPU] != 0 {
			t.Fatalf("without CopyPerStore the first eviction leaves %d blocks, want 0 (a missed hit, never a phantom)", ist.Blocks[index.GPU])
		}
		g.Apply(roundTrip(t, st(c.Evict(hs[0])), st(c.Evict(hs[1]))))
		if ist, _ := ix.Stats(id); ist.Blocks[index.GPU] != 0 || ist.Copies[index.GPU] != 0 {
			t.Fatalf("after the last copy: %v blocks %v copies", ist.Blocks, ist.Copies)
		}
	}
}

// A copy in storage the engine reaches but does not hold (locality REMOTE; media FS, OBJ,
// STORAGE) is not the replica's cache: nothing routes on it, but it is counted per residency key
// and shown. Unknown media and localities fail closed.
func TestSharedResidencyIsShownNotRouted(t *testing.T) {
	g, ix, id := newIngest(t, IngestOptions{BlockSize: testBS, CopyPerStore: true})
	c := newCache(t)
	st := must[kvwire.Event](t)
	a := toks(1, 2*testBS)
	base := st(c.Store(a, 0))
	hs := c.Hashes(a)
	variant := func(medium, locality, owner string) kvwire.Event {
		e := base
		e.Stored.Medium = kvwire.Some(medium)
		if locality != "" {
			e.Stored.Locality = kvwire.Some(locality)
		}
		if owner != "" {
			e.Stored.Ownership = kvwire.Some(owner)
		}
		return e
	}
	removed := func(medium, locality, owner string) kvwire.Event {
		r := kvwire.BlockRemoved{BlockHashes: []kvwire.Hash{kvwire.IntHash(hs[0])}, Medium: kvwire.Some(medium), GroupIdx: kvwire.Some(int64(0))}
		if locality != "" {
			r.Locality = kvwire.Some(locality)
		}
		if owner != "" {
			r.Ownership = kvwire.Some(owner)
		}
		return kvwire.Event{Type: kvwire.EventBlockRemoved, Removed: r}
	}
	g.Apply(roundTrip(t,
		variant("CPU", "REMOTE", ""), // remote host memory
		variant("FS", "", "kvcr"),    // a shared file system, owned by a connector
		variant("OBJ", "LOCAL", ""),  // an object store: shared whatever the locality says
		variant("STORAGE", "", ""),
		variant("NVME_OF", "", ""),   // unknown medium
		variant("GPU", "NEARBY", ""), // unknown locality
	))
	if ist, _ := ix.Stats(id); ist.Blocks != [index.NumTiers]int{} {
		t.Fatalf("shared copies entered the routing index: %v", ist.Blocks)
	}
	s := g.Stats()
	if s.SharedStored != 8 || s.SharedBlocks != 8 || s.SharedCopies != 8 || s.SkippedMedia != 2 {
		t.Fatalf("shared stored %d blocks %d copies %d skipped media %d; want 8 8 8 2", s.SharedStored, s.SharedBlocks, s.SharedCopies, s.SkippedMedia)
	}
	if !slices.Equal(s.Owners, []string{"kvcr"}) {
		t.Fatalf("owners %v", s.Owners)
	}
	// A removal names its residency key: the FS copy owned by kvcr goes, a removal for an owner
	// that holds nothing there changes nothing.
	g.Apply(roundTrip(t, removed("FS", "", "kvcr"), removed("FS", "", "other")))
	s = g.Stats()
	if s.SharedRemoved != 1 || s.SharedBlocks != 7 || s.SharedCopies != 7 || s.UnknownRemoves != 1 {
		t.Fatalf("after removals: removed %d blocks %d copies %d unknown removes %d; want 1 7 7 1", s.SharedRemoved, s.SharedBlocks, s.SharedCopies, s.UnknownRemoves)
	}
	// The replica's own GPU copy with a session id: routed, and the session counted.
	own := base
	own.Stored.SessionID = kvwire.Some("conv-1")
	g.Apply(roundTrip(t, own))
	if d := kvtest.Diff(ix, id, c.Resident()); d != "" {
		t.Fatal(d)
	}
	if s := g.Stats(); s.SessionStores != 1 {
		t.Fatalf("session stores %d", s.SessionStores)
	}
}

func TestParseResidency(t *testing.T) {
	for _, c := range []struct {
		medium, locality string
		tier             index.Tier
		res              index.Residency
	}{
		{"", "", index.GPU, index.Own}, {"GPU", "LOCAL", index.GPU, index.Own}, {"CPU", "", index.CPU, index.Own},
		{"DISK", "", index.Disk, index.Own}, {"CPU", "REMOTE", index.CPU, index.Shared},
		{"FS", "", index.Disk, index.Shared}, {"OBJ", "LOCAL", index.Disk, index.Shared}, {"STORAGE", "", index.Disk, index.Shared},
		{"NVME_OF", "", index.Disk, index.Unknown}, {"GPU", "NEARBY", index.GPU, index.Unknown},
	} {
		if tier, res := index.ParseResidency(c.medium, c.locality); tier != c.tier || res != c.res {
			t.Errorf("ParseResidency(%q, %q) = %v, %v; want %v, %v", c.medium, c.locality, tier, res, c.tier, c.res)
		}
	}
}

// A snapshot's tier update carries hashes without tokens: resolved through the engine hash the
// replica already holds (its tokens came in an earlier store), counted where it does not.
func TestTokenlessStoreResolvedByEngineHash(t *testing.T) {
	g, ix, id := newIngest(t, IngestOptions{BlockSize: testBS, CopyPerStore: true})
	c := newCache(t)
	st := must[kvwire.Event](t)
	a := toks(1, 2*testBS)
	g.Apply(roundTrip(t, st(c.Store(a, 0))))
	hs := c.Hashes(a)
	tier := kvwire.Event{Type: kvwire.EventBlockStored, Stored: kvwire.BlockStored{
		BlockHashes: []kvwire.Hash{kvwire.IntHash(hs[1]), kvwire.IntHash(99)}, TokenIDs: []uint32{}, BlockSize: testBS,
		Medium: kvwire.Some("CPU")}}
	g.Apply(roundTrip(t, tier))
	s := g.Stats()
	if s.TokenlessResolved != 1 || s.TokenlessUnresolved != 1 || s.RekeyErrors != 0 {
		t.Fatalf("resolved %d unresolved %d rekey errors %d; want 1 1 0", s.TokenlessResolved, s.TokenlessUnresolved, s.RekeyErrors)
	}
	tiers, _ := ix.Export(id)
	if len(tiers[index.CPU]) != 1 || tiers[index.CPU][0].Hash != hs[1] || tiers[index.CPU][0].Key != c.Resident()[hs[1]] {
		t.Fatalf("CPU tier %+v, want block 1 under its router key", tiers[index.CPU])
	}
}
