package index

import (
	"errors"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
)

// chain returns n distinct keys and their engine hashes, starting at seed.
func chain(seed uint64, n int) ([]blockkey.Key, []uint64) {
	keys := make([]blockkey.Key, n)
	hashes := make([]uint64, n)
	for i := range n {
		keys[i] = blockkey.Key(seed*1_000_003 + uint64(i)*7919 + 1)
		hashes[i] = engineHash(keys[i])
	}
	return keys, hashes
}

// engineHash is a stand-in engine hash: distinct from the key, one per key.
func engineHash(k blockkey.Key) uint64 { return uint64(k)*0x9E3779B97F4A7C15 ^ 0xABCDEF }

func mustAdd(t *testing.T, ix *Index, name string, rank int) ReplicaID {
	t.Helper()
	id, err := ix.AddReplica(name, rank)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func mustStore(t *testing.T, ix *Index, id ReplicaID, hashes []uint64, keys []blockkey.Key, tier Tier) {
	t.Helper()
	if err := ix.Store(id, hashes, keys, tier); err != nil {
		t.Fatal(err)
	}
}

func mustRemove(t *testing.T, ix *Index, id ReplicaID, hashes []uint64, tier Tier) int {
	t.Helper()
	n, err := ix.Remove(id, hashes, tier)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestAddReplicaIdempotentAndReused(t *testing.T) {
	ix := New(Options{})
	a := mustAdd(t, ix, "pod-a", 0)
	a1 := mustAdd(t, ix, "pod-a", 1)
	if a == a1 {
		t.Fatalf("two DP ranks got one id %d", a)
	}
	if again := mustAdd(t, ix, "pod-a", 0); again != a {
		t.Fatalf("re-adding a stream gave id %d, want %d", again, a)
	}
	if got, ok := ix.Replica("pod-a", 1); !ok || got != a1 {
		t.Fatalf("Replica(pod-a,1) = %d,%v", got, ok)
	}
	if _, err := ix.AddReplica("pod-b", -1); err == nil {
		t.Fatal("negative DP rank accepted")
	}

	keys, hashes := chain(1, 4)
	mustStore(t, ix, a, hashes, keys, GPU)
	if err := ix.RemoveReplica(a); err != nil {
		t.Fatal(err)
	}
	if ix.Keys() != 0 {
		t.Fatalf("removed replica left %d keys", ix.Keys())
	}
	if err := ix.RemoveReplica(a); !errors.Is(err, ErrUnknownReplica) {
		t.Fatalf("second RemoveReplica: %v", err)
	}
	b := mustAdd(t, ix, "pod-b", 0)
	if b != a {
		t.Fatalf("freed id not reused: got %d, want %d", b, a)
	}
	if m := ix.Match(keys, nil); m[b] != (Match{}) {
		t.Fatalf("reused id inherited blocks: %+v", m[b])
	}
}

func TestBadInput(t *testing.T) {
	ix := New(Options{})
	id := mustAdd(t, ix, "a", 0)
	keys, hashes := chain(1, 3)
	if err := ix.Store(id, hashes[:2], keys, GPU); !errors.Is(err, ErrLengthMismatch) {
		t.Fatalf("length mismatch: %v", err)
	}
	if err := ix.Store(id, hashes, keys, Tier(7)); !errors.Is(err, ErrBadTier) {
		t.Fatalf("bad tier: %v", err)
	}
	if _, err := ix.Remove(id, hashes, Tier(3)); !errors.Is(err, ErrBadTier) {
		t.Fatalf("bad tier on remove: %v", err)
	}
	if err := ix.Store(99, hashes, keys, GPU); !errors.Is(err, ErrUnknownReplica) {
		t.Fatalf("unknown replica: %v", err)
	}
	if err := ix.Clear(99); !errors.Is(err, ErrUnknownReplica) {
		t.Fatalf("clear unknown replica: %v", err)
	}
	if _, err := ix.Stats(99); !errors.Is(err, ErrUnknownReplica) {
		t.Fatalf("stats unknown replica: %v", err)
	}
	if _, ok := ix.ParentKey(99, hashes[0]); ok {
		t.Fatal("ParentKey on unknown replica found a key")
	}
	// Empty batches are fine.
	if err := ix.Store(id, nil, nil, GPU); err != nil {
		t.Fatal(err)
	}
	if got := ix.Match(nil, nil); len(got) != 1 || got[0] != (Match{}) {
		t.Fatalf("empty match: %+v", got)
	}
}

func TestStoreOnRemovedReplica(t *testing.T) {
	ix := New(Options{})
	id := mustAdd(t, ix, "a", 0)
	if err := ix.RemoveReplica(id); err != nil {
		t.Fatal(err)
	}
	keys, hashes := chain(1, 2)
	if err := ix.Store(id, hashes, keys, GPU); !errors.Is(err, ErrUnknownReplica) {
		t.Fatalf("store on removed replica: %v", err)
	}
	if _, err := ix.Remove(id, hashes, GPU); !errors.Is(err, ErrUnknownReplica) {
		t.Fatalf("remove on removed replica: %v", err)
	}
	if ix.Keys() != 0 {
		t.Fatal("store on removed replica left keys")
	}
}

func TestPrefixStopsAtFirstMiss(t *testing.T) {
	ix := New(Options{})
	a := mustAdd(t, ix, "a", 0)
	b := mustAdd(t, ix, "b", 0)
	c := mustAdd(t, ix, "c", 0)
	keys, hashes := chain(1, 10)
	// a: blocks 0..5 and 7..9 (6 missing) -> 6. b: 0..9 -> 10. c: 1..9 (0 missing) -> 0.
	mustStore(t, ix, a, hashes[:6], keys[:6], GPU)
	mustStore(t, ix, a, hashes[7:], keys[7:], GPU)
	mustStore(t, ix, b, hashes, keys, GPU)
	mustStore(t, ix, c, hashes[1:], keys[1:], GPU)

	out := make([]Match, 0, 8)
	got := ix.Match(keys, out)
	want := map[ReplicaID]Match{a: {Blocks: 6, GPU: 6}, b: {Blocks: 10, GPU: 10}, c: {}}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("replica %d: got %+v, want %+v", id, got[id], w)
		}
	}
	if &got[0] != &out[:1][0] {
		t.Error("Match did not reuse the caller's slice")
	}
	// A request that continues past what anyone holds.
	more, _ := chain(2, 3)
	req := append(append([]blockkey.Key{}, keys...), more...)
	if got := ix.Match(req, got); got[b].Blocks != 10 {
		t.Errorf("b on longer request: %+v", got[b])
	}
	// A request whose first block nobody holds.
	if got := ix.Match(more, got); got[a] != (Match{}) || got[b] != (Match{}) {
		t.Errorf("unheld first block matched: %+v", got)
	}
	if n := testing.AllocsPerRun(100, func() { ix.Match(keys, got) }); n != 0 {
		t.Errorf("Match allocates %v times with a reused slice", n)
	}
}

