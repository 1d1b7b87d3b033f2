package index

import (
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
)

// model is the obvious, slow reference: per replica and tier, engine hash -> copies.
type model struct {
	held map[ReplicaID]*[NumTiers]map[uint64]int
}

func newModel() *model { return &model{held: map[ReplicaID]*[NumTiers]map[uint64]int{}} }

func (m *model) add(id ReplicaID) {
	var t [NumTiers]map[uint64]int
	for i := range t {
		t[i] = map[uint64]int{}
	}
	m.held[id] = &t
}

func (m *model) match(id ReplicaID, keys []blockkey.Key) Match {
	var r Match
	tiers := m.held[id]
	gpuRun := true
	for _, k := range keys {
		h := engineHash(k)
		onGPU, onCPU, onDisk := tiers[GPU][h] > 0, tiers[CPU][h] > 0, tiers[Disk][h] > 0
		if !onGPU && !onCPU && !onDisk {
			break
		}
		r.Blocks++
		if gpuRun && onGPU {
			r.GPU++
		} else {
			gpuRun = false
		}
		switch {
		case onGPU:
		case onCPU:
			r.CPU++
		default:
			r.Disk++
		}
	}
	return r
}

// drive applies the operations encoded in ops to an Index and the model and compares them
// after each one. Every byte sequence is a valid program, so the fuzzer can use it too.
func drive(t *testing.T, ops []byte) {
	ix := New(Options{})
	ref := newModel()
	keys, hashes := chain(7, 12)
	var ids []ReplicaID
	for i := range 3 {
		id := mustAdd(t, ix, "pod", i)
		ref.add(id)
		ids = append(ids, id)
	}
	next := 3
	out := make([]Match, 0, 8)
	for len(ops) >= 3 {
		op, a, b := ops[0], ops[1], ops[2]
		ops = ops[3:]
		id := ids[int(a)%len(ids)]
		tier := Tier(b % NumTiers)
		lo := int(b/3) % len(keys)
		hi := lo + int(a/3)%(len(keys)-lo) + 1
		tiers := ref.held[id]
		switch op % 6 {
		case 0, 1: // Store / StoreNew of a run
			count := op%6 == 1
			var err error
			if count {
				err = ix.StoreNew(id, hashes[lo:hi], keys[lo:hi], tier)
			} else {
				err = ix.Store(id, hashes[lo:hi], keys[lo:hi], tier)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range hashes[lo:hi] {
				if tiers[tier][h] == 0 || count {
					tiers[tier][h]++
				}
			}
		case 2, 3: // Remove of a run, some hashes maybe unknown
			unknown, err := ix.Remove(id, hashes[lo:hi], tier)
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			for _, h := range hashes[lo:hi] {
				if tiers[tier][h] == 0 {
					want++
					continue
				}
				tiers[tier][h]--
				if tiers[tier][h] == 0 {
					delete(tiers[tier], h)
				}
			}
			if unknown != want {
				t.Fatalf("Remove unknown %d, want %d", unknown, want)
			}
		case 4:
			if err := ix.Clear(id); err != nil {
				t.Fatal(err)
			}
			ref.add(id)
		case 5: // replace a replica
			if err := ix.RemoveReplica(id); err != nil {
				t.Fatal(err)
			}
			delete(ref.held, id)
			nid := mustAdd(t, ix, "pod", next)
			next++
			ref.add(nid)
			ids[int(a)%len(ids)] = nid
		}
		for _, q := range [][]blockkey.Key{keys, keys[:lo+1]} {
			out = ix.Match(q, out)
			for _, rid := range ids {
				if got, want := out[rid], ref.match(rid, q); got != want {
					t.Fatalf("replica %d: Match %+v, model %+v", rid, got, want)
				}
			}
		}
		for _, rid := range ids {
			st, err := ix.Stats(rid)
			if err != nil {
				t.Fatal(err)
			}
			for tr := range NumTiers {
				copies := 0
				for _, n := range ref.held[rid][tr] {
					copies += n
				}
				if st.Blocks[tr] != len(ref.held[rid][tr]) || st.Copies[tr] != copies {
					t.Fatalf("replica %d tier %d: blocks %d copies %d, model %d %d",
						rid, tr, st.Blocks[tr], st.Copies[tr], len(ref.held[rid][tr]), copies)
				}
			}
		}
	}
}

func TestAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		ops := make([]byte, 3*60)
		for i := range ops {
			ops[i] = byte(rng.UintN(256))
		}
		drive(t, ops)
	}
}

func FuzzIndexOps(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 0, 2, 0, 0, 2, 0, 0})
	f.Add([]byte{0, 9, 1, 0, 9, 2, 3, 9, 1, 4, 9, 0, 5, 1, 1})
	f.Fuzz(func(t *testing.T, ops []byte) { drive(t, ops) })
}
