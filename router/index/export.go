package index

import (
	"fmt"

	"github.com/kvroute/kvroute/router/blockkey"
)

// Entry is one block a replica holds on a tier, as a peer snapshot carries it: the engine hash,
// its router key, and the physical copies beyond the first (StoreNew duplicates).
type Entry struct {
	Hash  uint64
	Key   blockkey.Key
	Extra uint32
}

// Export returns everything the replica holds, per tier, in no particular order. The caller
// takes it where no event can be applied meanwhile (the stream's worker), so it matches one
// sequence number.
func (ix *Index) Export(id ReplicaID) ([NumTiers][]Entry, error) {
	var out [NumTiers][]Entry
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	r, err := ix.rep(id)
	if err != nil {
		return out, err
	}
	for t := range Tier(NumTiers) {
		if len(r.hashes[t]) == 0 {
			continue
		}
		es := make([]Entry, 0, len(r.hashes[t]))
		for h, k := range r.hashes[t] {
			es = append(es, Entry{Hash: h, Key: k, Extra: r.extra[t][h]})
		}
		out[t] = es
	}
	return out, nil
}

// Restore replaces everything the replica holds with tiers (a peer's Export). An engine hash
// listed twice on a tier keeps its last entry. Past the replica's SetLimit it restores nothing
// and returns ErrFull: a snapshot bigger than the engine can hold does not describe it.
func (ix *Index) Restore(id ReplicaID, tiers [NumTiers][]Entry) error {
	now := ix.now()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r, err := ix.rep(id)
	if err != nil {
		return err
	}
	for t := range Tier(NumTiers) {
		if lim := r.limit[t]; lim > 0 && len(tiers[t]) > lim {
			return fmt.Errorf("%w: snapshot has %d blocks on %s, limit %d", ErrFull, len(tiers[t]), t, lim)
		}
	}
	ix.clear(id, r)
	g := ix.groups[int(id)/groupSize]
	bit := slotBit(id)
	for t := range Tier(NumTiers) {
		if len(tiers[t]) == 0 {
			continue
		}
		m := r.hashes[t]
		if m == nil {
			m = make(map[uint64]blockkey.Key, len(tiers[t]))
			r.hashes[t] = m
		}
		for _, e := range tiers[t] {
			if old, ok := m[e.Hash]; ok {
				g.clear(old, bit, t)
			}
			m[e.Hash] = e.Key
			g.set(e.Key, bit, t)
			if e.Extra > 0 {
				if r.extra[t] == nil {
					r.extra[t] = map[uint64]uint32{}
				}
				r.extra[t][e.Hash] = e.Extra
			} else {
				delete(r.extra[t], e.Hash)
			}
		}
	}
	r.gen += uint64(len(tiers[GPU]) + len(tiers[CPU]) + len(tiers[Disk]))
	r.updated = now
	return nil
}
