package blockkey

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/xxh3"
)

// hashBlock16 is XXH3-64 of the bytes it stands for, on random and edge-case tokens.
func TestHashBlock16MatchesXXH3(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 16))
	var tok [16]uint32
	var buf [80]byte
	for i := range 20000 {
		parent, digest := rng.Uint64(), rng.Uint64()
		for j := range tok {
			tok[j] = rng.Uint32()
			switch i % 4 {
			case 1:
				tok[j] = 0
			case 2:
				tok[j] = ^uint32(0)
			case 3:
				tok[j] = uint32(rng.IntN(200_000)) // a vocabulary's ids
			}
		}
		if i%5 == 0 {
			digest = 0
		}
		binary.LittleEndian.PutUint64(buf[0:], parent)
		binary.LittleEndian.PutUint64(buf[8:], digest)
		for j, v := range tok {
			binary.LittleEndian.PutUint32(buf[16+4*j:], v)
		}
		if got, want := hashBlock16(parent, digest, &tok), Key(xxh3.Hash(buf[:])); got != want {
			t.Fatalf("case %d: hashBlock16 = %#x, xxh3.Hash %#x", i, got, want)
		}
	}
}

func FuzzHashBlock16(f *testing.F) {
	f.Add(uint64(RootKey), uint64(0), make([]byte, 64))
	f.Fuzz(func(t *testing.T, parent, digest uint64, b []byte) {
		if len(b) < 64 {
			return
		}
		var tok [16]uint32
		for j := range tok {
			tok[j] = binary.LittleEndian.Uint32(b[4*j:])
		}
		buf := make([]byte, 0, 80)
		buf = binary.LittleEndian.AppendUint64(buf, parent)
		buf = binary.LittleEndian.AppendUint64(buf, digest)
		buf = append(buf, b[:64]...)
		if got, want := hashBlock16(parent, digest, &tok), Key(xxh3.Hash(buf)); got != want {
			t.Fatalf("hashBlock16 = %#x, xxh3.Hash %#x", got, want)
		}
	})
}
