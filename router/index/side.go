package index

import (
	"math/bits"
	"slices"
	"sync"
	"time"

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
//
// Layout (for decision time: BenchmarkDecision in router/app): one map from key to a slot; the slot holds the
// key's holders (replica, expiry, LRU node) and, for Match, a bit mask of its holders below
// replica 64 and their earliest expiry, so a block costs Match one lookup and no walk over its
// holders while none has expired. Each replica's LRU is a doubly linked list threaded through
// one slab of nodes by index: recording a block costs one key lookup (golang-lru's map and
// list, one per replica, cost three). The expiry ring keeps a block's key per record and the
// expiry and replica once per run of records that share them (a decision's blocks are one run):
// 8 bytes a record. Slots, nodes and the rings are reused through free lists, so a steady state
// allocates nothing.
type SideIndex struct {
	ttl int64
	max int
	// defCap is a replica's capacity until SetCapacity.
	defCap int

	mu sync.RWMutex
	// keys: key -> its slot in slots, plus one (keyTable keeps no zero value).
	keys      keyTable[uint32]
	slots     []sideSlot
	freeSlots []int32
	// nodes: every (key, replica) entry's place in its replica's LRU; freeNode heads the free
	// list (linked through next), -1 when empty. live counts the nodes in use: Len.
	nodes    []sideNode
	freeNode int32
	live     int
	// reps: per replica (by ReplicaID), its LRU and capacity.
	reps    []sideRep
	evicted uint64
	// ring of records (key, expiry, replica) in insertion order, so in expiry order for one
	// TTL: ring[head] is the key of the oldest of n. It grows by doubling up to max and is never
	// copied after that. runs holds the records' expiries and replicas, one per run of
	// consecutive records that share both: runs[rhead] is the oldest of rn, its n counting the
	// records of the run still in the ring.
	ring  []blockkey.Key
	head  int
	n     int
	runs  []sideRun
	rhead int
	rn    int
}

// sideSlot is one key's holders. mask has bit id for each holder with id < maskIDs, high counts
// the others; minExp is the earliest expiry among all of them (valid when hs is not empty). The
// holders below maskIDs come first, in id order, so the mask gives a holder's position without
// a walk over the others (a key of a shared prefix has a holder on every replica).
type sideSlot struct {
	key    blockkey.Key
	mask   uint64
	minExp int64
	hs     []sideHolder
	high   int32
}

// maskIDs is how many replica ids a slot's mask covers.
const maskIDs = 64

type sideHolder struct {
	exp  int64 // unix nanoseconds
	node int32
	id   ReplicaID
}

// sideNode is one entry in its replica's LRU (prev towards the most recent, next towards the
// least; -1 ends).
type sideNode struct {
	slot       int32
	prev, next int32
	id         ReplicaID
}

// sideRep is one replica's LRU: head is the most recently used node, tail the least.
type sideRep struct {
	head, tail int32
	n          int
	// cap is the capacity SetCapacity gave (0: defCap).
	cap int
}

// sideRun is the expiry and replica of n consecutive records of the ring.
type sideRun struct {
	exp int64
	n   int32
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
	return &SideIndex{ttl: int64(ttl), max: max, defCap: c, freeNode: -1}
}

// SetCapacity sets a replica's KV capacity in blocks (its engine's num_gpu_blocks); blocks <= 0
// goes back to the default. A smaller capacity evicts at once.
func (s *SideIndex) SetCapacity(id ReplicaID, blocks int) {
	if blocks <= 0 {
		blocks = s.defCap
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rep(id)
	r.cap = blocks
	for r.n > blocks {
		s.evictTail(id)
	}
}

// Evicted is how many (key, replica) entries were dropped because the replica's capacity was
// full.
func (s *SideIndex) Evicted() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.evicted
}

// rep returns the replica's LRU, made (empty) on first use.
func (s *SideIndex) rep(id ReplicaID) *sideRep {
	for int(id) >= len(s.reps) {
		s.reps = append(s.reps, sideRep{head: -1, tail: -1})
	}
	return &s.reps[id]
}

// capacity is the replica's capacity in blocks.
func (s *SideIndex) capacity(r *sideRep) int {
	if r.cap > 0 {
		return r.cap
	}
	return s.defCap
}

// slotFor returns the key's slot, made when the key has none.
func (s *SideIndex) slotFor(k blockkey.Key) int32 {
	if v := s.keys.get(k); v != 0 {
		return int32(v - 1)
	}
	var si int32
	if n := len(s.freeSlots); n > 0 {
		si = s.freeSlots[n-1]
		s.freeSlots = s.freeSlots[:n-1]
	} else {
		si = int32(len(s.slots))
		s.slots = append(s.slots, sideSlot{})
	}
	sl := &s.slots[si]
	sl.key, sl.mask, sl.high, sl.hs = k, 0, 0, sl.hs[:0]
	s.keys.put(k, uint32(si)+1)
	return si
}

// slotOfKey is the key's slot, if it has one.
func (s *SideIndex) slotOfKey(k blockkey.Key) (int32, bool) {
	v := s.keys.get(k)
	return int32(v - 1), v != 0
}

// holder is the position of id among the slot's holders, -1 when it is not one.
func (sl *sideSlot) holder(id ReplicaID) int {
	if id < maskIDs {
		if sl.mask&(1<<id) == 0 {
			return -1
		}
		return bits.OnesCount64(sl.mask & (1<<id - 1))
	}
	for j := bits.OnesCount64(sl.mask); j < len(sl.hs); j++ {
		if sl.hs[j].id == id {
			return j
		}
	}
	return -1
}

func (sl *sideSlot) resetMin() {
	if len(sl.hs) == 0 {
		return
	}
	m := sl.hs[0].exp
	for _, h := range sl.hs[1:] {
		m = min(m, h.exp)
	}
	sl.minExp = m
}

// setExp sets holder j's expiry, keeping minExp.
func (sl *sideSlot) setExp(j int, exp int64) {
	old := sl.hs[j].exp
	sl.hs[j].exp = exp
	switch {
	case exp < sl.minExp:
		sl.minExp = exp
	case old == sl.minExp && exp != old:
		sl.resetMin()
	}
}

// addHolder makes a new node for id at the front of its LRU and a holder in slot si.
func (s *SideIndex) addHolder(si int32, id ReplicaID, exp int64) {
	var ni int32
	if s.freeNode >= 0 {
		ni = s.freeNode
		s.freeNode = s.nodes[ni].next
	} else {
		ni = int32(len(s.nodes))
		s.nodes = append(s.nodes, sideNode{})
	}
	s.nodes[ni] = sideNode{slot: si, prev: -1, next: -1, id: id}
	s.pushFront(id, ni)
	s.live++
	sl := &s.slots[si]
	if len(sl.hs) == 0 || exp < sl.minExp {
		sl.minExp = exp
	}
	h := sideHolder{exp: exp, node: ni, id: id}
	if id < maskIDs {
		sl.hs = slices.Insert(sl.hs, bits.OnesCount64(sl.mask&(1<<id-1)), h)
		sl.mask |= 1 << id
	} else {
		sl.hs = append(sl.hs, h)
		sl.high++
	}
}

// dropHolder removes holder j of slot si, its LRU node, and the slot when it was the last.
func (s *SideIndex) dropHolder(si int32, j int) {
	sl := &s.slots[si]
	h := sl.hs[j]
	s.unlink(h.id, h.node)
	s.nodes[h.node] = sideNode{next: s.freeNode}
	s.freeNode = h.node
	s.live--
	sl.hs = slices.Delete(sl.hs, j, j+1)
	if h.id < maskIDs {
		sl.mask &^= 1 << h.id
	} else {
		sl.high--
	}
	if len(sl.hs) == 0 {
		s.keys.del(sl.key)
		s.freeSlots = append(s.freeSlots, si)
		return
	}
	if h.exp == sl.minExp {
		sl.resetMin()
	}
}

// pushFront makes node ni the most recently used of id's LRU.
func (s *SideIndex) pushFront(id ReplicaID, ni int32) {
	r := &s.reps[id]
	nd := &s.nodes[ni]
	nd.prev, nd.next = -1, r.head
	if r.head >= 0 {
		s.nodes[r.head].prev = ni
	} else {
		r.tail = ni
	}
	r.head = ni
	r.n++
}

// unlink takes node ni out of id's LRU.
func (s *SideIndex) unlink(id ReplicaID, ni int32) {
	r := &s.reps[id]
	nd := &s.nodes[ni]
	if nd.prev >= 0 {
		s.nodes[nd.prev].next = nd.next
	} else {
		r.head = nd.next
	}
	if nd.next >= 0 {
		s.nodes[nd.next].prev = nd.prev
	} else {
		r.tail = nd.prev
	}
	nd.prev, nd.next = -1, -1
	r.n--
}

// evictTail drops id's least recently used entry (its capacity is full).
func (s *SideIndex) evictTail(id ReplicaID) {
	ni := s.reps[id].tail
	si := s.nodes[ni].slot
	s.evicted++
	s.dropHolder(si, s.slots[si].holder(id))
}

// touch makes key slot si held by id until exp and its entry id's most recently used,
// evicting id's least recently used entry when that goes past its capacity.
func (s *SideIndex) touch(si int32, id ReplicaID, exp int64) {
	sl := &s.slots[si]
	if j := sl.holder(id); j >= 0 {
		ni := sl.hs[j].node
		sl.setExp(j, exp)
		if s.reps[id].head != ni {
			s.unlink(id, ni)
			s.pushFront(id, ni)
		}
		return
	}
	s.addHolder(si, id, exp)
	if r := &s.reps[id]; r.n > s.capacity(r) {
		s.evictTail(id)
	}
}

// TTL returns how long a decision counts.
func (s *SideIndex) TTL() time.Duration { return time.Duration(s.ttl) }

// Predict records that the request with these keys was sent to replica id at now: each key
// counts as held by id until now+TTL. A repeated decision refreshes the expiry. Callers pass
// times that do not go back (the ledger stamps its records under its lock): a call at an older
// time sets a key's expiry back to that time's.
func (s *SideIndex) Predict(id ReplicaID, keys []blockkey.Key, now time.Time) {
	t := now.UnixNano()
	exp := t + s.ttl
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(t)
	r := s.rep(id)
	// Tail first, so the request's head is the most recently used, as in the engine. Only a
	// request longer than the replica's capacity evicts its own keys (its tail).
	longer := len(keys) > s.capacity(r)
	for j := len(keys) - 1; j >= 0; j-- {
		s.touch(s.slotFor(keys[j]), id, exp)
	}
	for _, k := range keys {
		if longer {
			if si, ok := s.slotOfKey(k); !ok || s.slots[si].holder(id) < 0 {
				continue // evicted by this very request
			}
		}
		s.push(k, exp, id)
	}
}

// push appends the record (k, exp, id), dropping the oldest when the ring is full at max.
func (s *SideIndex) push(k blockkey.Key, exp int64, id ReplicaID) {
	if s.n == len(s.ring) {
		if len(s.ring) < s.max {
			grown := make([]blockkey.Key, min(max(2*len(s.ring), 64), s.max))
			for i := range s.n {
				grown[i] = s.ring[s.at(i)]
			}
			s.ring, s.head = grown, 0
		} else {
			s.pop()
		}
	}
	s.ring[s.at(s.n)] = k
	s.n++
	if s.rn > 0 {
		if last := &s.runs[s.runAt(s.rn-1)]; last.exp == exp && last.id == id {
			last.n++
			return
		}
	}
	if s.rn == len(s.runs) { // at most one run per record: never more than max
		grown := make([]sideRun, min(max(2*len(s.runs), 16), s.max))
		for i := range s.rn {
			grown[i] = s.runs[s.runAt(i)]
		}
		s.runs, s.rhead = grown, 0
	}
	s.runs[s.runAt(s.rn)] = sideRun{exp: exp, n: 1, id: id}
	s.rn++
}

// at is the ring position of the i-th oldest record (i < len(ring)); no division, which cost a
// tenth of Predict.
func (s *SideIndex) at(i int) int {
	j := s.head + i
	if j >= len(s.ring) {
		j -= len(s.ring)
	}
	return j
}

// runAt is the runs position of the i-th oldest run (i < len(runs)).
func (s *SideIndex) runAt(i int) int {
	j := s.rhead + i
	if j >= len(s.runs) {
		j -= len(s.runs)
	}
	return j
}

// Expire drops every entry expired at now (Predict also does it as it goes).
func (s *SideIndex) Expire(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(now.UnixNano())
}

func (s *SideIndex) expire(t int64) {
	for s.n > 0 && s.runs[s.rhead].exp <= t {
		s.pop()
	}
}

// pop drops the oldest record, and its holder unless a later decision refreshed it.
func (s *SideIndex) pop() {
	k := s.ring[s.head]
	s.head = s.at(1)
	s.n--
	r := &s.runs[s.rhead]
	exp, id := r.exp, r.id
	if r.n--; r.n == 0 {
		s.rhead = s.runAt(1)
		s.rn--
	}
	si, ok := s.slotOfKey(k)
	if !ok {
		return
	}
	if j := s.slots[si].holder(id); j >= 0 && s.slots[si].hs[j].exp == exp {
		s.dropHolder(si, j)
	}
}

// Unpredict takes back the decision Predict recorded for id and keys at now (the attempt
// failed): each key's holder is dropped unless a later decision refreshed it.
func (s *SideIndex) Unpredict(id ReplicaID, keys []blockkey.Key, now time.Time) {
	exp := now.UnixNano() + s.ttl
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		si, ok := s.slotOfKey(k)
		if !ok {
			continue
		}
		if j := s.slots[si].holder(id); j >= 0 && s.slots[si].hs[j].exp == exp {
			s.dropHolder(si, j)
		}
	}
	// The ring's records of the decision find no holder with their expiry when popped.
}

