package index

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
)

// ReplicaID is the dense id of one replica stream (engine, DP rank) in an Index.
type ReplicaID uint16

// MaxReplicas is the most replicas one Index registers at a time.
const MaxReplicas = 1 << 16

// groupSize replicas share one key map; bit 63 of the mask is offFlag.
const groupSize = 63

const offFlag = uint64(1) << 63

var (
	// ErrUnknownReplica is returned for a ReplicaID that is not (or no longer) registered.
	ErrUnknownReplica = errors.New("index: unknown replica")
	// ErrBadTier is returned for a Tier outside GPU, CPU, Disk.
	ErrBadTier = errors.New("index: bad tier")
	// ErrLengthMismatch is returned when a Store gets different numbers of hashes and keys.
	ErrLengthMismatch = errors.New("index: engine hashes and keys differ in length")
	// ErrTooManyReplicas is returned by AddReplica when MaxReplicas are registered.
	ErrTooManyReplicas = errors.New("index: too many replicas")
	// ErrFull is returned when a store goes past the replica's SetLimit.
	ErrFull = errors.New("index: replica over its block limit")
)

// Options configure an Index.
type Options struct {
	// Now is the clock for ReplicaStats.Updated; time.Now when nil.
	Now func() time.Time
}

// Index is the exact index built from engine events. Safe for concurrent use.
type Index struct {
	mu     sync.RWMutex
	now    func() time.Time
	groups []*group
	reps   []*replica // by ReplicaID; nil when free
	byName map[streamName]ReplicaID
	free   []ReplicaID
	// epochs numbers each replica's lifetime (registration, or a Clear): a session home
	// recorded under another epoch is stale.
	epochs uint64
	// sessions: which replica last stored blocks for a session (session.go).
	sessions sessionHomes
}

type streamName struct {
	name string
	rank int
}

// group is the key map for up to 63 replicas.
type group struct {
	// keys: router key -> replicas holding it on any tier, bit 63 = has an off entry.
	keys map[blockkey.Key]uint64
	// off: per-tier masks of the keys flagged in keys; absent for GPU-only keys.
	off map[blockkey.Key][NumTiers]uint64
	// live: registered slots.
	live uint64
}

type replica struct {
	name string
	rank int
	// hashes: per tier, engine hash -> router key.
	hashes [NumTiers]map[uint64]blockkey.Key
	// extra: per tier, physical copies beyond the first (StoreNew duplicates); usually empty.
	extra   [NumTiers]map[uint64]uint32
	gen     uint64
	updated time.Time
	// limit: per tier, the most distinct blocks held (0: no limit); see SetLimit.
	limit [NumTiers]int
	// epoch: this lifetime of the slot (Index.epochs when registered or last cleared).
	epoch uint64
}

// New returns an empty Index.
func New(opts Options) *Index {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Index{now: now, byName: map[streamName]ReplicaID{}}
}

// AddReplica registers the stream (name, dpRank) and returns its id; a stream already
// registered keeps its id.
func (ix *Index) AddReplica(name string, dpRank int) (ReplicaID, error) {
	if dpRank < 0 {
		return 0, fmt.Errorf("index: negative DP rank %d for %q", dpRank, name)
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	sn := streamName{name, dpRank}
	if id, ok := ix.byName[sn]; ok {
		return id, nil
	}
	var id ReplicaID
	switch {
	case len(ix.free) > 0:
		id = ix.free[len(ix.free)-1]
		ix.free = ix.free[:len(ix.free)-1]
	case len(ix.reps) < MaxReplicas:
		id = ReplicaID(len(ix.reps))
		ix.reps = append(ix.reps, nil)
	default:
		return 0, ErrTooManyReplicas
	}
	ix.reps[id] = newReplica(name, dpRank)
	ix.epochs++
	ix.reps[id].epoch = ix.epochs
	ix.byName[sn] = id
	g := ix.groupFor(id)
	g.live |= slotBit(id)
	return id, nil
}

func newReplica(name string, rank int) *replica {
	r := &replica{name: name, rank: rank}
	r.hashes[GPU] = map[uint64]blockkey.Key{}
	return r
}

// Replica returns the id of a registered stream.
func (ix *Index) Replica(name string, dpRank int) (ReplicaID, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	id, ok := ix.byName[streamName{name, dpRank}]
	return id, ok
}

// RemoveReplica drops a replica and everything it holds; its id may be handed out again.
func (ix *Index) RemoveReplica(id ReplicaID) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r, err := ix.rep(id)
	if err != nil {
		return err
	}
	ix.clear(id, r)
	ix.groups[int(id)/groupSize].live &^= slotBit(id)
	delete(ix.byName, streamName{r.name, r.rank})
	ix.reps[id] = nil
	ix.free = append(ix.free, id)
	return nil
}

