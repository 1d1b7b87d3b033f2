package policies

import (
	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/score"
)

// approxIndex is the decision-learned index that approximate peers keep: per replica, the block
// keys of the requests routed there, in an LRU of bounded size (or unbounded when capacity is 0).
// It never sees engine events, which is the point of those peers.
type approxIndex struct {
	capacity int
	lrus     map[string]*simplelru.LRU[uint64, struct{}]
	sets     map[string]map[uint64]struct{} // capacity 0: no eviction
}

func newApproxIndex(capacity int) *approxIndex {
	return &approxIndex{capacity: capacity,
		lrus: map[string]*simplelru.LRU[uint64, struct{}]{},
		sets: map[string]map[uint64]struct{}{}}
}

// match is the number of leading keys the replica holds.
func (x *approxIndex) match(id string, keys []uint64) int {
	if x.capacity <= 0 {
		s := x.sets[id]
		n := 0
		for n < len(keys) {
			if _, ok := s[keys[n]]; !ok {
				break
			}
			n++
		}
		return n
	}
	l := x.lrus[id]
	if l == nil {
		return 0
	}
	n := 0
	for n < len(keys) && l.Contains(keys[n]) {
		n++
	}
	return n
}

// insert records that the replica now holds keys (refreshing their recency).
func (x *approxIndex) insert(id string, keys []uint64) {
	if x.capacity <= 0 {
		s := x.sets[id]
		if s == nil {
			s = map[uint64]struct{}{}
			x.sets[id] = s
		}
		for _, k := range keys {
			s[k] = struct{}{}
		}
		return
	}
	l := x.lrus[id]
	if l == nil {
		l, _ = simplelru.NewLRU[uint64, struct{}](x.capacity, nil) // capacity > 0 here: cannot fail
		x.lrus[id] = l
	}
	for _, k := range keys {
		l.Add(k, struct{}{})
	}
}

// forget drops a replica's keys (it left the fleet).
func (x *approxIndex) forget(id string) {
	if x == nil {
		return
	}
	delete(x.lrus, id)
	delete(x.sets, id)
}

// size is the number of keys held for the replica.
func (x *approxIndex) size(id string) int {
	if x.capacity <= 0 {
		return len(x.sets[id])
	}
	if l := x.lrus[id]; l != nil {
		return l.Len()
	}
	return 0
}

// coarseKeys re-expresses a prompt's chained keys of blockSize tokens in blocks of unit tokens,
// the granularity an approximate peer hashes at. Keys are chained, so the key ending a coarse
// block identifies it. It returns the coarse keys, how many coarse blocks each key stands for,
// and the prompt's length in coarse blocks (a partial last block counts).
func coarseKeys(r *score.Request, unit int) (keys []uint64, per int, total int) {
	b := r.BlockSize
	if b <= 0 {
		b = unit
	}
	tokens := r.Tokens
	if tokens < len(r.Keys)*b {
		tokens = len(r.Keys) * b
	}
	total = (tokens + unit - 1) / unit
	if b >= unit {
		keys = make([]uint64, len(r.Keys))
		for i, k := range r.Keys {
			keys[i] = uint64(k)
		}
		return keys, b / unit, total
	}
	step := unit / b
	for i := step - 1; i < len(r.Keys); i += step {
		keys = append(keys, uint64(r.Keys[i]))
	}
	return keys, 1, total
}

// keysOf converts router keys for the maps above.
func keysOf(ks []blockkey.Key) []uint64 {
	out := make([]uint64, len(ks))
	for i, k := range ks {
		out[i] = uint64(k)
	}
	return out
}