// DropReplica drops every entry of a replica that left the fleet (load.Ledger.Remove). Named
// apart from score.Forgetter.Forget, which drops a policy's per-replica state.
func (s *SideIndex) DropReplica(id ReplicaID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int(id) >= len(s.reps) {
		return
	}
	for s.reps[id].head >= 0 {
		ni := s.reps[id].head
		si := s.nodes[ni].slot
		s.dropHolder(si, s.slots[si].holder(id))
	}
	s.reps[id] = sideRep{head: -1, tail: -1}
	// Records of id left in the ring find no holder when popped.
}

// Len returns the number of (key, replica) entries held, expired ones not yet dropped included.
func (s *SideIndex) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.live
}

// Match returns, indexed by ReplicaID, the number of leading keys each replica holds unexpired
// at now. out has length slots (use Index.Slots()) and is reused when its capacity allows; a
// holder with an id at or above slots is ignored. The scan stops at the first key no replica
// continues. Replicas below 64 are followed as one bit mask: a key none of whose holders has
// expired costs one lookup.
func (s *SideIndex) Match(keys []blockkey.Key, now time.Time, slots int, out []uint32) []uint32 {
	if cap(out) < slots {
		out = make([]uint32, slots)
	} else {
		out = out[:slots]
		clear(out)
	}
	t := now.UnixNano()
	// alive: replicas below maskIDs whose prefix still runs.
	alive := ^uint64(0)
	if slots < maskIDs {
		alive = 1<<slots - 1
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	i := 0
	for ; i < len(keys); i++ {
		v := s.keys.get(keys[i])
		if v == 0 {
			break
		}
		si := v - 1
		sl := &s.slots[si]
		held := sl.mask
		high := false // a replica at or above maskIDs continued
		if sl.minExp <= t || sl.high > 0 {
			held = 0
			for _, h := range sl.hs {
				switch {
				case h.exp <= t || int(h.id) >= slots:
				case h.id < maskIDs:
					held |= 1 << h.id
				case out[h.id] == uint32(i):
					out[h.id]++
					high = true
				}
			}
		}
		for d := alive &^ held; d != 0; d &= d - 1 {
			out[bits.TrailingZeros64(d)] = uint32(i)
		}
		alive &= held
		if alive == 0 && !high {
			break
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		out[bits.TrailingZeros64(alive)] = uint32(i)
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
	ri, left := s.rn, int32(0) // the run of record i, and its records not yet walked
	for i := s.n - 1; i >= 0; i-- {
		for left == 0 {
			ri--
			left = s.runs[s.runAt(ri)].n
		}
		left--
		r := &s.runs[s.runAt(ri)]
		k := s.ring[s.at(i)]
		if r.id != id || r.exp <= t || seen[k] {
			continue
		}
		if si, ok := s.slotOfKey(k); ok {
			if j := s.slots[si].holder(id); j >= 0 && s.slots[si].hs[j].exp == r.exp {
				out = append(out, SideEntry{Key: k, Exp: r.exp})
				seen[k] = true
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
	s.rep(id)
	// Oldest first, so the ring stays in expiry order as far as the peer's clock allows, and the
	// freshest entries are the replica's most recently used (the first out when it is full are
	// the oldest, as Predict leaves them).
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		exp := min(e.Exp, t+s.ttl)
		if exp <= t {
			continue
		}
		si := s.slotFor(e.Key)
		if j := s.slots[si].holder(id); j >= 0 {
			exp = max(s.slots[si].hs[j].exp, exp)
		}
		s.touch(si, id, exp)
		s.push(e.Key, exp, id)
	}
}