// Slots is one more than the highest ReplicaID in use: the length Match results get.
func (ix *Index) Slots() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return len(ix.reps)
}

func slotBit(id ReplicaID) uint64 { return 1 << (uint(id) % groupSize) }

func (ix *Index) groupFor(id ReplicaID) *group {
	gi := int(id) / groupSize
	for len(ix.groups) <= gi {
		ix.groups = append(ix.groups, &group{
			keys: map[blockkey.Key]uint64{},
			off:  map[blockkey.Key][NumTiers]uint64{},
		})
	}
	return ix.groups[gi]
}

func (ix *Index) rep(id ReplicaID) (*replica, error) {
	if int(id) >= len(ix.reps) || ix.reps[id] == nil {
		return nil, fmt.Errorf("%w: %d", ErrUnknownReplica, id)
	}
	return ix.reps[id], nil
}

// Store records blocks announced with parent == nil: each is present on the replica's tier;
// one already present is left as it is and not counted again (the index keeps no per-block
// time), so a full-mode
// re-announcement can never keep an evicted block alive. keys[i] is the router key of
// engineHashes[i].
func (ix *Index) Store(id ReplicaID, engineHashes []uint64, keys []blockkey.Key, t Tier) error {
	_, err := ix.store(id, engineHashes, keys, t, false)
	return err
}

// StoreHeld is Store, also reporting how many of the blocks the replica already held (left as
// they are): under kv_cache_report_mode "full" these are the engine's re-announced prefix hits,
// so their count shows whether the engines honour the mode.
func (ix *Index) StoreHeld(id ReplicaID, engineHashes []uint64, keys []blockkey.Key, t Tier) (held int, err error) {
	return ix.store(id, engineHashes, keys, t, false)
}

// StoreNew records newly cached physical blocks (a BlockStored with a parent): a hash already
// present counts one more physical copy, which a later BlockRemoved takes away.
func (ix *Index) StoreNew(id ReplicaID, engineHashes []uint64, keys []blockkey.Key, t Tier) error {
	_, err := ix.store(id, engineHashes, keys, t, true)
	return err
}

// StoreCopies is StoreNew for a stream where every BlockStored is a physical copy, parent or
// not (vLLM's contract: each copy of a hash gets its own BlockStored and BlockRemoved, and
// freeing emits nothing; tests/v1/core/test_kv_events_contract.py). It reports how many of the
// blocks were already held, each now one more copy. Only for streams that never carry
// kv_cache_report_mode "full", whose re-announcements look the same and would never be removed.
func (ix *Index) StoreCopies(id ReplicaID, engineHashes []uint64, keys []blockkey.Key, t Tier) (dups int, err error) {
	return ix.store(id, engineHashes, keys, t, true)
}

