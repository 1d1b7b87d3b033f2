package kvwire

import (
	"math"
	"testing"
)

// An integer parent_block_hash of 0 is no parent (noParentZero), in either event layout and
// however wide the integer is written; any other parent, and a raw-bytes parent of zeros, stays.
func TestParentZeroIsNoParent(t *testing.T) {
	stored := func(parent any) []any { // array layout, the fields llm-d-inference-sim writes
		return []any{"BlockStored", []uint64{11}, parent, []uint32{1, 2}, 2, nil, "GPU", nil}
	}
	storedMap := func(parent any) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": []uint64{11}, "parent_block_hash": parent, "token_ids": []uint32{1, 2}, "block_size": 2}
	}
	for _, tc := range []struct {
		name   string
		event  any
		parent Opt[Hash]
	}{
		// vmihailenco/msgpack writes a Go uint64 as uint64 (0xcf) unless told to compact it, which
		// is how llm-d-inference-sim's 0 arrives.
		{"array, uint64 0 (llm-d-inference-sim)", stored(uint64(0)), Opt[Hash]{}},
		{"array, fixint 0", stored(0), Opt[Hash]{}},
		{"array, int64 0", stored(int64(0)), Opt[Hash]{}},
		{"array, nil (vLLM)", stored(nil), Opt[Hash]{}},
		{"array, 1", stored(uint64(1)), Some(IntHash(1))},
		{"array, max uint64", stored(uint64(math.MaxUint64)), Some(IntHash(math.MaxUint64))},
		{"array, zero bytes", stored(make([]byte, 8)), Some(BytesHash(make([]byte, 8)))},
		{"map, 0", storedMap(0), Opt[Hash]{}},
		{"map, nil", storedMap(nil), Opt[Hash]{}},
		{"map, 7", storedMap(7), Some(IntHash(7))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := enc(t, []any{1.0, []any{tc.event}, 0})
			fast, lib := NewDecoder(), NewDecoder()
			lib.libOnly = true
			sameAsLibrary(t, fast, lib, p)
			b, err := fast.DecodeBatch(p)
			if err != nil {
				t.Fatal(err)
			}
			got := b.Events[0].Stored.ParentBlockHash
			if got.OK != tc.parent.OK || got.V.Int != tc.parent.V.Int || got.V.IsBytes() != tc.parent.V.IsBytes() {
				t.Errorf("parent %+v, want %+v", got, tc.parent)
			}
		})
	}
}
