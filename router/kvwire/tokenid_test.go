package kvwire

import (
	"math"
	"strings"
	"testing"
)

// Token ids are uint32 end to end: 0..2^32-1 decode in every msgpack width, 2^32 and negatives
// are refused.
func TestTokenIDRange(t *testing.T) {
	ok := []any{
		[]uint32{0, 1, math.MaxInt32, math.MaxInt32 + 1, math.MaxUint32},                             // uint32 (0xce), as llm-d-inference-sim writes
		[]uint64{0, math.MaxInt32 + 1, math.MaxUint32},                                               // uint64 (0xcf)
		[]int64{0, math.MaxInt32 + 1, math.MaxUint32},                                                // int64 (0xd3)
		[]any{0, 127, 128, 255, 256, 65535, 65536, math.MaxInt32, math.MaxInt32 + 1, math.MaxUint32}, // shortest forms, as msgspec writes
	}
	for _, ids := range ok {
		p := enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, ids, 16}}, 0})
		fast, lib := NewDecoder(), NewDecoder()
		lib.libOnly = true
		sameAsLibrary(t, fast, lib, p)
		b, err := fast.DecodeBatch(p)
		if err != nil {
			t.Fatalf("%v: %v", ids, err)
		}
		toks := b.Events[0].Stored.TokenIDs
		if toks[len(toks)-1] != math.MaxUint32 {
			t.Errorf("%v decoded as %v", ids, toks)
		}
	}
	for _, ids := range []any{
		[]uint64{1, math.MaxUint32 + 1},
		[]int64{1, math.MaxUint32 + 1},
		[]int64{1, -1},
		[]int8{-1},
		[]int64{math.MinInt64},
		[]uint64{math.MaxUint64},
	} {
		p := enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, ids, 16}}, 0})
		_, err := NewDecoder().DecodeBatch(p)
		if err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("%v: err %v, want a token id range error", ids, err)
		}
	}
}
