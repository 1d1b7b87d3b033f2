package index

import (
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/kvroute/kvroute/router/blockkey"
)

// SideOptions configure a SideIndex.
type SideOptions struct {
	// TTL is how long a recorded decision counts; zero takes the constructor's default.
	TTL time.Duration
	// MaxEntries caps the records kept (one per block per decision); the oldest go first.
	// Zero takes the constructor's default.
	MaxEntries int
	// CapacityBlocks bounds the blocks one replica holds here until SetCapacity gives its own
	// (the engine's num_gpu_blocks); zero takes DefaultCapacityBlocks.
	CapacityBlocks int
}

// Defaults: the predicted index bridges the gap between a decision and the engine's first
// BlockStored (event lag is tens of milliseconds; a long prefill delays it by seconds), the
// approximate one stands in for a missing stream and lives as long as a block plausibly stays
// cached on a busy engine.
const (
	DefaultPredictedTTL        = 5 * time.Second
	DefaultPredictedMaxEntries = 1 << 20
	DefaultApproximateTTL      = 120 * time.Second
	DefaultApproximateMax      = 4 << 20
	// DefaultCapacityBlocks is a replica's block capacity when its engine's is not known (the
	// exact index's per-replica limit for the same case, router/kvevents).
	DefaultCapacityBlocks = 1 << 20
)

// SideIndex holds router decisions, not engine truth: key -> replicas it was sent to, each with
// an expiry. Entries expire after the TTL and the oldest are dropped beyond MaxEntries. Each
// replica's keys are also kept the way its engine keeps blocks: least recently used first out
// once the replica holds its KV capacity in blocks, a request's tail before its head (vLLM frees
// a finished request's blocks tail first, so they are evicted first; vllm/v1/core/
// kv_cache_manager.py free, block_pool.py), so a guess never outlives what the engine can hold.
// It is the machinery of both the predicted side index and the approximate index. Safe for
// concurrent use.
type SideIndex struct {
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
	keys map[blockkey.Key][]sideHolder
	// ring of records in insertion order, so in expiry order for one TTL: ring[head] is the
	// oldest of n. It grows by doubling up to max and is never copied after that.
	ring []sideRecord
	head int
	n    int
}

type sideHolder struct {
	id  ReplicaID
	exp int64 // unix nanoseconds
}

type sideRecord struct {
	key blockkey.Key
	exp int64
	id  ReplicaID
}

// NewPredicted returns the short-TTL side index for decisions not yet confirmed by events.
func NewPredicted(o SideOptions) *SideIndex {
	return newSide(o, DefaultPredictedTTL, DefaultPredictedMaxEntries)
}

// NewApproximate returns the long-TTL decision-learned index for replicas without a healthy
// event stream.
func NewApproximate(o SideOptions) *SideIndex {
	return newSide(o, DefaultApproximateTTL, DefaultApproximateMax)
}

func newSide(o SideOptions, ttl time.Duration, max int) *SideIndex {
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
	return &SideIndex{ttl: int64(ttl), max: max, defCap: c, caps: map[ReplicaID]int{},
		lrus: map[ReplicaID]*simplelru.LRU[blockkey.Key, struct{}]{}, keys: map[blockkey.Key][]sideHolder{}}
}

// SetCapacity sets a replica's KV capacity in blocks (its engine's num_gpu_blocks); blocks <= 0
// goes back to the default. A smaller capacity evicts at once.
func (s *SideIndex) SetCapacity(id ReplicaID, blocks int) {
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
func (s *SideIndex) Evicted() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.evicted
}

// capacity is the replica's capacity in blocks.
func (s *SideIndex) capacity(id ReplicaID) int {
	if c, ok := s.caps[id]; ok {
		return c
	}
	return s.defCap
}

// lru returns the replica's LRU of keys, made on first use.
func (s *SideIndex) lru(id ReplicaID) *simplelru.LRU[blockkey.Key, struct{}] {
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
func (s *SideIndex) dropHolder(k blockkey.Key, id ReplicaID) {
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
func (s *SideIndex) untrack(k blockkey.Key, id ReplicaID) {
	if l := s.lrus[id]; l != nil {
		s.dropping = true
		l.Remove(k)
		s.dropping = false
	}
}

// TTL returns how long a decision counts.
func (s *SideIndex) TTL() time.Duration { return time.Duration(s.ttl) }

// Predict records that the request with these keys was sent to replica id at now: each key
// counts as held by id until now+TTL. A repeated decision refreshes the expiry.
func (s *SideIndex) Predict(id ReplicaID, keys []blockkey.Key, now time.Time) {
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
			s.keys[k] = append(hs, sideHolder{id: id, exp: exp})
		}
		s.push(sideRecord{key: k, exp: exp, id: id})
	}
}

// push appends a record, dropping the oldest when the ring is full at max.
func (s *SideIndex) push(r sideRecord) {
	if s.n == len(s.ring) {
		if len(s.ring) < s.max {
			grown := make([]sideRecord, min(max(2*len(s.ring), 64), s.max))
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
func (s *SideIndex) Expire(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(now.UnixNano())
}

func (s *SideIndex) expire(t int64) {
	for s.n > 0 && s.ring[s.head].exp <= t {
		s.pop()
	}
}

// pop drops the oldest record, and its holder unless a later decision refreshed it.
func (s *SideIndex) pop() {
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
func (s *SideIndex) Unpredict(id ReplicaID, keys []blockkey.Key, now time.Time) {
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
func (s *SideIndex) DropReplica(id ReplicaID) {
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
func (s *SideIndex) Len() int {
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
func (s *SideIndex) Match(keys []blockkey.Key, now time.Time, slots int, out []uint32) []uint32 {
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

// SideEntry is one unexpired decision of a SideIndex for one replica: a key and when it expires
// (unix nanoseconds), as a peer snapshot carries the approximate index.
type SideEntry struct {
	Key blockkey.Key
	Exp int64
}

// Export returns replica id's unexpired entries at now, at most max (0: no bound), newest
// expiry first dropped last: when max cuts, the entries that expire soonest are left out.
func (s *SideIndex) Export(id ReplicaID, now time.Time, max int) []SideEntry {
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
func (s *SideIndex) Import(id ReplicaID, entries []SideEntry, now time.Time) {
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
			s.keys[e.Key] = append(hs, sideHolder{id: id, exp: exp})
		}
		s.push(sideRecord{key: e.Key, exp: exp, id: id})
	}
}
