package index

import (
	"testing"
	"time"
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
	if s.Len() != 0 || len(s.keys) != 0 {
		t.Fatalf("Len %d, keys %d after all expired", s.Len(), len(s.keys))
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