func TestRemoveAndUnknownHash(t *testing.T) {
	ix := New(Options{})
	a := mustAdd(t, ix, "a", 0)
	keys, hashes := chain(1, 4)
	mustStore(t, ix, a, hashes, keys, GPU)
	if n := mustRemove(t, ix, a, []uint64{12345, hashes[2], 999}, GPU); n != 2 {
		t.Fatalf("unknown count %d, want 2", n)
	}
	if got := ix.Match(keys, nil)[a]; got.Blocks != 2 {
		t.Fatalf("after removing block 2: %+v", got)
	}
	// Removing from a tier the replica does not hold it on changes nothing.
	if n := mustRemove(t, ix, a, hashes[:1], CPU); n != 1 {
		t.Fatalf("remove from CPU of a GPU block: unknown %d", n)
	}
	if got := ix.Match(keys, nil)[a]; got.Blocks != 2 {
		t.Fatalf("CPU remove touched GPU: %+v", got)
	}
	mustRemove(t, ix, a, hashes, GPU)
	if ix.Keys() != 0 {
		t.Fatalf("%d keys left after removing all", ix.Keys())
	}
}

func TestClear(t *testing.T) {
	ix := New(Options{})
	a := mustAdd(t, ix, "a", 0)
	b := mustAdd(t, ix, "b", 0)
	keys, hashes := chain(1, 5)
	mustStore(t, ix, a, hashes, keys, GPU)
	mustStore(t, ix, a, hashes, keys, CPU)
	mustStore(t, ix, b, hashes, keys, GPU)
	if err := ix.Clear(a); err != nil {
		t.Fatal(err)
	}
	got := ix.Match(keys, nil)
	if got[a] != (Match{}) || got[b].Blocks != 5 {
		t.Fatalf("after Clear(a): a %+v, b %+v", got[a], got[b])
	}
	if _, ok := ix.ParentKey(a, hashes[0]); ok {
		t.Fatal("cleared replica still maps engine hashes")
	}
	// The replica works again after a clear.
	mustStore(t, ix, a, hashes[:2], keys[:2], GPU)
	if got := ix.Match(keys, nil)[a]; got.Blocks != 2 {
		t.Fatalf("store after clear: %+v", got)
	}
}

