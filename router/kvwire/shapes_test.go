package kvwire

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// shapesPath holds one batch in each shape, as vLLM's own classes (vllm/distributed/kv_events.py)
// encode it through msgspec; see testdata/vllm/README.md.
const shapesPath = "../../testdata/vllm/vllm-batch-shapes.json"

type shapeVector struct {
	Hex     string          `json:"hex"`
	Decoded json.RawMessage `json:"decoded"`
}

func loadShapes(t testing.TB) map[string]shapeVector {
	t.Helper()
	raw, err := os.ReadFile(shapesPath)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Shapes map[string]shapeVector `json:"shapes"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Shapes) != 3 {
		t.Fatalf("want shapes E1, E2, E3, got %d", len(f.Shapes))
	}
	return f.Shapes
}

func shapePayloads(t testing.TB) [][]byte {
	var out [][]byte
	for _, name := range []string{"E1", "E2", "E3"} {
		out = append(out, unhex(t, loadShapes(t)[name].Hex))
	}
	return out
}

// pyBatch renders a decoded batch as the shapes file writes its decoding: pyShape's array batch,
// or for a map batch the same fields by name, data_parallel_rank left out when None.
func pyBatch(b *Batch) any {
	a := pyShape(b, b.Layout).([]any)
	if b.BatchLayout != LayoutMap {
		return a
	}
	m := map[string]any{"ts": a[0], "events": a[1]}
	if b.DataParallelRank.OK {
		m["data_parallel_rank"] = a[2]
	}
	return m
}

// sameNumbers rewrites JSON numbers with a fraction or exponent that hold an integer (Python's
// json writes the float 1.0 as "1.0", Go's as "1") as that integer; integers stay as written, so
// uint64 hashes are compared digit for digit.
func sameNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if strings.ContainsAny(string(x), ".eE") {
			if f, err := x.Float64(); err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<53 {
				return json.Number(strconv.FormatInt(int64(f), 10))
			}
		}
		return x
	case []any:
		for i := range x {
			x[i] = sameNumbers(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = sameNumbers(x[k])
		}
	}
	return v
}

// Each shape's bytes, from vLLM's classes, decode to what msgspec made of them, say which shape
// they are, and re-encode to the same bytes.
func TestVLLMBatchShapes(t *testing.T) {
	shapes := loadShapes(t)
	want := map[string]struct {
		shape         Shape
		batch, events Layout
	}{
		"E1": {ShapeE1, LayoutArray, LayoutArray},
		"E2": {ShapeE2, LayoutMap, LayoutMap},
		"E3": {ShapeE3, LayoutArray, LayoutMap},
	}
	d, enc := NewDecoder(), NewEncoder()
	for name, w := range want {
		t.Run(name, func(t *testing.T) {
			payload := unhex(t, shapes[name].Hex)
			b, err := d.DecodeBatch(payload)
			if err != nil {
				t.Fatal(err)
			}
			if b.Shape() != w.shape || b.BatchLayout != w.batch || b.Layout != w.events {
				t.Errorf("shape %v (batch %v, events %v), want %v (%v, %v)", b.Shape(), b.BatchLayout, b.Layout, w.shape, w.batch, w.events)
			}
			if got, want := sameNumbers(jsonValue(t, pyBatch(b))), sameNumbers(jsonValue(t, shapes[name].Decoded)); !reflect.DeepEqual(got, want) {
				t.Errorf("decoded\n got %v\nwant %v", got, want)
			}
			if len(b.Events) != 3 || b.Events[0].Type != EventBlockStored || b.Events[1].Type != EventBlockRemoved ||
				b.Events[2].Type != EventAllBlocksCleared || b.Events[0].Stored.ParentBlockHash.OK ||
				b.Events[0].Stored.BlockHashes[0].Uint64() != 123 || b.Events[1].Removed.BlockHashes[0].Uint64() != 123 ||
				b.TS != 1 || !b.DataParallelRank.OK || b.DataParallelRank.V != 0 {
				t.Errorf("batch %+v", b)
			}
			out, err := enc.AppendBatchShape(nil, b, w.shape)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, payload) {
				t.Errorf("re-encoded\n got %x\nwant %x", out, payload)
			}
			if a := testing.AllocsPerRun(20, func() { _, _ = d.DecodeBatch(payload) }); a != 0 {
				t.Errorf("%.0f allocations per decode after warm-up", a)
			}
		})
	}
}

func TestMapBatch(t *testing.T) {
	stored := map[string]any{"type": "BlockStored", "block_hashes": []int{7}, "parent_block_hash": nil, "token_ids": []int{1, 2}, "block_size": 2}
	events := []any{stored}
	type kv struct {
		k string
		v any
	}
	// mapBatch writes the keys in the order given (Go maps would not).
	mapBatch := func(t *testing.T, pairs ...kv) []byte {
		var buf bytes.Buffer
		if len(pairs) > 15 {
			t.Fatal("fixmap only")
		}
		buf.WriteByte(0x80 | byte(len(pairs)))
		for _, p := range pairs {
			buf.Write(enc(t, p.k, p.v))
		}
		return buf.Bytes()
	}
	for _, tc := range []struct {
		name    string
		payload func(t *testing.T) []byte
		rank    Opt[int64]
		nEvents int
		err     string // "" when it decodes
	}{
		{"declaration order", func(t *testing.T) []byte {
			return mapBatch(t, kv{"ts", 1.5}, kv{"events", events}, kv{"data_parallel_rank", 2})
		}, Some[int64](2), 1, ""},
		{"any order", func(t *testing.T) []byte {
			return mapBatch(t, kv{"data_parallel_rank", 2}, kv{"events", events}, kv{"ts", 1.5})
		}, Some[int64](2), 1, ""},
		{"rank omitted (None, omit_defaults)", func(t *testing.T) []byte {
			return mapBatch(t, kv{"ts", 1.5}, kv{"events", events})
		}, Opt[int64]{}, 1, ""},
		{"rank nil", func(t *testing.T) []byte {
			return mapBatch(t, kv{"ts", 1.5}, kv{"events", events}, kv{"data_parallel_rank", nil})
		}, Opt[int64]{}, 1, ""},
		{"unknown keys skipped", func(t *testing.T) []byte {
			return mapBatch(t, kv{"vllm_instance_id", "abc"}, kv{"ts", 1.5}, kv{"future", map[string]any{"x": []int{1}}},
				kv{"events", events}, kv{"data_parallel_rank", 0}, kv{"z", nil})
		}, Some[int64](0), 1, ""},
		{"no events", func(t *testing.T) []byte {
			return mapBatch(t, kv{"ts", 1.5}, kv{"events", []any{}})
		}, Opt[int64]{}, 0, ""},
		{"ts missing", func(t *testing.T) []byte {
			return mapBatch(t, kv{"events", events}, kv{"data_parallel_rank", 0})
		}, Opt[int64]{}, 0, `map batch lacks "ts"`},
		{"events missing", func(t *testing.T) []byte {
			return mapBatch(t, kv{"ts", 1.5}, kv{"data_parallel_rank", 0})
		}, Opt[int64]{}, 0, `map batch lacks "events"`},
		{"empty map", func(t *testing.T) []byte { return mapBatch(t) }, Opt[int64]{}, 0, `map batch lacks "ts"`},
		{"key twice", func(t *testing.T) []byte {
			return mapBatch(t, kv{"ts", 1.5}, kv{"events", events}, kv{"ts", 2.0})
		}, Opt[int64]{}, 0, `map batch has key "ts" twice`},
		{"ts a string", func(t *testing.T) []byte {
			return mapBatch(t, kv{"ts", "x"}, kv{"events", events})
		}, Opt[int64]{}, 0, "ts is msgpack code"},
		{"events a map", func(t *testing.T) []byte {
			return mapBatch(t, kv{"ts", 1.5}, kv{"events", stored})
		}, Opt[int64]{}, 0, "events is msgpack code"},
		{"bad event", func(t *testing.T) []byte {
			return mapBatch(t, kv{"ts", 1.5}, kv{"events", []any{map[string]any{"type": "BlockStored"}}})
		}, Opt[int64]{}, 0, "event 0: BlockStored lacks"},
		{"integer key", func(t *testing.T) []byte {
			return append([]byte{0x81}, enc(t, 1, 1.5)...)
		}, Opt[int64]{}, 0, "batch key is msgpack code"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.payload(t)
			fast, lib := NewDecoder(), NewDecoder()
			lib.libOnly = true
			sameAsLibrary(t, fast, lib, p)
			b, err := fast.DecodeBatch(p)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.TS != 1.5 || b.DataParallelRank != tc.rank || len(b.Events) != tc.nEvents || b.Shape() != ShapeE2 {
				t.Errorf("ts %v rank %+v %d events shape %v", b.TS, b.DataParallelRank, len(b.Events), b.Shape())
			}
		})
	}
}

func TestShapeOfEmptyAndOddBatches(t *testing.T) {
	d := NewDecoder()
	for _, tc := range []struct {
		payload []byte
		shape   Shape
	}{
		{enc(t, []any{1.0, []any{}, 0}), ShapeUnknown}, // E1 and E3 look alike without events
		{enc(t, map[string]any{"ts": 1.0, "events": []any{}}), ShapeE2},
		{enc(t, map[string]any{"ts": 1.0, "events": []any{[]any{"AllBlocksCleared"}}}), ShapeUnknown},
		{enc(t, []any{1.0, []any{[]any{"AllBlocksCleared"}}}), ShapeE1},
		{enc(t, []any{1.0, []any{map[string]any{"type": "AllBlocksCleared"}}}), ShapeE3},
	} {
		b, err := d.DecodeBatch(tc.payload)
		if err != nil {
			t.Fatal(err)
		}
		if b.Shape() != tc.shape {
			t.Errorf("%x: shape %v, want %v", tc.payload, b.Shape(), tc.shape)
		}
	}
	if _, err := NewEncoder().AppendBatchShape(nil, fullBatch(), ShapeUnknown); err == nil {
		t.Error("encoded ShapeUnknown")
	}
}

// Every shape round-trips through the encoder and decoder, fields and shape alike.
func TestRoundTripEveryShape(t *testing.T) {
	enc, d := NewEncoder(), NewDecoder()
	for _, s := range []Shape{ShapeE1, ShapeE2, ShapeE3} {
		for _, rank := range []Opt[int64]{Some[int64](3), {}} {
			in := fullBatch()
			in.DataParallelRank = rank
			in.BatchLayout, in.Layout = s.Layouts()
			payload, err := enc.AppendBatchShape(nil, in, s)
			if err != nil {
				t.Fatal(err)
			}
			out, err := d.DecodeBatch(payload)
			if err != nil {
				t.Fatalf("%v: %v", s, err)
			}
			if got, want := mustJSON(t, out), mustJSON(t, in); got != want {
				t.Errorf("%v round trip\n got %s\nwant %s", s, got, want)
			}
			if !strings.Contains(mustJSON(t, out), `"shape":"`+s.String()+`"`) {
				t.Errorf("%v: JSON lacks the shape", s)
			}
		}
	}
}
