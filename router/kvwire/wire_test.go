package kvwire

import (
	"bytes"
	"encoding/json"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/router/blockkey"
)

func fullBatch() *Batch {
	id := blockkey.Identity{LoRAName: "sql", CacheSalt: "salt", MM: []blockkey.MMItem{{ID: "img:1", Offset: 4, Length: 20}}}
	tokens := make([]uint32, 48)
	for i := range tokens {
		tokens[i] = uint32(100000 + i)
	}
	ek := make([]blockkey.Extras, 3)
	for i := range ek {
		ek[i] = id.BlockExtras(nil, i, 16)
	}
	ek[2] = append(ek[2], blockkey.ExtraKey{Kind: blockkey.ExtraBytes, Bytes: []byte{1, 2, 3}})
	return &Batch{
		TS: 1.5,
		Events: []Event{
			{Type: EventBlockRemoved, Tag: TagBlockRemoved, Removed: BlockRemoved{
				BlockHashes: []Hash{IntHash(1), IntHash(1 << 63)}, Medium: Some("CPU"), GroupIdx: Some[int64](2), Locality: Some("REMOTE"), Ownership: Some("kvcr")}},
			{Type: EventBlockStored, Tag: TagBlockStored, Stored: BlockStored{
				BlockHashes:     []Hash{IntHash(7), BytesHash(bytes.Repeat([]byte{9}, 32)), IntHash(200)},
				ParentBlockHash: Some(IntHash(5)), TokenIDs: tokens, BlockSize: 16,
				LoRAID: Some[int64](3), Medium: Some("GPU"), LoRAName: Some("sql"), ExtraKeys: Some(ek),
				GroupIdx: Some[int64](0), KVCacheSpecKind: Some("sliding_window"), KVCacheSpecSlidingWindow: Some[int64](4096),
				Locality: Some("LOCAL"), SessionID: Some("session")}},
			{Type: EventAllBlocksCleared, Tag: TagAllBlocksCleared},
			{Type: EventBlockStored, Tag: TagBlockStored, Stored: BlockStored{BlockHashes: []Hash{}, TokenIDs: []uint32{}, BlockSize: 16}},
		},
		DataParallelRank: Some[int64](3),
	}
}

func mustJSON(t testing.TB, b *Batch) string {
	t.Helper()
	out, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func TestRoundTripBothLayouts(t *testing.T) {
	in := fullBatch()
	enc, d := NewEncoder(), NewDecoder()
	for _, layout := range []Layout{LayoutMap, LayoutArray} {
		in.Layout, in.BatchLayout = layout, LayoutArray
		payload, err := enc.AppendBatch(nil, in, layout)
		if err != nil {
			t.Fatal(err)
		}
		out, err := d.DecodeBatch(payload)
		if err != nil {
			t.Fatalf("%v: %v", layout, err)
		}
		if got, want := mustJSON(t, out), mustJSON(t, in); got != want {
			t.Errorf("%v round trip\n got %s\nwant %s", layout, got, want)
		}
		again, _ := enc.AppendBatch(nil, out, layout)
		if !bytes.Equal(again, payload) {
			t.Errorf("%v: decode+encode is not byte-stable", layout)
		}
	}
}

func TestJSONShape(t *testing.T) {
	b := fullBatch()
	b.Layout = LayoutMap
	got := mustJSON(t, b)
	for _, want := range []string{
		`"block_hashes":[1,9223372036854775808]`,
		`"block_hashes":[7,"0909090909090909090909090909090909090909090909090909090909090909",200]`,
		`"extra_keys":[["sql",["img:1",4],"salt"],["sql",["img:1",-12]],["sql",{"bytes_hex":"010203"}]]`,
		`"data_parallel_rank":3`,
		`{"type":"AllBlocksCleared"}`,
		`"parent_block_hash":null,"token_ids":[],"block_size":16,"lora_id":null,"medium":null,"lora_name":null}`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("JSON lacks %s:\n%s", want, got)
		}
	}
}