// TestDuplicatesAndFullMode checks both halves of the copy rule on one replica at once: a
// genuine duplicate (StoreNew) survives the first BlockRemoved, and full-mode re-announcements
// (Store) never keep an evicted block.
func TestDuplicatesAndFullMode(t *testing.T) {
	ix := New(Options{})
	a := mustAdd(t, ix, "a", 0)
	keys, hashes := chain(1, 4)
	dup, reann := hashes[2:3], hashes[3:4]

	// Request A caches blocks 0..3 (parent nil).
	mustStore(t, ix, a, hashes, keys, GPU)
	// Request B shared blocks 0..1 and computed 2 concurrently: a second physical copy of 2.
	if err := ix.StoreNew(a, dup, keys[2:3], GPU); err != nil {
		t.Fatal(err)
	}
	// Full mode: hits on 0..3 re-announced three times (parent nil, from token 0).
	for range 3 {
		mustStore(t, ix, a, hashes, keys, GPU)
	}
	st, _ := ix.Stats(a)
	if st.Blocks[GPU] != 4 || st.Copies[GPU] != 5 {
		t.Fatalf("blocks %d copies %d, want 4 and 5", st.Blocks[GPU], st.Copies[GPU])
	}

	// The engine evicts block 3 once: it must leave although it was announced four times.
	mustRemove(t, ix, a, reann, GPU)
	if got := ix.Match(keys, nil)[a]; got.Blocks != 3 {
		t.Fatalf("evicted re-announced block still indexed: %+v", got)
	}
	// The engine evicts one copy of block 2: the other copy stays.
	mustRemove(t, ix, a, dup, GPU)
	if got := ix.Match(keys, nil)[a]; got.Blocks != 3 {
		t.Fatalf("duplicate lost after the first BlockRemoved: %+v", got)
	}
	// The second copy goes: now block 2 leaves too.
	mustRemove(t, ix, a, dup, GPU)
	if got := ix.Match(keys, nil)[a]; got.Blocks != 2 {
		t.Fatalf("block 2 kept after both copies were evicted: %+v", got)
	}
	// A third BlockRemoved for it is an unknown hash, not a negative count.
	if n := mustRemove(t, ix, a, dup, GPU); n != 1 {
		t.Fatalf("extra remove: unknown %d, want 1", n)
	}
	// And a later full-mode re-announcement brings back exactly one copy.
	mustStore(t, ix, a, dup, keys[2:3], GPU)
	mustRemove(t, ix, a, dup, GPU)
	if got := ix.Match(keys, nil)[a]; got.Blocks != 2 {
		t.Fatalf("re-announced then evicted block kept: %+v", got)
	}
}

