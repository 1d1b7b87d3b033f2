package blockkey

import (
	"encoding/binary"
	"testing"

	"github.com/zeebo/xxh3"
)

func seqTokens(n int, base uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = base + uint32(i)
	}
	return t
}

func promptKeys(t *testing.T, tokens []uint32, bs int, id Identity) []Key {
	t.Helper()
	k, err := AppendPromptKeys(nil, tokens, bs, id)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestPromptKeysShareExactlyTheCommonPrefix(t *testing.T) {
	a := seqTokens(64, 0)
	b := append(seqTokens(32, 0), seqTokens(32, 1000)...)
	ka, kb := promptKeys(t, a, 16, Identity{}), promptKeys(t, b, 16, Identity{})
	if len(ka) != 4 || len(kb) != 4 {
		t.Fatalf("got %d and %d keys, want 4", len(ka), len(kb))
	}
	for i := 0; i < 4; i++ {
		if (ka[i] == kb[i]) != (i < 2) {
			t.Errorf("block %d: equal=%v, want equal only for the 2 shared blocks", i, ka[i] == kb[i])
		}
	}
	again := promptKeys(t, a, 16, Identity{})
	for i := range ka {
		if ka[i] != again[i] {
			t.Fatal("keys are not deterministic")
		}
	}
	if got := promptKeys(t, a[:63], 16, Identity{}); len(got) != 3 {
		t.Errorf("63 tokens gave %d keys, want 3 (no key for a partial block)", len(got))
	}
	if _, err := AppendPromptKeys(nil, a, 0, Identity{}); err == nil {
		t.Error("block size 0 accepted")
	}
}

func TestIdentityChangesKeys(t *testing.T) {
	tokens := seqTokens(48, 7)
	base := promptKeys(t, tokens, 16, Identity{})
	for name, id := range map[string]Identity{
		"lora":  {LoRAName: "sql-adapter"},
		"lora2": {LoRAName: "chat-adapter"},
		"salt":  {CacheSalt: "tenant-a"},
		"mm":    {MM: []MMItem{{ID: "img", Offset: 20, Length: 8}}},
	} {
		k := promptKeys(t, tokens, 16, id)
		for i := range k {
			// Keys chain, so a difference in block b reaches every later block; a multimodal
			// item in block 1 leaves block 0 alone.
			wantSame := name == "mm" && i == 0
			if (k[i] == base[i]) != wantSame {
				t.Errorf("%s block %d: same as plain = %v, want %v", name, i, k[i] == base[i], wantSame)
			}
		}
	}
	l1 := promptKeys(t, tokens, 16, Identity{LoRAName: "sql-adapter"})
	l2 := promptKeys(t, tokens, 16, Identity{LoRAName: "chat-adapter"})
	if l1[0] == l2[0] {
		t.Error("different adapters gave equal keys")
	}
}

func TestNextKeyChainEqualsPromptKeys(t *testing.T) {
	tokens := seqTokens(80, 100)
	id := Identity{LoRAName: "L", CacheSalt: "S", MM: []MMItem{{ID: "late", Offset: 50, Length: 5}, {ID: "img", Offset: 4, Length: 20}}}
	want := promptKeys(t, tokens, 16, id)
	if err := id.Normalize(); err != nil {
		t.Fatal(err)
	}
	parent := RootKey
	for b := range want {
		parent = NextKey(parent, tokens[b*16:(b+1)*16], id.BlockExtras(nil, b, 16))
		if parent != want[b] {
			t.Fatalf("block %d: NextKey chain %x, AppendPromptKeys %x", b, parent, want[b])
		}
	}
}

func TestBlockExtrasOrderAndMMOffsets(t *testing.T) {
	id := Identity{LoRAName: "L", CacheSalt: "S", MM: []MMItem{{ID: "b", Offset: 30, Length: 2}, {ID: "a", Offset: 4, Length: 20}}}
	if err := id.Normalize(); err != nil {
		t.Fatal(err)
	}
	want := []Extras{
		{String("L"), MM("a", 4), String("S")},
		{String("L"), MM("a", -12), MM("b", 14)},
		{String("L")},
	}
	for b, w := range want {
		if got := id.BlockExtras(nil, b, 16); !got.Equal(w) {
			t.Errorf("block %d extras %v, want %v", b, got, w)
		}
	}
	plain := Identity{}
	if got := plain.BlockExtras(nil, 0, 16); len(got) != 0 {
		t.Errorf("plain block extras %v, want none", got)
	}
	for _, bad := range []Identity{
		{MM: []MMItem{{ID: "x", Offset: 0, Length: 0}}},
		{MM: []MMItem{{ID: "x", Offset: -1, Length: 3}}},
		{MM: []MMItem{{ID: "x", Offset: 0, Length: 10}, {ID: "y", Offset: 5, Length: 10}}},
	} {
		if err := bad.Normalize(); err == nil {
			t.Errorf("identity %+v accepted", bad)
		}
		if _, err := AppendPromptKeys(nil, seqTokens(32, 0), 16, bad); err == nil {
			t.Errorf("AppendPromptKeys accepted %+v", bad)
		}
	}
}

// The index re-keys a BlockStored from its extra_keys (or, from older engines, lora_name alone);
// that must give the keys the request path computes from the whole prompt.
func TestExtrasFromEventAgreesWithRequest(t *testing.T) {
	tokens := seqTokens(64, 9)
	id := Identity{LoRAName: "L", CacheSalt: "S", MM: []MMItem{{ID: "img", Offset: 10, Length: 12}}}
	want := promptKeys(t, tokens, 16, id)
	_ = id.Normalize()
	// What vLLM ≥ 0.17 puts in the event: one extras tuple per block.
	eventExtras := make([]Extras, 4)
	for b := range eventExtras {
		eventExtras[b] = id.BlockExtras(nil, b, 16)
	}
	// A BlockStored for blocks 2..3 whose parent (block 1) the index already knows.
	parent := want[1]
	for i := 0; i < 2; i++ {
		ex, err := ExtrasFromEvent(nil, "L", eventExtras[2:], i)
		if err != nil {
			t.Fatal(err)
		}
		parent = NextKey(parent, tokens[(2+i)*16:(3+i)*16], ex)
		if parent != want[2+i] {
			t.Fatalf("event block %d re-keyed to %x, request key %x", 2+i, parent, want[2+i])
		}
	}
	if _, err := ExtrasFromEvent(nil, "", eventExtras[:1], 1); err == nil {
		t.Error("out-of-range extra_keys index accepted")
	}

	// An older engine sends lora_name without extra_keys: a text-only LoRA request must match.
	loraOnly := promptKeys(t, tokens, 16, Identity{LoRAName: "L"})
	parent = RootKey
	var scratch Extras
	for b := 0; b < 4; b++ {
		ex, err := ExtrasFromEvent(scratch, "L", nil, b)
		if err != nil {
			t.Fatal(err)
		}
		parent = NextKey(parent, tokens[b*16:(b+1)*16], ex)
		if parent != loraOnly[b] {
			t.Fatalf("lora_name-only block %d mismatch", b)
		}
	}
	ex, _ := ExtrasFromEvent(nil, "", nil, 0)
	if len(ex) != 0 {
		t.Errorf("no lora_name, no extra_keys gave extras %v", ex)
	}
}

func TestExtrasDigestIsDelimited(t *testing.T) {
	pairs := [][2]Extras{
		{{String("ab"), String("c")}, {String("a"), String("bc")}},
		{{String("x")}, {MM("x", 0)}},
		{{MM("x", 1)}, {MM("x", 2)}},
		{{String("")}, nil},
		{{{Kind: ExtraBytes, Bytes: []byte("x")}}, {String("x")}},
	}
	for _, p := range pairs {
		if ExtrasDigest(p[0]) == ExtrasDigest(p[1]) {
			t.Errorf("extras %v and %v have the same digest", p[0], p[1])
		}
	}
	if ExtrasDigest(nil) != 0 || ExtrasDigest(Extras{}) != 0 {
		t.Error("no extras must digest to 0")
	}
}

func TestLargeBlocksStreamSameBytes(t *testing.T) {
	tokens := seqTokens(1000, 5)
	buf := make([]byte, 16+4*len(tokens))
	binary.LittleEndian.PutUint64(buf, uint64(RootKey))
	for i, v := range tokens {
		binary.LittleEndian.PutUint32(buf[16+4*i:], v)
	}
	if got, want := NextKey(RootKey, tokens, nil), Key(xxh3.Hash(buf)); got != want {
		t.Errorf("streamed key %x, one-shot %x", got, want)
	}
}

func TestRouterKeysDoNotAllocate(t *testing.T) {
	tokens := seqTokens(4096, 0)
	dst := make([]Key, 0, 256)
	lora := Identity{LoRAName: "adapter", CacheSalt: "salt"}
	for name, id := range map[string]Identity{"plain": {}, "lora+salt": lora} {
		allocs := testing.AllocsPerRun(20, func() {
			var err error
			if dst, err = AppendPromptKeys(dst[:0], tokens, 16, id); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: AppendPromptKeys allocates %.0f times per call", name, allocs)
		}
	}
	ex := Extras{String("adapter"), MM("img", -3)}
	if a := testing.AllocsPerRun(50, func() { _ = NextKey(RootKey, tokens[:16], ex) }); a != 0 {
		t.Errorf("NextKey allocates %.0f times", a)
	}
}

// At the stack buffer's boundaries (one-shot below, streamed above) a key must be the
// one-shot XXH3 of the same bytes, also from a KeyHasher whose buffer holds an earlier block.
func TestKeyHasherReuseAtBufferBoundaries(t *testing.T) {
	for _, n := range []int{1, 16, stackTokens, stackTokens + 1, 3*stackTokens + 7} {
		toks := make([]uint32, n)
		for i := range toks {
			toks[i] = uint32(i*2654435761) % 151936
		}
		raw := make([]byte, 16+4*n)
		binary.LittleEndian.PutUint64(raw[0:], uint64(RootKey))
		for i, tk := range toks {
			binary.LittleEndian.PutUint32(raw[16+4*i:], tk)
		}
		want := Key(xxh3.Hash(raw))
		if got := NextKey(RootKey, toks, nil); got != want {
			t.Errorf("%d tokens: NextKey = %x, want the one-shot hash %x", n, got, want)
		}
		var h KeyHasher
		h.Next(RootKey, toks[:n/2], nil) // dirty the buffer first
		if got := h.Next(RootKey, toks, nil); got != want {
			t.Errorf("%d tokens: a reused KeyHasher = %x, want %x", n, got, want)
		}
	}
}
