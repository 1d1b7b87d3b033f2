package index

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
)

func TestSideTTLExpiry(t *testing.T) {
	s := NewPredicted(SideOptions{TTL: 2 * time.Second})
	if s.TTL() != 2*time.Second {
		t.Fatalf("TTL %v", s.TTL())
	}
	t0 := time.Unix(5000, 0)
	keys, _ := chain(1, 6)
	s.Predict(1, keys[:4], t0)
	got := s.Match(keys, t0.Add(500*time.Millisecond), 3, nil)
	if got[0] != 0 || got[1] != 4 || got[2] != 0 {
		t.Fatalf("before 2's decision: %v", got)
	}
	s.Predict(2, keys[:2], t0.Add(time.Second))
	got = s.Match(keys, t0.Add(1500*time.Millisecond), 3, got)
	if got[1] != 4 || got[2] != 2 {
		t.Fatalf("both live: %v", got)
	}
	// At t0+2s replica 1's entries expire (exp is exclusive), replica 2's live on.
	got = s.Match(keys, t0.Add(2*time.Second), 3, got)
	if got[1] != 0 || got[2] != 2 {
		t.Fatalf("after 1 expired: %v", got)
	}
	// Expired entries are dropped from memory, not only hidden.
	s.Expire(t0.Add(2 * time.Second))
	if s.Len() != 2 {
		t.Fatalf("Len %d after expiry, want 2", s.Len())
	}
	s.Expire(t0.Add(time.Hour))
	if s.Len() != 0 || s.keys.n != 0 {
		t.Fatalf("Len %d, keys %d after all expired", s.Len(), s.keys.n)
	}
}

func TestSideRefreshKeepsEntry(t *testing.T) {
	s := NewApproximate(SideOptions{TTL: 10 * time.Second})
	t0 := time.Unix(5000, 0)
	keys, _ := chain(1, 3)
	s.Predict(0, keys, t0)
	s.Predict(0, keys[:1], t0.Add(8*time.Second)) // refresh block 0 only
	s.Expire(t0.Add(11 * time.Second))            // the first decision's records pop
	if s.Len() != 1 {
		t.Fatalf("Len %d, want the refreshed entry only", s.Len())
	}
	if got := s.Match(keys, t0.Add(11*time.Second), 1, nil); got[0] != 1 {
		t.Fatalf("refreshed prefix %v, want 1", got)
	}
}

func TestSideCapAndPrefix(t *testing.T) {
	s := NewPredicted(SideOptions{TTL: time.Minute, MaxEntries: 5})
	t0 := time.Unix(5000, 0)
	keys, _ := chain(1, 4)
	s.Predict(0, keys, t0)
	s.Predict(1, keys[:3], t0.Add(time.Millisecond)) // 7 records: the oldest two of 0 go
	if s.Len() != 5 {
		t.Fatalf("Len %d, want the cap 5", s.Len())
	}
	got := s.Match(keys, t0.Add(time.Second), 2, nil)
	// Replica 0 lost blocks 0 and 1, so its prefix is empty even though 2 and 3 remain.
	if got[0] != 0 || got[1] != 3 {
		t.Fatalf("after cap: %v", got)
	}
	// Holders at or above slots are ignored, and a short out slice is replaced.
	if got := s.Match(keys, t0.Add(time.Second), 1, make([]uint32, 0)); len(got) != 1 || got[0] != 0 {
		t.Fatalf("slots=1: %v", got)
	}
}

func TestSideForget(t *testing.T) {
	s := NewPredicted(SideOptions{})
	if s.TTL() != DefaultPredictedTTL {
		t.Fatalf("default TTL %v", s.TTL())
	}
	t0 := time.Unix(5000, 0)
	keys, _ := chain(1, 3)
	s.Predict(0, keys, t0)
	s.Predict(1, keys, t0)
	s.DropReplica(0)
	got := s.Match(keys, t0, 2, nil)
	if got[0] != 0 || got[1] != 3 {
		t.Fatalf("after Forget(0): %v", got)
	}
	// Popping the forgotten replica's records later is harmless.
	s.Expire(t0.Add(time.Hour))
	if s.Len() != 0 {
		t.Fatalf("Len %d", s.Len())
	}
}

// TestSideQueueBounded checks that the record ring stays within the cap when
// decisions keep refreshing the same keys.
func TestSideQueueBounded(t *testing.T) {
	s := NewPredicted(SideOptions{TTL: time.Second, MaxEntries: 1000})
	t0 := time.Unix(5000, 0)
	keys, _ := chain(1, 10)
	for i := range 100_000 {
		s.Predict(ReplicaID(i%3), keys, t0.Add(time.Duration(i)*time.Millisecond))
	}
	if s.n > 1000 || len(s.ring) > 1000 {
		t.Fatalf("%d records in a ring of %d, cap 1000", s.n, len(s.ring))
	}
	if s.Len() != 30 {
		t.Fatalf("Len %d, want 30", s.Len())
	}
}

// Unpredict takes back one decision and leaves a later one of the same replica alone.
func TestSideUnpredict(t *testing.T) {
	s := NewPredicted(SideOptions{})
	t0 := time.Unix(5000, 0)
	keys, _ := chain(1, 6)
	s.Predict(1, keys[:4], t0)
	s.Predict(2, keys[:4], t0)
	s.Unpredict(1, keys[:4], t0)
	if got := s.Match(keys, t0, 3, nil); got[1] != 0 || got[2] != 4 {
		t.Fatalf("after the take-back: %v", got)
	}
	s.Predict(1, keys[:4], t0)
	s.Predict(1, keys[:4], t0.Add(time.Second)) // a later decision refreshed it
	s.Unpredict(1, keys[:4], t0)
	if got := s.Match(keys, t0.Add(time.Second), 3, nil); got[1] != 4 {
		t.Fatalf("a refreshed entry was taken back: %v", got)
	}
	s.Expire(t0.Add(time.Hour))
	if s.Len() != 0 {
		t.Fatalf("Len %d after expiry", s.Len())
	}
}