func TestTiers(t *testing.T) {
	ix := New(Options{})
	a := mustAdd(t, ix, "a", 0)
	b := mustAdd(t, ix, "b", 0)
	keys, hashes := chain(1, 8)
	// a: 0..3 on GPU, 0..5 on CPU, 6..7 on disk.
	mustStore(t, ix, a, hashes[:4], keys[:4], GPU)
	mustStore(t, ix, a, hashes[:6], keys[:6], CPU)
	mustStore(t, ix, a, hashes[6:], keys[6:], Disk)
	// b: 0..1 on GPU only.
	mustStore(t, ix, b, hashes[:2], keys[:2], GPU)

	got := ix.Match(keys, nil)
	if w := (Match{Blocks: 8, GPU: 4, CPU: 2, Disk: 2}); got[a] != w {
		t.Fatalf("a: got %+v, want %+v", got[a], w)
	}
	if w := (Match{Blocks: 2, GPU: 2}); got[b] != w {
		t.Fatalf("b: got %+v, want %+v", got[b], w)
	}
	// Block 1 leaves a's GPU but stays on CPU: GPU prefix 1, any-tier prefix unchanged.
	mustRemove(t, ix, a, hashes[1:2], GPU)
	got = ix.Match(keys, got)
	if w := (Match{Blocks: 8, GPU: 1, CPU: 3, Disk: 2}); got[a] != w {
		t.Fatalf("a after GPU eviction of block 1: got %+v, want %+v", got[a], w)
	}
	if got[b].GPU != 2 {
		t.Fatalf("b lost GPU blocks: %+v", got[b])
	}
	// Dropping every CPU copy leaves the GPU-only shape again.
	mustRemove(t, ix, a, hashes[:6], CPU)
	got = ix.Match(keys, got)
	if w := (Match{Blocks: 1, GPU: 1}); got[a] != w {
		t.Fatalf("a after CPU drop: got %+v, want %+v", got[a], w)
	}
	st, _ := ix.Stats(a)
	if st.Blocks != [NumTiers]int{3, 0, 2} {
		t.Fatalf("a tier counts %v", st.Blocks)
	}
	mustRemove(t, ix, a, hashes, GPU)
	mustRemove(t, ix, a, hashes, Disk)
	mustRemove(t, ix, b, hashes, GPU)
	if ix.Keys() != 0 {
		t.Fatalf("%d keys left", ix.Keys())
	}
	for _, g := range ix.groups {
		if len(g.off) != 0 {
			t.Fatalf("%d off-GPU entries left", len(g.off))
		}
	}
}

func TestParseMedium(t *testing.T) {
	cases := []struct {
		in    string
		tier  Tier
		known bool
	}{
		{"", GPU, true}, {"GPU", GPU, true}, {"CPU", CPU, true},
		{"STORAGE", Disk, true}, {"DISK", Disk, true}, {"NVME-OF", Disk, false},
	}
	for _, c := range cases {
		if tier, known := ParseMedium(c.in); tier != c.tier || known != c.known {
			t.Errorf("ParseMedium(%q) = %v,%v; want %v,%v", c.in, tier, known, c.tier, c.known)
		}
	}
}

func TestParentKeyAndRemap(t *testing.T) {
	ix := New(Options{})
	a := mustAdd(t, ix, "a", 0)
	keys, hashes := chain(1, 3)
	mustStore(t, ix, a, hashes[:2], keys[:2], GPU)
	mustStore(t, ix, a, hashes[2:], keys[2:], CPU)
	if k, ok := ix.ParentKey(a, hashes[1]); !ok || k != keys[1] {
		t.Fatalf("ParentKey GPU = %v,%v", k, ok)
	}
	if k, ok := ix.ParentKey(a, hashes[2]); !ok || k != keys[2] {
		t.Fatalf("ParentKey CPU = %v,%v", k, ok)
	}
	if _, ok := ix.ParentKey(a, 42); ok {
		t.Fatal("ParentKey found an unknown hash")
	}
	// The same engine hash announced with other content replaces the stale mapping.
	other, _ := chain(9, 1)
	mustStore(t, ix, a, hashes[:1], other, GPU)
	if k, _ := ix.ParentKey(a, hashes[0]); k != other[0] {
		t.Fatalf("remapped hash gives %v, want %v", k, other[0])
	}
	if got := ix.Match(keys, nil)[a]; got.Blocks != 0 {
		t.Fatalf("stale key still matched: %+v", got)
	}
	if got := ix.Match(other, nil)[a]; got.Blocks != 1 {
		t.Fatalf("new key not matched: %+v", got)
	}
}

func TestStatsRecency(t *testing.T) {
	now := time.Unix(1000, 0)
	ix := New(Options{Now: func() time.Time { return now }})
	a := mustAdd(t, ix, "a", 3)
	keys, hashes := chain(1, 4)
	mustStore(t, ix, a, hashes, keys, GPU)
	now = now.Add(time.Second)
	mustStore(t, ix, a, hashes[:2], keys[:2], GPU) // refresh
	st, err := ix.Stats(a)
	if err != nil {
		t.Fatal(err)
	}
	if st.Name != "a" || st.DPRank != 3 || st.Gen != 6 || !st.Updated.Equal(now) || st.Blocks[GPU] != 4 {
		t.Fatalf("stats %+v", st)
	}
}