// Re-keying a decoded event must give the keys the request path computes (LoRA, salt, mm).
func TestEventRekeyMatchesPromptKeys(t *testing.T) {
	id := blockkey.Identity{LoRAName: "sql", CacheSalt: "salt", MM: []blockkey.MMItem{{ID: "img:1", Offset: 4, Length: 20}}}
	tokens := fullBatch().Events[1].Stored.TokenIDs
	want, err := blockkey.AppendPromptKeys(nil, tokens, 16, id)
	if err != nil {
		t.Fatal(err)
	}
	b := fullBatch()
	s := &b.Events[1].Stored
	s.ExtraKeys.V[2] = s.ExtraKeys.V[2][:1] // as vLLM sends it for this identity
	s.ParentBlockHash = Opt[Hash]{}
	payload, _ := NewEncoder().AppendBatch(nil, b, LayoutArray)
	out, err := NewDecoder().DecodeBatch(payload)
	if err != nil {
		t.Fatal(err)
	}
	got, err := out.Events[1].Stored.AppendRouterKeys(nil, blockkey.RootKey)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("block %d: event key %x, prompt key %x", i, got[i], want[i])
		}
	}
	bad := BlockStored{BlockHashes: []Hash{IntHash(1)}, TokenIDs: []uint32{1, 2}, BlockSize: 16}
	if _, err := bad.AppendRouterKeys(nil, blockkey.RootKey); err == nil {
		t.Error("event with too few tokens re-keyed")
	}
}

func enc(t testing.TB, v ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	for _, x := range v {
		if err := e.Encode(x); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestToleratesUnknownAndMissing(t *testing.T) {
	d := NewDecoder()
	// Map event with an unknown key before and after, keys out of order, and a future event type.
	payload := enc(t, []any{2.0, []any{
		map[string]any{"replica_hint": []any{1, "x"}, "type": "BlockStored", "token_ids": []int{1}, "block_size": 1,
			"parent_block_hash": nil, "block_hashes": []uint64{42}, "origin": "NEW"},
		map[string]any{"type": "BlockInactive", "block_hashes": "not even a list"},
		[]any{"BlockRemoved", []uint64{42}, "GPU", 0, nil, "future", 3},
		[]any{"BlockStored", []uint64{1}, nil, []int{5}, 1}, // v0.9 shape: no medium or later fields
	}, 0, "extra batch element"})
	b, err := d.DecodeBatch(payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 4 || b.Events[0].Type != EventBlockStored || b.Events[1].Type != EventUnknown ||
		b.Events[1].Tag != "BlockInactive" || b.Events[2].Type != EventBlockRemoved || b.Events[3].Type != EventBlockStored {
		t.Fatalf("events %+v", b.Events)
	}
	if h := b.Events[0].Stored.BlockHashes; len(h) != 1 || h[0].Uint64() != 42 {
		t.Errorf("map event hashes %v", h)
	}
	if s := b.Events[3].Stored; s.Medium.OK || s.GroupIdx.OK || s.ExtraKeys.OK || s.TokenIDs[0] != 5 {
		t.Errorf("old array event %+v", s)
	}
	if !b.DataParallelRank.OK || b.DataParallelRank.V != 0 {
		t.Errorf("dp rank %+v", b.DataParallelRank)
	}
	// [ts, events] (v0.9.0): no rank.
	b, err = d.DecodeBatch(enc(t, []any{1.0, []any{}}))
	if err != nil || b.DataParallelRank.OK {
		t.Errorf("two-element batch: %+v %v", b, err)
	}
}

func TestRejectsBadInput(t *testing.T) {
	cases := map[string][]byte{
		"map without events":  enc(t, map[string]int{"ts": 1}),
		"batch is a string":   enc(t, "x"),
		"one element":         enc(t, []any{1.0}),
		"ts is a string":      enc(t, []any{"x", []any{}, 0}),
		"event is a number":   enc(t, []any{1.0, []any{7}, 0}),
		"map without type":    enc(t, []any{1.0, []any{map[string]any{"block_hashes": []int{}}}, 0}),
		"stored without size": enc(t, []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []int{}, "token_ids": []int{}, "parent_block_hash": nil}}, 0}),
		"short array stored":  enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil}}, 0}),
		"token too large":     enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []int64{1 << 40}, 16}}, 0}),
		"negative token":      enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []int64{-1}, 16}}, 0}),
		"medium is an int":    enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []int{}, 16, nil, 5}}, 0}),
		"extra_keys count":    enc(t, []any{1.0, []any{[]any{"BlockStored", []int{1}, nil, []int{}, 16, nil, "GPU", nil, []any{}}}, 0}),
		"block size zero":     enc(t, []any{1.0, []any{[]any{"BlockStored", []int{}, nil, []int{}, 0}}, 0}),
		"hash is a string":    enc(t, []any{1.0, []any{[]any{"BlockRemoved", []string{"x"}}}, 0}),
		"trailing bytes":      append(enc(t, []any{1.0, []any{}, 0}), 0xc0),
		"empty":               {},
		"huge array header":   {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff},
		"huge str in map":     {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x81, 0xdb, 0xff, 0xff, 0xff, 0xf0, 'a'},
		"huge skipped bin":    {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x81, 0xa1, 'z', 0xc6, 0xff, 0xff, 0xff, 0xf0},
		"deep nesting":        append(append([]byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x81, 0xa1, 'z'}, bytes.Repeat([]byte{0x91}, 100)...), 0xc0),
	}
	d := NewDecoder()
	for name, payload := range cases {
		if _, err := d.DecodeBatch(payload); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.HasPrefix(err.Error(), "kvwire: ") {
			t.Errorf("%s: error %q lacks the package prefix", name, err)
		}
	}
	// Every truncation of a valid payload is an error, never a panic.
	full, _ := NewEncoder().AppendBatch(nil, fullBatch(), LayoutMap)
	for n := 0; n < len(full); n++ {
		if _, err := d.DecodeBatch(full[:n]); err == nil {
			t.Fatalf("payload truncated to %d of %d bytes accepted", n, len(full))
		}
	}
}

