package index

import (
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
)

// keyTable answers like a Go map through random puts, gets and deletes, key 0 included, on
// key ranges small enough that runs collide and wrap round the end of the table.
func TestKeyTableMatchesAMap(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var kt keyTable[uint32]
		want := map[blockkey.Key]uint32{}
		space := []int{8, 100, 3000}[seed%3]
		key := func() blockkey.Key {
			k := blockkey.Key(rng.IntN(space))
			if seed%2 == 1 && k != 0 {
				k = blockkey.Key(rng.Uint64()>>50<<50 | uint64(k)) // same home bits for many
			}
			return k
		}
		for step := range 20000 {
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
		for k, w := range want {
			if g := kt.get(k); g != w {
				t.Fatalf("seed %d: get(%d) = %d at the end, the map %d", seed, k, g, w)
			}
		}
	}
}
