package index

import (
	"math/bits"

	"github.com/kvroute/kvroute/router/blockkey"
)

// Match is one replica's longest consecutive prefix of a request's blocks.
type Match struct {
	// Blocks: leading blocks held on any tier.
	Blocks uint32
	// GPU: leading blocks held on GPU (at most Blocks).
	GPU uint32
	// CPU and Disk: of the Blocks, how many the replica holds only off GPU, on CPU or only on
	// disk. Blocks-CPU-Disk of them are on GPU.
	CPU, Disk uint32
}

// Match returns, indexed by ReplicaID, each replica's longest prefix of keys. It writes into
// out when out has the capacity (Slots()), so a caller reusing its slice does not allocate.
// Each group of 63 replicas is scanned once and the scan stops at the first block none of them
// holds.
func (ix *Index) Match(keys []blockkey.Key, out []Match) []Match {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	n := len(ix.reps)
	if cap(out) < n {
		out = make([]Match, n)
	} else {
		out = out[:n]
		clear(out)
	}
	for gi, g := range ix.groups {
		base := gi * groupSize
		end := min(base+groupSize, n)
		g.match(keys, out[base:end])
	}
	return out
}

func (g *group) match(keys []blockkey.Key, out []Match) {
	alive := g.live    // replicas whose any-tier prefix still runs
	aliveGPU := g.live // replicas whose GPU prefix still runs
	i := 0
	for ; i < len(keys) && alive != 0; i++ {
		k := keys[i]
		m, ok := g.keys[k]
		if !ok {
			break
		}
		held, gpu, cpu := m, m, uint64(0)
		if m&offFlag != 0 {
			o := g.off[k]
			held, gpu, cpu = m&^offFlag, o[GPU], o[CPU]
		}
		for d := alive &^ held; d != 0; d &= d - 1 {
			out[bits.TrailingZeros64(d)].Blocks = uint32(i)
		}
		alive &= held
		for d := aliveGPU &^ gpu; d != 0; d &= d - 1 {
			out[bits.TrailingZeros64(d)].GPU = uint32(i)
		}
		aliveGPU &= gpu
		for s := alive &^ gpu; s != 0; s &= s - 1 {
			b := bits.TrailingZeros64(s)
			if cpu&(1<<b) != 0 {
				out[b].CPU++
			} else {
				out[b].Disk++
			}
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		out[bits.TrailingZeros64(alive)].Blocks = uint32(i)
	}
	for ; aliveGPU != 0; aliveGPU &= aliveGPU - 1 {
		out[bits.TrailingZeros64(aliveGPU)].GPU = uint32(i)
	}
}
