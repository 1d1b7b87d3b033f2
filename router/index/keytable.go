package index

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/router/blockkey"
)

// keyTable maps block keys to non-zero values, for the lookups a decision makes once per
// block (SideIndex.Match). Keys are already XXH3 hashes, so a key is placed by one
// multiplication with the table's random odd seed (which keeps crafted prompts from piling
// their keys on one run) instead of being hashed again as a Go map does, and a lookup inlines.
//
// The table is a directory of parts (extendible hashing): the top bits of the placed key pick a
// part; a part is open addressing with linear probing, at most 3/4 full, deletion by backward
// shift (no tombstones). A part grows by doubling up to keyPartMax entries and then splits in
// two, so an insert moves at most one part's keys, under the owner's write lock, where a single
// table would move all of them, inside one decision. A zero value marks an
// empty entry.
// The zero table is empty and ready. Reads may share it; writes need the owner's lock.
type keyTable[V ~uint32 | ~uint64] struct {
	dir []*keyPart[V]
	// dshift is 64 - log2(len(dir)): a placed key h is in dir[h>>dshift].
	dshift uint
	seed   uint64
	n      int // keys held
}

// keyPart is the keys whose placed value starts with the same depth bits.
type keyPart[V ~uint32 | ~uint64] struct {
	ents []keyEnt[V]
	// A placed key h starts its probe at (h<<depth)>>shift; shift is 64 - log2(len(ents)).
	depth, shift uint
	n            int
}

type keyEnt[V ~uint32 | ~uint64] struct {
	key blockkey.Key
	val V
}

// keyPartMax is the most entries a part has (16 bytes each: 128 KiB).
const keyPartMax = 1 << 13

// get returns k's value, 0 when k is not there.
func (t *keyTable[V]) get(k blockkey.Key) V {
	if len(t.dir) == 0 {
		return 0
	}
	h := uint64(k) * t.seed
	p := t.dir[h>>t.dshift]
	m := len(p.ents) - 1
	for i := int((h << p.depth) >> p.shift); ; i = (i + 1) & m {
		if e := &p.ents[i]; e.key == k || e.val == 0 {
			return e.val
		}
	}
}

// home is where k's probe starts in part p.
func (t *keyTable[V]) home(p *keyPart[V], k blockkey.Key) int {
	return int(((uint64(k) * t.seed) << p.depth) >> p.shift)
}

func (t *keyTable[V]) part(k blockkey.Key) *keyPart[V] {
	return t.dir[(uint64(k)*t.seed)>>t.dshift]
}

// put sets k's value; v must not be 0.
func (t *keyTable[V]) put(k blockkey.Key, v V) {
	if v == 0 {
		panic("index: keyTable.put of 0")
	}
	if len(t.dir) == 0 {
		t.seed = rand.Uint64() | 1
		t.dir, t.dshift = []*keyPart[V]{newKeyPart[V](0, 64)}, 64
	}
	p := t.part(k)
	for 4*(p.n+1) > 3*len(p.ents) {
		if len(p.ents) < keyPartMax {
			t.grow(p)
		} else {
			t.split(p)
		}
		p = t.part(k)
	}
	m := len(p.ents) - 1
	for i := t.home(p, k); ; i = (i + 1) & m {
		e := &p.ents[i]
		if e.val == 0 {
			*e = keyEnt[V]{k, v}
			p.n++
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
	if len(t.dir) == 0 {
		return
	}
	p := t.part(k)
	m := len(p.ents) - 1
	i := t.home(p, k)
	for ; p.ents[i].key != k || p.ents[i].val == 0; i = (i + 1) & m {
		if p.ents[i].val == 0 {
			return
		}
	}
	// Backward shift: each later entry of the run that may sit at i (its home is not in
	// (i, j], going round) moves there, so every key stays reachable from its home.
	for j := (i + 1) & m; p.ents[j].val != 0; j = (j + 1) & m {
		h := t.home(p, p.ents[j].key)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			p.ents[i] = p.ents[j]
			i = j
		}
	}
	p.ents[i] = keyEnt[V]{}
	p.n--
	t.n--
}

func newKeyPart[V ~uint32 | ~uint64](depth uint, size int) *keyPart[V] {
	shift := uint(64)
	for n := size; n > 1; n >>= 1 {
		shift--
	}
	return &keyPart[V]{ents: make([]keyEnt[V], size), depth: depth, shift: shift}
}

// insert places an entry known to be absent in part p, which has room.
func (t *keyTable[V]) insert(p *keyPart[V], e keyEnt[V]) {
	m := len(p.ents) - 1
	i := t.home(p, e.key)
	for p.ents[i].val != 0 {
		i = (i + 1) & m
	}
	p.ents[i] = e
	p.n++
}

// grow doubles part p and places its keys again.
func (t *keyTable[V]) grow(p *keyPart[V]) {
	old := p.ents
	*p = *newKeyPart[V](p.depth, 2*len(old))
	for _, e := range old {
		if e.val != 0 {
			t.insert(p, e)
		}
	}
}

// split replaces part p (full at keyPartMax) by two of the same size, one for each value of
// the placed keys' next bit, doubling the directory when p is the only part of its entries.
func (t *keyTable[V]) split(p *keyPart[V]) {
	if p.depth == 64-t.dshift {
		dir := make([]*keyPart[V], 2*len(t.dir))
		for i, q := range t.dir {
			dir[2*i], dir[2*i+1] = q, q
		}
		t.dir = dir
		t.dshift--
	}
	lo, hi := newKeyPart[V](p.depth+1, len(p.ents)), newKeyPart[V](p.depth+1, len(p.ents))
	for _, e := range p.ents {
		if e.val == 0 {
			continue
		}
		if ((uint64(e.key)*t.seed)<<p.depth)>>63 == 0 {
			t.insert(lo, e)
		} else {
			t.insert(hi, e)
		}
	}
	// p's directory entries are a run of 2^(global-p.depth); its first half goes to lo.
	for i, q := range t.dir {
		if q == p {
			if (uint64(i)<<(t.dshift+p.depth))>>63 == 0 {
				t.dir[i] = lo
			} else {
				t.dir[i] = hi
			}
		}
	}
}
