package index

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/router/blockkey"
)

// keyTable maps block keys to non-zero values, for the lookups a decision makes once per
// block (SideIndex.Match). Keys are already XXH3 hashes, so a key is placed by one
// multiplication with the table's random odd seed (which keeps crafted prompts from piling
// their keys on one run) instead of being hashed again as a Go map does, and a lookup inlines:
// open addressing, linear probing, at most 3/4 full, deletion by backward shift (no
// tombstones). A zero value marks an empty entry. The zero table is empty and ready. Reads may
// share it; writes need the owner's lock.
type keyTable[V ~uint32 | ~uint64] struct {
	ents  []keyEnt[V]
	shift uint // 64 - log2(len(ents))
	seed  uint64
	n     int // keys held
}

type keyEnt[V ~uint32 | ~uint64] struct {
	key blockkey.Key
	val V
}

// get returns k's value, 0 when k is not there.
func (t *keyTable[V]) get(k blockkey.Key) V {
	if len(t.ents) == 0 {
		return 0
	}
	m := len(t.ents) - 1
	for i := int((uint64(k) * t.seed) >> t.shift); ; i = (i + 1) & m {
		if e := &t.ents[i]; e.key == k || e.val == 0 {
			return e.val
		}
	}
}

func (t *keyTable[V]) home(k blockkey.Key) int { return int((uint64(k) * t.seed) >> t.shift) }

// put sets k's value; v must not be 0.
func (t *keyTable[V]) put(k blockkey.Key, v V) {
	if v == 0 {
		panic("index: keyTable.put of 0")
	}
	if 4*(t.n+1) > 3*len(t.ents) {
		t.grow()
	}
	m := len(t.ents) - 1
	for i := t.home(k); ; i = (i + 1) & m {
		e := &t.ents[i]
		if e.val == 0 {
			*e = keyEnt[V]{k, v}
			t.n++
			return
		}
		if e.key == k {
			e.val = v
			return
		}
	}
}

// del removes k (nothing when k is not there).
func (t *keyTable[V]) del(k blockkey.Key) {
	if len(t.ents) == 0 {
		return
	}
	m := len(t.ents) - 1
	i := t.home(k)
	for ; t.ents[i].key != k || t.ents[i].val == 0; i = (i + 1) & m {
		if t.ents[i].val == 0 {
			return
		}
	}
	// Backward shift: each later entry of the run that may sit at i (its home is not in
	// (i, j], going round) moves there, so every key stays reachable from its home.
	for j := (i + 1) & m; t.ents[j].val != 0; j = (j + 1) & m {
		h := t.home(t.ents[j].key)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.ents[i] = t.ents[j]
			i = j
		}
	}
	t.ents[i] = keyEnt[V]{}
	t.n--
}

// grow doubles the table (the first has 64 entries) and places every key again.
func (t *keyTable[V]) grow() {
	if t.seed == 0 {
		t.seed = rand.Uint64() | 1
	}
	old := t.ents
	size := max(2*len(old), 64)
	t.ents = make([]keyEnt[V], size)
	t.shift = 64
	for n := size; n > 1; n >>= 1 {
		t.shift--
	}
	m := size - 1
	for _, e := range old {
		if e.val == 0 {
			continue
		}
		i := t.home(e.key)
		for t.ents[i].val != 0 {
			i = (i + 1) & m
		}
		t.ents[i] = e
	}
}
