package blockkey

import "math/bits"

// hashBlock16 is XXH3-64 of the 80 bytes NextKey hashes for a 16-token block (parent LE | extras
// digest LE | 16 tokens as uint32 LE), read straight from the tokens: two consecutive uint32
// tokens are, as one little-endian uint64, the same 8 bytes. It gives the value xxh3.Hash gives
// for those bytes (TestHashBlock16MatchesXXH3) without first writing them to a buffer, which
// cost about as much as the hash itself: the 8-byte reads of bytes written 4 at a time do not
// forward from the stores. This is XXH3's 17-128 byte path for a length of 80, with the default
// secret (zeebo/xxh3 hashAny; the XXH3 specification).
func hashBlock16(parent, digest uint64, t *[16]uint32) Key {
	w := func(i int) uint64 { return uint64(t[2*i]) | uint64(t[2*i+1])<<32 }
	acc := uint64(xxLen80) // 80 x XXH3's PRIME64_1, mod 2^64
	// The reads of hashAny for l = 80 at byte offsets (0, 8), (64, 72), (16, 24), (48, 56),
	// (32, 40) twice; byte 16+8i is w(i).
	acc += mulFold(parent^xxKey000, digest^xxKey008)
	acc += mulFold(w(6)^xxKey016, w(7)^xxKey024)
	acc += mulFold(w(0)^xxKey032, w(1)^xxKey040)
	acc += mulFold(w(4)^xxKey048, w(5)^xxKey056)
	acc += mulFold(w(2)^xxKey064, w(3)^xxKey072)
	acc += mulFold(w(2)^xxKey080, w(3)^xxKey088)
	acc ^= acc >> 37
	acc *= 0x165667919e3779f9
	acc ^= acc >> 32
	return Key(acc)
}

func mulFold(x, y uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	return hi ^ lo
}

// 80 x PRIME64_1 (11400714785074694791) mod 2^64, and the first 96 bytes of XXH3's default secret,
// as little-endian uint64s at the byte offset each name gives.
const (
	xxLen80  = 0x71560779d9af4a30
	xxKey000 = 0xbe4ba423396cfeb8
	xxKey008 = 0x1cad21f72c81017c
	xxKey016 = 0xdb979083e96dd4de
	xxKey024 = 0x1f67b3b7a4a44072
	xxKey032 = 0x78e5c0cc4ee679cb
	xxKey040 = 0x2172ffcc7dd05a82
	xxKey048 = 0x8e2443f7744608b8
	xxKey056 = 0x4c263a81e69035e0
	xxKey064 = 0xcb00c391bb52283c
	xxKey072 = 0xa32e531b8b65d088
	xxKey080 = 0x4ef90da297486471
	xxKey088 = 0xd8acdea946ef1938
)
