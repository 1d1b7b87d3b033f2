package blockkey

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// Token ids are uint32 end to end, and vLLM hashes them as Python ints, so ids from 2^31 up take
// another opcode than smaller ones: pickle's save_long writes BININT1 (< 2^8), BININT2 (< 2^16),
// BININT (a signed 4-byte int, so only up to 2^31-1), then LONG1 with the minimal little-endian
// two's complement (5 bytes for 2^31..2^32-1, the top one 00 for the sign); canonical CBOR
// (RFC 8949 §3.1, §4.2.1) writes major type 0 with a 4-byte argument (0x1a) for 2^16..2^32-1.
var largeIDs = []uint32{0, 255, 256, 65535, 65536, 1<<31 - 1, 1 << 31, 1<<31 + 1, 1<<32 - 2, 1<<32 - 1,
	151935, 1 << 31, 3, 1 << 24, 1<<32 - 1, 7}

// The expected pickle bytes and sha256 were produced by CPython 3.11.7's own pickle (the C
// pickler vLLM uses; the pure-Python pickle._Pickler gives the same bytes) and hashlib:
// pickle.dumps((b"\xab"*32, tuple(largeIDs), None), protocol=5) and its sha256, as vLLM's
// hash_block_tokens builds the input (vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py).
// The pickle opcodes were also checked by hand against the rule above.
func TestLargeTokenIDsPickleAsVLLM(t *testing.T) {
	const wantPickle = "800595760000000000000043" + "20" + "abababababababababababababababababababababababababababababababab" + "94" +
		"28" + "4b00" + "4bff" + "4d0001" + "4dffff" + "4a00000100" + "4affffff7f" +
		"8a050000008000" + "8a050100008000" + "8a05feffffff00" + "8a05ffffffff00" +
		"4a7f510200" + "8a050000008000" + "4b03" + "4a00000001" + "8a05ffffffff00" + "4b07" + "7494" +
		"4e" + "8794" + "2e"
	const wantSHA256 = "66f3981f08f67c5c363c6fac6538e62c8310756bebb7b7fc93bf04565ec5d5d3"
	h, err := NewEngineHasher(AlgoSHA256, "0")
	if err != nil {
		t.Fatal(err)
	}
	parent := bytes.Repeat([]byte{0xab}, 32)
	in, err := h.Serialize(parent, largeIDs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(in); got != wantPickle {
		t.Errorf("pickle\n got %s\nwant %s", got, wantPickle)
	}
	d, err := h.HashBlock(nil, parent, largeIDs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(d); got != wantSHA256 {
		t.Errorf("sha256 %s, want %s", got, wantSHA256)
	}
}

// Worked out by hand from RFC 8949 (no cbor2 here): 0x83 array of 3, 0x58 0x20 a 32-byte string,
// 0x90 an array of 16, each id in its shortest form, 0xf6 null.
func TestLargeTokenIDsCBORAsVLLM(t *testing.T) {
	want := "83" + "5820" + strings.Repeat("ab", 32) + "90" +
		"00" + "18ff" + "190100" + "19ffff" + "1a00010000" + "1a7fffffff" +
		"1a80000000" + "1a80000001" + "1afffffffe" + "1affffffff" +
		"1a0002517f" + "1a80000000" + "03" + "1a01000000" + "1affffffff" + "07" +
		"f6"
	h, err := NewEngineHasher(AlgoSHA256CBOR, "0")
	if err != nil {
		t.Fatal(err)
	}
	in, err := h.Serialize(bytes.Repeat([]byte{0xab}, 32), largeIDs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(in); got != want {
		t.Errorf("cbor\n got %s\nwant %s", got, want)
	}
}