func (ix *Index) store(id ReplicaID, hashes []uint64, keys []blockkey.Key, t Tier, copies bool) (held int, err error) {
	if len(hashes) != len(keys) {
		return 0, fmt.Errorf("%w: %d hashes, %d keys", ErrLengthMismatch, len(hashes), len(keys))
	}
	if !t.valid() {
		return 0, fmt.Errorf("%w: %d", ErrBadTier, t)
	}
	now := ix.now()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r, err := ix.rep(id)
	if err != nil {
		return 0, err
	}
	g := ix.groups[int(id)/groupSize]
	bit := slotBit(id)
	m := r.hashes[t]
	if m == nil {
		m = make(map[uint64]blockkey.Key, len(hashes))
		r.hashes[t] = m
	}
	refused := 0
	for i, h := range hashes {
		k := keys[i]
		old, ok := m[h]
		switch {
		case !ok && r.limit[t] > 0 && len(m) >= r.limit[t]:
			refused++
		case !ok:
			m[h] = k
			g.set(k, bit, t)
		case old == k && copies:
			if r.extra[t] == nil {
				r.extra[t] = map[uint64]uint32{}
			}
			r.extra[t][h]++
			held++
		case old == k:
			held++
		default:
			// The engine hash now names other content (an engine restart the ingester did not
			// report, or a 64-bit collision): the old mapping is stale, forget it.
			delete(r.extra[t], h)
			g.clear(old, bit, t)
			m[h] = k
			g.set(k, bit, t)
		}
	}
	r.gen += uint64(len(hashes))
	r.updated = now
	if refused > 0 {
		return held, fmt.Errorf("%w: %d of %d blocks refused on %s", ErrFull, refused, len(hashes), t)
	}
	return held, nil
}

// SetLimit bounds how many distinct blocks the replica may hold on tier t (0: no bound). A
// Store or StoreNew past it records what fits and returns ErrFull: the index then no longer
// mirrors the engine, which the caller handles (the event stream clears the replica). An engine
// cannot hold more distinct blocks than it has, so the bound is its block count with slack;
// what it stops is a publisher sending more than that.
func (ix *Index) SetLimit(id ReplicaID, t Tier, n int) error {
	if !t.valid() {
		return fmt.Errorf("%w: %d", ErrBadTier, t)
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r, err := ix.rep(id)
	if err != nil {
		return err
	}
	r.limit[t] = max(n, 0)
	return nil
}

// Remove takes one physical copy of each block away from the replica's tier (BlockRemoved).
// It returns how many hashes the replica did not hold on that tier; those are ignored.
func (ix *Index) Remove(id ReplicaID, engineHashes []uint64, t Tier) (unknown int, err error) {
	if !t.valid() {
		return 0, fmt.Errorf("%w: %d", ErrBadTier, t)
	}
	now := ix.now()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r, err := ix.rep(id)
	if err != nil {
		return 0, err
	}
	g := ix.groups[int(id)/groupSize]
	bit := slotBit(id)
	m := r.hashes[t]
	for _, h := range engineHashes {
		k, ok := m[h]
		if !ok {
			unknown++
			continue
		}
		if n := r.extra[t][h]; n > 0 {
			if n == 1 {
				delete(r.extra[t], h)
			} else {
				r.extra[t][h] = n - 1
			}
			continue
		}
		delete(m, h)
		g.clear(k, bit, t)
	}
	r.updated = now
	return unknown, nil
}

// ClearTier drops what the replica holds on one tier. vLLM's AllBlocksCleared comes from the GPU
// block pool and clears GPU residency only: offloaded copies stay (docs/features/kv_events.md).
func (ix *Index) ClearTier(id ReplicaID, t Tier) error {
	if !t.valid() {
		return fmt.Errorf("%w: %d", ErrBadTier, t)
	}
	now := ix.now()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r, err := ix.rep(id)
	if err != nil {
		return err
	}
	g := ix.groups[int(id)/groupSize]
	bit := slotBit(id)
	for _, k := range r.hashes[t] {
		g.clear(k, bit, t)
	}
	r.hashes[t], r.extra[t] = nil, nil
	if t == GPU {
		r.hashes[GPU] = map[uint64]blockkey.Key{}
	}
	r.updated = now
	return nil
}

// Clear drops everything the replica holds (a stream found inexact, or restarted).
func (ix *Index) Clear(id ReplicaID) error {
	now := ix.now()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r, err := ix.rep(id)
	if err != nil {
		return err
	}
	ix.clear(id, r)
	r.updated = now
	// The engine's cache is gone (a restart, or a stream that can no longer be trusted), and
	// with it what its sessions stored there.
	ix.epochs++
	r.epoch = ix.epochs
	return nil
}

func (ix *Index) clear(id ReplicaID, r *replica) {
	g := ix.groups[int(id)/groupSize]
	bit := slotBit(id)
	for t := range Tier(NumTiers) {
		for _, k := range r.hashes[t] {
			g.clear(k, bit, t)
		}
		r.hashes[t] = nil
		r.extra[t] = nil
	}
	r.hashes[GPU] = map[uint64]blockkey.Key{}
}

// ParentKey returns the router key the replica holds under an engine hash, looking at GPU,
// then CPU, then Disk.
func (ix *Index) ParentKey(id ReplicaID, engineHash uint64) (blockkey.Key, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	r, err := ix.rep(id)
	if err != nil {
		return 0, false
	}
	for t := range Tier(NumTiers) {
		if k, ok := r.hashes[t][engineHash]; ok {
			return k, true
		}
	}
	return 0, false
}

// ReplicaStats is what the index knows about one replica.
type ReplicaStats struct {
	Name   string
	DPRank int
	// Blocks per tier: distinct engine hashes held.
	Blocks [NumTiers]int
	// Copies per tier: physical copies counted (Blocks plus StoreNew duplicates).
	Copies [NumTiers]int
	// Gen is a logical clock: blocks stored or refreshed on this replica so far.
	Gen uint64
	// Updated is when the last event was applied (zero if none).
	Updated time.Time
}

// Stats returns one replica's counters.
func (ix *Index) Stats(id ReplicaID) (ReplicaStats, error) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	r, err := ix.rep(id)
	if err != nil {
		return ReplicaStats{}, err
	}
	s := ReplicaStats{Name: r.name, DPRank: r.rank, Gen: r.gen, Updated: r.updated}
	for t := range NumTiers {
		s.Blocks[t] = len(r.hashes[t])
		s.Copies[t] = len(r.hashes[t])
		for _, n := range r.extra[t] {
			s.Copies[t] += int(n)
		}
	}
	return s, nil
}

