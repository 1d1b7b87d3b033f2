package index

// The golang-lru SideIndex this package had before the slab one (side.go), kept as the model
// the slab one is checked against (TestSideMatchesTheLRUModel).

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/kvroute/kvroute/router/blockkey"
)

type refSide struct {
	ttl int64
	max int
	// defCap is a replica's capacity until SetCapacity; caps and lrus are per replica.
	defCap int
	caps   map[ReplicaID]int
	lrus   map[ReplicaID]*simplelru.LRU[blockkey.Key, struct{}]
	// dropping is set while the index itself removes a key from an LRU, so the eviction
	// callback (which simplelru also calls on Remove) acts on capacity evictions only.
	dropping bool
	evicted  uint64

	mu   sync.RWMutex
	keys map[blockkey.Key][]refHolder
	// ring of records in insertion order, so in expiry order for one TTL: ring[head] is the
	// oldest of n. It grows by doubling up to max and is never copied after that.
	ring []refRecord
	head int
	n    int
}

type refHolder struct {
	id  ReplicaID
	exp int64 // unix nanoseconds
}

type refRecord struct {
	key blockkey.Key
	exp int64
	id  ReplicaID
}

func newRefSide(o SideOptions, ttl time.Duration, max int) *refSide {
	if o.TTL > 0 {
		ttl = o.TTL
	}
	if o.MaxEntries > 0 {
		max = o.MaxEntries
	}
	c := DefaultCapacityBlocks
	if o.CapacityBlocks > 0 {
		c = o.CapacityBlocks
	}
	return &refSide{ttl: int64(ttl), max: max, defCap: c, caps: map[ReplicaID]int{},
		lrus: map[ReplicaID]*simplelru.LRU[blockkey.Key, struct{}]{}, keys: map[blockkey.Key][]refHolder{}}
}

// SetCapacity sets a replica's KV capacity in blocks (its engine's num_gpu_blocks); blocks <= 0
// goes back to the default. A smaller capacity evicts at once.
func (s *refSide) SetCapacity(id ReplicaID, blocks int) {
	if blocks <= 0 {
		blocks = s.defCap
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.caps[id] = blocks
	if l := s.lrus[id]; l != nil {
		l.Resize(blocks)
	}
}

// Evicted is how many (key, replica) entries were dropped because the replica's capacity was
// full.
func (s *refSide) Evicted() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.evicted
}

// capacity is the replica's capacity in blocks.
func (s *refSide) capacity(id ReplicaID) int {
	if c, ok := s.caps[id]; ok {
		return c
	}
	return s.defCap
}

// lru returns the replica's LRU of keys, made on first use.
func (s *refSide) lru(id ReplicaID) *simplelru.LRU[blockkey.Key, struct{}] {
	if l := s.lrus[id]; l != nil {
		return l
	}
	c := s.capacity(id)
	l, _ := simplelru.NewLRU[blockkey.Key, struct{}](c, func(k blockkey.Key, _ struct{}) {
		if !s.dropping {
			s.evicted++
			s.dropHolder(k, id)
		}
	}) // c > 0: cannot fail
	s.lrus[id] = l
	return l
}

// dropHolder removes id from key k's holders.
func (s *refSide) dropHolder(k blockkey.Key, id ReplicaID) {
	hs := s.keys[k]
	for j := range hs {
		if hs[j].id == id {
			hs[j] = hs[len(hs)-1]
			hs = hs[:len(hs)-1]
			if len(hs) == 0 {
				delete(s.keys, k)
			} else {
				s.keys[k] = hs
			}
			return
		}
	}
}

// untrack takes a key out of the replica's LRU (its holder went by expiry or retraction).
func (s *refSide) untrack(k blockkey.Key, id ReplicaID) {
	if l := s.lrus[id]; l != nil {
		s.dropping = true
		l.Remove(k)
		s.dropping = false
	}
}

// TTL returns how long a decision counts.
func (s *refSide) TTL() time.Duration { return time.Duration(s.ttl) }

// Predict records that the request with these keys was sent to replica id at now: each key
// counts as held by id until now+TTL. A repeated decision refreshes the expiry.
func (s *refSide) Predict(id ReplicaID, keys []blockkey.Key, now time.Time) {
	t := now.UnixNano()
	exp := t + s.ttl
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(t)
	// Tail first, so the request's head is the most recently used, as in the engine.
	l := s.lru(id)
	for j := len(keys) - 1; j >= 0; j-- {
		l.Add(keys[j], struct{}{})
	}
	// Only a request longer than the replica's capacity evicts its own keys.
	longer := len(keys) > s.capacity(id)
	for _, k := range keys {
		if longer && !l.Contains(k) {
			continue // evicted by this very request
		}
		hs := s.keys[k]
		found := false
		for j := range hs {
			if hs[j].id == id {
				hs[j].exp = exp
				found = true
				break
			}
		}
		if !found {
			s.keys[k] = append(hs, refHolder{id: id, exp: exp})
		}
		s.push(refRecord{key: k, exp: exp, id: id})
	}
}

