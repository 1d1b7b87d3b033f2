package index

import (
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
)

// keyTable answers like a Go map through random puts, gets and deletes, key 0 included, on
// key ranges small enough that runs collide and wrap round the end of a part, and on one large
// enough that parts split and the directory doubles.
func TestKeyTableMatchesAMap(t *testing.T) {
	for seed := range uint64(24) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var kt keyTable[uint32]
		want := map[blockkey.Key]uint32{}
		space := []int{8, 100, 3000, 1 << 20}[seed%4]
		steps := 20000
		if space > keyPartMax {
			steps = 200000
		}
		key := func() blockkey.Key {
			k := blockkey.Key(rng.IntN(space))
			if seed%2 == 1 && k != 0 {
				k = blockkey.Key(rng.Uint64()>>50<<50 | uint64(k)) // same home bits for many
			}
			return k
		}
		for step := range steps {
			k := key()
			switch op := rng.IntN(10); {
			case op < 5:
				v := rng.Uint32() | 1
				kt.put(k, v)
				want[k] = v
			case op < 8:
				kt.del(k)
				delete(want, k)
			default:
				if g, w := kt.get(k), want[k]; g != w {
					t.Fatalf("seed %d step %d: get(%d) = %d, the map %d", seed, step, k, g, w)
				}
			}
			if kt.n != len(want) {
				t.Fatalf("seed %d step %d: %d keys, the map %d", seed, step, kt.n, len(want))
			}
		}
		if space > keyPartMax && len(kt.dir) < 4 {
			t.Fatalf("seed %d: %d keys in %d parts: no split", seed, kt.n, len(kt.dir))
		}
		for k, w := range want {
			if g := kt.get(k); g != w {
				t.Fatalf("seed %d: get(%d) = %d at the end, the map %d", seed, k, g, w)
			}
		}
	}
}