// A replica's keys leave the way its engine's blocks do: once it holds its capacity, least
// recently used first, a request's tail before its head.
func TestSideIndexEvictsAtTheReplicaCapacity(t *testing.T) {
	s := NewApproximate(SideOptions{})
	s.SetCapacity(0, 10)
	now := time.Unix(1000, 0)
	a, b := ks(1, 2, 3, 4, 5, 6, 7, 8), ks(101, 102, 103, 104, 105, 106, 107, 108)
	s.Predict(0, a, now)
	s.Predict(1, a, now) // another replica, default capacity: untouched
	s.Predict(0, b, now)
	got := s.Match(a, now, 2, nil)
	if got[0] != 2 || got[1] != 8 {
		t.Errorf("after 16 blocks into 10: a's match = %v, want its head (2) on replica 0 and all 8 on replica 1", got)
	}
	if got := s.Match(b, now, 2, nil); got[0] != 8 {
		t.Errorf("b's match on replica 0 = %d, want 8", got[0])
	}
	if e := s.Evicted(); e != 6 {
		t.Errorf("evicted %d entries, want 6", e)
	}
	// Using a's head again makes it the most recent: the next request evicts b's tail instead.
	s.Predict(0, a[:2], now)
	s.Predict(0, ks(201, 202), now)
	if got := s.Match(a, now, 1, nil); got[0] != 2 {
		t.Errorf("a's head after reuse: %d, want 2", got[0])
	}
	if got := s.Match(b, now, 1, nil); got[0] != 6 {
		t.Errorf("b after two more blocks: %d, want 6 (its tail went)", got[0])
	}
	// Shrinking the capacity evicts at once; expiry and Unpredict keep the LRU in step.
	s.SetCapacity(0, 4)
	if n := s.Len(); n != 4+8 {
		t.Errorf("entries after shrinking replica 0 to 4: %d, want 4 + replica 1's 8", n)
	}
	s.Expire(now.Add(DefaultApproximateTTL))
	if n := s.Len(); n != 0 {
		t.Errorf("entries after the TTL: %d", n)
	}
	s.Predict(0, ks(301, 302, 303, 304), now)
	if got := s.Match(ks(301, 302, 303, 304), now, 1, nil); got[0] != 4 {
		t.Errorf("after expiry freed the LRU, a new request of 4 = capacity: match %d, want 4", got[0])
	}
}

// A retracted decision frees its room in the replica's capacity (no phantom blocks are left to
// evict real guesses later), and a replica that left starts over empty.
func TestSideIndexCapacityFollowsUnpredictAndDrop(t *testing.T) {
	s := NewPredicted(SideOptions{})
	s.SetCapacity(0, 4)
	now := time.Unix(1000, 0)
	a, b := ks(1, 2, 3, 4), ks(11, 12, 13, 14)
	s.Predict(0, a, now)
	s.Unpredict(0, a, now)
	s.Predict(0, b, now)
	if e := s.Evicted(); e != 0 {
		t.Errorf("evicted %d after a retracted decision and one of capacity size, want 0", e)
	}
	if got := s.Match(b, now, 1, nil); got[0] != 4 {
		t.Errorf("b's match %d, want 4", got[0])
	}
	s.DropReplica(0)
	s.Predict(0, a, now)
	if e := s.Evicted(); e != 0 {
		t.Errorf("evicted %d after the replica was dropped, want 0 (its LRU starts empty)", e)
	}
	if got := s.Match(a, now, 1, nil); got[0] != 4 {
		t.Errorf("a's match after the drop: %d, want 4", got[0])
	}
}

// A peer's snapshot loads no more than the replica holds: the freshest entries stay.
func TestSideImportBoundedByCapacity(t *testing.T) {
	now := time.Unix(1000, 0)
	src := NewApproximate(SideOptions{})
	for i := range 6 {
		src.Predict(0, ks(uint64(i+1)), now.Add(time.Duration(i)*time.Second))
	}
	es := src.Export(0, now.Add(6*time.Second), 0) // freshest first: 6, 5, ..., 1
	dst := NewApproximate(SideOptions{CapacityBlocks: 3})
	dst.Import(0, es, now.Add(6*time.Second))
	if n, e := dst.Len(), dst.Evicted(); n != 3 || e != 3 {
		t.Fatalf("imported %d entries, %d evicted; want 3 and 3", n, e)
	}
	for i := uint64(1); i <= 6; i++ {
		got := dst.Match(ks(i), now.Add(6*time.Second), 1, nil)[0]
		if want := uint32(0); i > 3 {
			want = 1
			if got != want {
				t.Errorf("key %d: match %d, want %d (the freshest three stay)", i, got, want)
			}
		} else if got != want {
			t.Errorf("key %d: match %d, want %d (the oldest went)", i, got, want)
		}
	}
}

func ks(ids ...uint64) []blockkey.Key {
	out := make([]blockkey.Key, len(ids))
	for i, id := range ids {
		out[i] = blockkey.Key(id)
	}
	return out
}