// push appends a record, dropping the oldest when the ring is full at max.
func (s *refSide) push(r refRecord) {
	if s.n == len(s.ring) {
		if len(s.ring) < s.max {
			grown := make([]refRecord, min(max(2*len(s.ring), 64), s.max))
			for i := range s.n {
				grown[i] = s.ring[(s.head+i)%len(s.ring)]
			}
			s.ring, s.head = grown, 0
		} else {
			s.pop()
		}
	}
	s.ring[(s.head+s.n)%len(s.ring)] = r
	s.n++
}

// Expire drops every entry expired at now (Predict also does it as it goes).
func (s *refSide) Expire(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(now.UnixNano())
}

func (s *refSide) expire(t int64) {
	for s.n > 0 && s.ring[s.head].exp <= t {
		s.pop()
	}
}

// pop drops the oldest record, and its holder unless a later decision refreshed it.
func (s *refSide) pop() {
	r := s.ring[s.head]
	s.head = (s.head + 1) % len(s.ring)
	s.n--
	hs := s.keys[r.key]
	for j := range hs {
		if hs[j].id == r.id {
			if hs[j].exp == r.exp {
				s.dropHolder(r.key, r.id)
				s.untrack(r.key, r.id)
			}
			return
		}
	}
}

// Unpredict takes back the decision Predict recorded for id and keys at now (the attempt
// failed): each key's holder is dropped unless a later decision refreshed it.
func (s *refSide) Unpredict(id ReplicaID, keys []blockkey.Key, now time.Time) {
	exp := now.UnixNano() + s.ttl
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		hs := s.keys[k]
		for j := range hs {
			if hs[j].id == id {
				if hs[j].exp == exp {
					s.dropHolder(k, id)
					s.untrack(k, id)
				}
				break
			}
		}
	}
	// The ring's records of the decision find no holder with their expiry when popped.
}

// DropReplica drops every entry of a replica that left the fleet (load.Ledger.Remove). Named
// apart from score.Forgetter.Forget, which drops a policy's per-replica state.
func (s *refSide) DropReplica(id ReplicaID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.lrus, id)
	delete(s.caps, id)
	for k, hs := range s.keys {
		kept := hs[:0]
		for _, h := range hs {
			if h.id != id {
				kept = append(kept, h)
			}
		}
		if len(kept) == 0 {
			delete(s.keys, k)
		} else {
			s.keys[k] = kept
		}
	}
	// Records of id left in the ring find no holder when popped.
}

// Len returns the number of (key, replica) entries held, expired ones not yet dropped included.
func (s *refSide) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, hs := range s.keys {
		n += len(hs)
	}
	return n
}

// Match returns, indexed by ReplicaID, the number of leading keys each replica holds unexpired
// at now. out has length slots (use Index.Slots()) and is reused when its capacity allows; a
// holder with an id at or above slots is ignored. The scan stops at the first key no replica
// continues.
func (s *refSide) Match(keys []blockkey.Key, now time.Time, slots int, out []uint32) []uint32 {
	if cap(out) < slots {
		out = make([]uint32, slots)
	} else {
		out = out[:slots]
		clear(out)
	}
	t := now.UnixNano()
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i, k := range keys {
		continued := false
		for _, h := range s.keys[k] {
			if int(h.id) < slots && h.exp > t && out[h.id] == uint32(i) {
				out[h.id]++
				continued = true
			}
		}
		if !continued {
			break
		}
	}
	return out
}

// Export returns replica id's unexpired entries at now, at most max (0: no bound), newest
// expiry first dropped last: when max cuts, the entries that expire soonest are left out.
func (s *refSide) Export(id ReplicaID, now time.Time, max int) []SideEntry {
	t := now.UnixNano()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []SideEntry
	// The ring is in expiry order; walking it from the newest end keeps the freshest under max.
	seen := map[blockkey.Key]bool{}
	for i := s.n - 1; i >= 0; i-- {
		r := s.ring[(s.head+i)%len(s.ring)]
		if r.id != id || r.exp <= t || seen[r.key] {
			continue
		}
		for _, h := range s.keys[r.key] {
			if h.id == id && h.exp == r.exp {
				out = append(out, SideEntry{Key: r.key, Exp: r.exp})
				seen[r.key] = true
				break
			}
		}
		if max > 0 && len(out) >= max {
			break
		}
	}
	return out
}

// Import records a peer's entries for replica id with their own expiries (entries already
// expired at now are skipped; an expiry is never set further than the TTL from now, so a peer's
// clock ahead of this one cannot keep an entry longer than a decision made here would live).
func (s *refSide) Import(id ReplicaID, entries []SideEntry, now time.Time) {
	t := now.UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(t)
	l := s.lru(id)
	// Oldest first, so the ring stays in expiry order as far as the peer's clock allows, and the
	// freshest entries are the replica's most recently used (the first out when it is full are
	// the oldest, as Predict leaves them).
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		exp := min(e.Exp, t+s.ttl)
		if exp <= t {
			continue
		}
		l.Add(e.Key, struct{}{})
		hs := s.keys[e.Key]
		found := false
		for j := range hs {
			if hs[j].id == id {
				hs[j].exp = max(hs[j].exp, exp)
				exp = hs[j].exp
				found = true
				break
			}
		}
		if !found {
			s.keys[e.Key] = append(hs, refHolder{id: id, exp: exp})
		}
		s.push(refRecord{key: e.Key, exp: exp, id: id})
	}
}

