package kvwire

import (
	"math"
	"reflect"
	"testing"
)

// sameAsLibrary decodes payload with the raw readers on and off and fails unless both give the
// same batch (deeply) or the same error text.
func sameAsLibrary(t *testing.T, fast, lib *Decoder, payload []byte) {
	t.Helper()
	a, errA := fast.DecodeBatch(payload)
	b, errB := lib.DecodeBatch(payload)
	switch {
	case (errA == nil) != (errB == nil):
		t.Fatalf("payload %x: raw readers give error %v, library %v", payload, errA, errB)
	case errA != nil:
		if errA.Error() != errB.Error() {
			t.Fatalf("payload %x: raw readers say %q, library %q", payload, errA, errB)
		}
	case !(a.TS == b.TS || a.TS != a.TS && b.TS != b.TS) || !reflect.DeepEqual(a.Events, b.Events) ||
		a.DataParallelRank != b.DataParallelRank || a.Layout != b.Layout || a.BatchLayout != b.BatchLayout: // NaN ts is never DeepEqual
		t.Fatalf("payload %x: raw readers decode\n%+v\nlibrary\n%+v", payload, a, b)
	}
}

// oddPayloads spell integers, strings and headers in every width the raw readers handle, and
// some they hand back to the library.
func oddPayloads(t testing.TB) [][]byte {
	return [][]byte{
		// Tokens as int64 codes (the library's Encode of []int64), incl. out of range.
		enc(t, []any{1.0, []any{[]any{"BlockStored", []int{1, 2}, nil, []int64{0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32}, 16}}, 0}),
		enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []int64{5, -1}, 16}}, 0}),
		enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []int64{5, math.MaxUint32 + 1}, 16}}, 0}),
		enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []int8{3, -3}, 16}}, 0}),
		enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []int16{300, -300}, 16}}, 0}),
		enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []int32{70000, -70000}, 16}}, 0}),
		enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []uint64{7, math.MaxUint64}, 16}}, 0}),
		enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []any{1, "x"}, 16}}, 0}),
		// Hashes: every int width, negative, uint64 above MaxInt64, mixed with bytes.
		enc(t, []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{
			int8(-1), int16(-2), int32(-3), int64(-4), uint8(200), uint16(60000), uint32(1 << 31), uint64(math.MaxUint64), []byte{1, 2, 3}, 9, []byte{},
		}}}, 0}),
		enc(t, []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{1, "x"}}}, 0}),
		// block_size and ranks as uint64 above MaxInt64; a str8 key; a long (str16) unknown key.
		enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []int{}, uint64(math.MaxUint64)}}, 0}),
		enc(t, []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []int{1}, string(make([]byte, 40)): 1, string(make([]byte, 300)): "v"}}, uint64(1) << 63}),
		// Array16 and map16 headers (library path), nil where a string is due.
		enc(t, []any{1.0, make([]any, 16), 0}),
		enc(t, []any{1.0, []any{map[string]any{"type": nil}}, 0}),
	}
}

func TestRawReadersMatchLibrary(t *testing.T) {
	fast, lib := NewDecoder(), NewDecoder()
	lib.libOnly = true
	inputs := oddPayloads(t)
	v := loadVectors(t)
	for _, msgs := range v.KVEvents.Sets {
		for _, m := range msgs {
			inputs = append(inputs, unhex(t, m.Frames["payload"]))
		}
	}
	inputs = append(inputs, shapePayloads(t)...)
	for _, shape := range []Shape{ShapeE1, ShapeE2, ShapeE3} {
		for _, b := range []*Batch{fullBatch(), bigBatch()} {
			p, err := NewEncoder().AppendBatchShape(nil, b, shape)
			if err != nil {
				t.Fatal(err)
			}
			inputs = append(inputs, p)
		}
	}
	for _, p := range inputs {
		// Every prefix too: the raw readers must give up on a value cut short exactly where
		// the library errors.
		for n := 0; n <= len(p); n++ {
			sameAsLibrary(t, fast, lib, p[:n])
		}
	}
}

// FuzzRawReadersMatchLibrary: on any input the raw readers decode what the library decodes and
// fail where it fails, with the same error.
func FuzzRawReadersMatchLibrary(f *testing.F) {
	for _, p := range append(seedPayloads(f), oddPayloads(f)...) {
		f.Add(p)
	}
	fast, lib := NewDecoder(), NewDecoder()
	lib.libOnly = true
	f.Fuzz(func(t *testing.T, payload []byte) { sameAsLibrary(t, fast, lib, payload) })
}

// An empty bin hash is a bytes hash on a fresh decoder too (its arena starts non-nil).
func TestEmptyBinHashIsBytes(t *testing.T) {
	for _, libOnly := range []bool{false, true} {
		d := NewDecoder()
		d.libOnly = libOnly
		b, err := d.DecodeBatch(enc(t, []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{[]byte{}}}}, 0}))
		if err != nil {
			t.Fatal(err)
		}
		if h := b.Events[0].Removed.BlockHashes[0]; !h.IsBytes() || len(h.Bytes) != 0 {
			t.Errorf("libOnly=%v: empty bin hash decoded as %+v", libOnly, h)
		}
	}
}