// Keys returns how many distinct router keys the index holds (any replica, any tier).
func (ix *Index) Keys() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	n := 0
	for _, g := range ix.groups {
		n += len(g.keys)
	}
	return n
}

// set marks key as held by the slot bit on tier t.
func (g *group) set(k blockkey.Key, bit uint64, t Tier) {
	m := g.keys[k]
	if t == GPU && m&offFlag == 0 {
		g.keys[k] = m | bit
		return
	}
	o, ok := g.off[k]
	if !ok {
		o[GPU] = m // a GPU-only key until now
	}
	o[t] |= bit
	g.off[k] = o
	g.keys[k] = o[GPU] | o[CPU] | o[Disk] | offFlag
}

// clear drops the slot bit for key on tier t.
func (g *group) clear(k blockkey.Key, bit uint64, t Tier) {
	m, ok := g.keys[k]
	if !ok {
		return
	}
	if m&offFlag == 0 {
		if t != GPU {
			return
		}
		if m &^= bit; m == 0 {
			delete(g.keys, k)
		} else {
			g.keys[k] = m
		}
		return
	}
	o := g.off[k]
	o[t] &^= bit
	if o[CPU]|o[Disk] == 0 {
		delete(g.off, k)
		if o[GPU] == 0 {
			delete(g.keys, k)
		} else {
			g.keys[k] = o[GPU]
		}
		return
	}
	g.off[k] = o
	g.keys[k] = o[GPU] | o[CPU] | o[Disk] | offFlag
}