// TestManyGroups registers more replicas than one 63-replica group holds.
func TestManyGroups(t *testing.T) {
	ix := New(Options{})
	keys, hashes := chain(1, 20)
	const n = 140
	for i := range n {
		id := mustAdd(t, ix, "pod", i)
		mustStore(t, ix, id, hashes[:i%21], keys[:i%21], GPU)
	}
	if ix.Slots() != n {
		t.Fatalf("Slots %d, want %d", ix.Slots(), n)
	}
	got := ix.Match(keys, nil)
	for i := range n {
		if want := uint32(i % 21); got[i].Blocks != want || got[i].GPU != want {
			t.Fatalf("replica %d: %+v, want %d", i, got[i], want)
		}
	}
}

func TestExportRestore(t *testing.T) {
	a := New(Options{})
	id, _ := a.AddReplica("e", 0)
	if err := a.Store(id, []uint64{1, 2}, []blockkey.Key{10, 20}, GPU); err != nil {
		t.Fatal(err)
	}
	if err := a.StoreNew(id, []uint64{2}, []blockkey.Key{20}, GPU); err != nil {
		t.Fatal(err)
	}
	if err := a.Store(id, []uint64{3}, []blockkey.Key{30}, CPU); err != nil {
		t.Fatal(err)
	}
	tiers, err := a.Export(id)
	if err != nil {
		t.Fatal(err)
	}
	b := New(Options{})
	bid, _ := b.AddReplica("e", 0)
	_ = b.Store(bid, []uint64{99}, []blockkey.Key{990}, GPU) // replaced by the restore
	if err := b.Restore(bid, tiers); err != nil {
		t.Fatal(err)
	}
	sa, _ := a.Stats(id)
	sb, _ := b.Stats(bid)
	if sa.Blocks != sb.Blocks || sa.Copies != sb.Copies {
		t.Fatalf("restored %+v, exported %+v", sb, sa)
	}
	if m := b.Match([]blockkey.Key{10, 20}, nil); m[bid].Blocks != 2 {
		t.Fatalf("match after restore: %+v", m[bid])
	}
	if m := b.Match([]blockkey.Key{990}, nil); len(m) > int(bid) && m[bid].Blocks != 0 {
		t.Fatal("restore kept a block the snapshot did not hold")
	}
	// One copy removed leaves the block (two copies); the second removes it.
	for range 2 {
		if _, err := b.Remove(bid, []uint64{2}, GPU); err != nil {
			t.Fatal(err)
		}
	}
	if s, _ := b.Stats(bid); s.Blocks[GPU] != 1 {
		t.Fatalf("after removing both copies: %d GPU blocks, want 1", s.Blocks[GPU])
	}
	_ = b.SetLimit(bid, GPU, 1)
	if err := b.Restore(bid, tiers); !errors.Is(err, ErrFull) {
		t.Fatalf("restore over the limit: %v", err)
	}
}

func TestSideExportImport(t *testing.T) {
	now := time.Unix(1000, 0)
	a := NewApproximate(SideOptions{})
	a.Predict(3, []blockkey.Key{1, 2, 3}, now)
	es := a.Export(3, now.Add(time.Second), 0)
	if len(es) != 3 {
		t.Fatalf("exported %d entries, want 3", len(es))
	}
	b := NewApproximate(SideOptions{})
	b.Import(5, es, now.Add(2*time.Second))
	if got := b.Match([]blockkey.Key{1, 2, 3}, now.Add(3*time.Second), 6, nil); got[5] != 3 {
		t.Fatalf("imported match %v", got)
	}
	// The entries keep their expiry: gone after the original TTL.
	if got := b.Match([]blockkey.Key{1}, now.Add(DefaultApproximateTTL+time.Second), 6, nil); got[5] != 0 {
		t.Fatalf("imported entries outlived their expiry: %v", got)
	}
	if got := a.Export(3, now.Add(time.Second), 2); len(got) != 2 {
		t.Fatalf("export bounded at 2 gave %d", len(got))
	}
}