func TestHostileLengthsDoNotAllocate(t *testing.T) {
	d := NewDecoder()
	payload := []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < 100; i++ {
		_, _ = d.DecodeBatch(payload)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Errorf("100 decodes of a 16-byte hostile payload allocated %d bytes", grew)
	}
}

func TestDecodeHotPathDoesNotAllocate(t *testing.T) {
	v := loadVectors(t)
	for _, set := range []string{"map_v0.24plus__int_hashes", "array_v0.22_v0.23__int_hashes"} {
		payload := unhex(t, v.KVEvents.Sets[set][0].Frames["payload"])
		d := NewDecoder()
		if _, err := d.DecodeBatch(payload); err != nil {
			t.Fatal(err)
		}
		if a := testing.AllocsPerRun(50, func() { _, _ = d.DecodeBatch(payload) }); a != 0 {
			t.Errorf("%s: %.0f allocations per decode after warm-up", set, a)
		}
	}
}

func TestFrames(t *testing.T) {
	m := Message{Topic: []byte("kv@10.0.0.1@m"), Seq: 258, Payload: []byte{0x90}}
	got, err := ParseFrames(m.Frames())
	if err != nil || got.Seq != 258 || string(got.Topic) != "kv@10.0.0.1@m" || !bytes.Equal(got.Payload, m.Payload) {
		t.Fatalf("ParseFrames(Frames) = %+v, %v", got, err)
	}
	for _, bad := range [][][]byte{nil, {{}, {1, 2}}, {{}, {1, 2, 3}, {}}, {{}, make([]byte, 8), {}, {}}} {
		if _, err := ParseFrames(bad); err == nil {
			t.Errorf("ParseFrames(%x) accepted", bad)
		}
	}
	// Replay replies from every version and socket type.
	seq := m.Frames()[1]
	for _, frames := range [][][]byte{
		ReplayReplyFrames([]byte("id"), m)[1:], // with vLLM #45177, DEALER: "", topic, seq, payload
		{m.Topic, seq, m.Payload},              // with #45177, REQ
		{{}, seq, m.Payload},                   // before #45177, DEALER
		{seq, m.Payload},                       // before #45177, REQ
	} {
		r, end, err := ParseReplayReply(frames)
		if err != nil || end || r.Seq != 258 || !bytes.Equal(r.Payload, m.Payload) {
			t.Errorf("ParseReplayReply(%x) = %+v end=%v err=%v", frames, r, end, err)
		}
	}
	for _, bad := range [][][]byte{{}, {{1}}, {{1}, {}, seq, {}}, {{}, {}, {}, {}, {}}, {{}, {1}, {}}} {
		if _, _, err := ParseReplayReply(bad); err == nil {
			t.Errorf("ParseReplayReply(%x) accepted", bad)
		}
	}
	if _, _, err := ParseReplayRequest([][]byte{{1}, {2}, seq}); err == nil {
		t.Error("replay request without the empty delimiter accepted")
	}
}