// TestSideMatchesTheLRUModel runs random decisions, take-backs, expiries, capacity changes,
// drops and imports through the slab SideIndex and the golang-lru one it replaced, and checks
// after every step that both answer every Match, Len, Evicted and Export alike. Replicas 70 and
// 71 are past the Match bit mask. The ring is not filled here (TestSideFullRingMatchesTheLRUModel
// fills it, without small capacities): with a full ring the model can drop a holder from its
// replica's LRU while its decision is being recorded and then add it back outside the LRU, so
// that entry escapes the capacity; the slab index refreshes every holder before it pushes a
// record and keeps each holder in its LRU, so the two then count evictions differently.
func TestSideMatchesTheLRUModel(t *testing.T) {
	sideModelRun(t, 1<<20, true)
}

// TestSideFullRingMatchesTheLRUModel is TestSideMatchesTheLRUModel with the ring full most of
// the time (MaxEntries 60 to 300, so records are dropped before they expire), every replica's
// capacity larger than all the keys (so the model's entries outside their LRU, above, evict
// nothing) and no SetCapacity: the ring's records, kept as keys with their expiry and replica
// once per run, drop the same holders at the same steps as the model's one record per block.
func TestSideFullRingMatchesTheLRUModel(t *testing.T) {
	sideModelRun(t, 0, false)
}

// sideModelRun checks the slab SideIndex against the model through random steps: ring is the
// MaxEntries (0: random, small), capacities whether replicas have small capacities that
// SetCapacity changes.
func sideModelRun(t *testing.T, ring int, capacities bool) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 22))
		ttl := 5 * time.Second
		max, capBlocks := ring, 1+rng.IntN(40)
		if max == 0 {
			max = 60 + rng.IntN(240)
		}
		if !capacities {
			capBlocks = 1 << 20
		}
		got := newSide(SideOptions{TTL: ttl, CapacityBlocks: capBlocks}, ttl, max)
		want := newRefSide(SideOptions{TTL: ttl, CapacityBlocks: got.defCap}, ttl, max)
		docs := make([][]blockkey.Key, 6)
		for d := range docs {
			docs[d] = make([]blockkey.Key, 30)
			for i := range docs[d] {
				docs[d][i] = blockkey.Key(1000*(d%4) + i) // docs d and d+4 share every key: prefixes overlap
				if d >= 4 && i >= 10 {
					docs[d][i] += 500
				}
			}
		}
		ids := []ReplicaID{0, 1, 2, 3, 70, 71}
		type decision struct {
			id   ReplicaID
			keys []blockkey.Key
			at   time.Time
		}
		var past []decision
		now := time.Unix(1000, 0)
		for step := range 400 {
			now = now.Add(time.Duration(1 + rng.Int64N(int64(time.Second))))
			id := ids[rng.IntN(len(ids))]
			op := rng.IntN(20)
			switch {
			case op < 12:
				d := docs[rng.IntN(len(docs))]
				keys := d[:1+rng.IntN(len(d))]
				got.Predict(id, keys, now)
				want.Predict(id, keys, now)
				past = append(past, decision{id, keys, now})
			case op < 14 && len(past) > 0:
				p := past[rng.IntN(len(past))]
				got.Unpredict(p.id, p.keys, p.at)
				want.Unpredict(p.id, p.keys, p.at)
			case op < 15 && capacities:
				c := []int{0, 3, 8, 20}[rng.IntN(4)]
				got.SetCapacity(id, c)
				want.SetCapacity(id, c)
			case op < 16:
				got.DropReplica(id)
				want.DropReplica(id)
			case op < 17:
				from := ids[rng.IntN(len(ids))]
				es := want.Export(from, now, rng.IntN(10))
				got.Import(id, es, now)
				want.Import(id, es, now)
			default:
				later := now.Add(time.Duration(rng.Int64N(int64(3 * time.Second))))
				got.Expire(later)
				want.Expire(later)
			}
			for _, slots := range []int{72, 3} {
				for d := range docs {
					g, w := got.Match(docs[d], now, slots, nil), want.Match(docs[d], now, slots, nil)
					if !slices.Equal(g, w) {
						t.Fatalf("seed %d step %d: Match(doc %d, slots %d) = %v, the model %v", seed, step, d, slots, g, w)
					}
				}
			}
			if g, w := got.Len(), want.Len(); g != w {
				t.Fatalf("seed %d step %d: Len %d, the model %d", seed, step, g, w)
			}
			if g, w := got.Evicted(), want.Evicted(); g != w {
				t.Fatalf("seed %d step %d: Evicted %d, the model %d", seed, step, g, w)
			}
			for _, id := range ids {
				if g, w := got.Export(id, now, 0), want.Export(id, now, 0); !slices.Equal(g, w) {
					t.Fatalf("seed %d step %d: Export(%d) = %v, the model %v", seed, step, id, g, w)
				}
			}
		}
	}
}