// Every block size from the wire is range-checked before it is multiplied or used to slice
// (issue 15): the decoder refuses a BlockStored outside 1..MaxBlockSize, and CheckTokens and
// AppendRouterKeys refuse it on an event built by hand, without a panic.
func TestBlockSizeBounds(t *testing.T) {
	hashes := func(n int) []Hash {
		out := make([]Hash, n)
		for i := range out {
			out[i] = IntHash(uint64(i + 1))
		}
		return out
	}
	cases := []struct {
		name      string
		hashes    int
		blockSize int64
		tokens    int
		ok        bool
	}{
		{"issue 15: 4 x 2^62 wraps to 0 tokens", 4, 1 << 62, 0, false},
		{"2^61 x 8 wraps too", 8, 1 << 61, 0, false},
		{"max int64", 1, math.MaxInt64, 0, false},
		{"min int64", 1, math.MinInt64, 0, false},
		{"zero", 1, 0, 0, false},
		{"negative", 2, -16, 32, false},
		{"one above the maximum", 1, blockkey.MaxBlockSize + 1, blockkey.MaxBlockSize + 1, false},
		{"tokens short by one", 2, 16, 31, false},
		{"tokens over by one block", 2, 16, 48, false},
		{"the maximum", 1, blockkey.MaxBlockSize, blockkey.MaxBlockSize, true},
		{"one token per block", 3, 1, 3, true},
		{"16", 2, 16, 32, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := BlockStored{BlockHashes: hashes(tc.hashes), TokenIDs: make([]uint32, tc.tokens), BlockSize: tc.blockSize}
			keys, err := s.AppendRouterKeys(nil, blockkey.RootKey)
			if (err == nil) != tc.ok || (s.CheckTokens() == nil) != tc.ok {
				t.Fatalf("AppendRouterKeys err %v, CheckTokens err %v; want ok=%v", err, s.CheckTokens(), tc.ok)
			}
			if tc.ok && len(keys) != tc.hashes {
				t.Fatalf("%d keys for %d hashes", len(keys), tc.hashes)
			}
			// The same event on the wire: the decoder takes only block sizes in range.
			payload, err := NewEncoder().AppendBatch(nil, &Batch{TS: 1, Events: []Event{{Type: EventBlockStored, Stored: s}}}, LayoutMap)
			if err != nil {
				t.Fatal(err)
			}
			_, err = NewDecoder().DecodeBatch(payload)
			inRange := blockkey.ValidBlockSize(tc.blockSize)
			if (err == nil) != inRange {
				t.Fatalf("decode err %v; block size in range: %v", err, inRange)
			}
		})
	}
}
