package blockkey

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
)

const vectorsPath = "../../testdata/vllm/vllm-vectors.json"

type vecBlock struct {
	Index         int               `json:"index"`
	TokenRange    [2]int            `json:"token_range"`
	ExtraKeys     []json.RawMessage `json:"extra_keys"`
	HashHex       string            `json:"hash_hex"`
	WireInt       json.Number       `json:"wire_int"`
	WireIntHex    string            `json:"wire_int_hex"`
	SerializedHex *string           `json:"serialized_input_hex"`
}

type vecSequence struct {
	Request   map[string]json.RawMessage `json:"request"`
	BlockSize int                        `json:"block_size"`
	Algos     map[string][]vecBlock      `json:"algos"`
}

type vecNone struct {
	SeedString    string `json:"seed_string"`
	SerializedHex string `json:"serialized_seed_hex"`
	NoneHashHex   string `json:"none_hash_hex"`
}

type vectors struct {
	NoneHash          map[string]vecNone     `json:"none_hash"`
	Sequences         map[string]vecSequence `json:"sequences"`
	OtherSeedsSHA256  map[string]string      `json:"none_hash_other_seeds_sha256"`
	OtherSeedsSHACBOR map[string]string      `json:"none_hash_other_seeds_sha256_cbor"`
	Params            struct {
		Seed string `json:"PYTHONHASHSEED"`
	} `json:"params"`
}

func loadVectors(t testing.TB) vectors {
	t.Helper()
	f, err := os.Open(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.UseNumber() // wire ints exceed float64's exact range
	var v vectors
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	if len(v.Sequences) == 0 || len(v.NoneHash) != 4 {
		t.Fatalf("vectors file looks wrong: %d sequences, %d none hashes", len(v.Sequences), len(v.NoneHash))
	}
	return v
}

// identityOf builds the identity a vector request describes; an unknown request field fails the
// test rather than being silently ignored.
func identityOf(t *testing.T, req map[string]json.RawMessage) ([]uint32, Identity) {
	t.Helper()
	var tokens []uint32
	var id Identity
	for k, raw := range req {
		var err error
		switch k {
		case "tokens":
			err = json.Unmarshal(raw, &tokens)
		case "cache_salt":
			err = json.Unmarshal(raw, &id.CacheSalt)
		case "lora_name":
			err = json.Unmarshal(raw, &id.LoRAName)
		default:
			t.Fatalf("vector request field %q not understood by this test", k)
		}
		if err != nil {
			t.Fatalf("request field %s: %v", k, err)
		}
	}
	return tokens, id
}

// extrasOfJSON turns a vector's extra_keys (null, or a list of str / [str, int]) into Extras.
func extrasOfJSON(t *testing.T, items []json.RawMessage) Extras {
	t.Helper()
	var out Extras
	for _, raw := range items {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			out = append(out, String(s))
			continue
		}
		var pair []json.RawMessage
		if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
			t.Fatalf("extra key %s not understood", raw)
		}
		var id string
		var off int64
		if json.Unmarshal(pair[0], &id) != nil || json.Unmarshal(pair[1], &off) != nil {
			t.Fatalf("extra key %s not understood", raw)
		}
		out = append(out, MM(id, off))
	}
	return out
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestNoneHashVectors(t *testing.T) {
	v := loadVectors(t)
	for name, want := range v.NoneHash {
		algo, err := ParseAlgo(name)
		if err != nil {
			t.Fatal(err)
		}
		h, err := NewEngineHasher(algo, want.SeedString)
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(h.NoneHash()); got != want.NoneHashHex {
			t.Errorf("%s NONE_HASH = %s, want %s", name, got, want.NoneHashHex)
		}
		var in []byte
		if algo.cbor() {
			h.buf.Reset()
			if err := appendCBORStr(&h.buf, want.SeedString); err != nil {
				t.Fatal(err)
			}
			in = h.buf.Bytes()
		} else if in, err = appendPickleStr(nil, want.SeedString); err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(in); got != want.SerializedHex {
			t.Errorf("%s serialized seed = %s, want %s", name, got, want.SerializedHex)
		}
	}
	for algo, seeds := range map[Algo]map[string]string{AlgoSHA256: v.OtherSeedsSHA256, AlgoSHA256CBOR: v.OtherSeedsSHACBOR} {
		if len(seeds) == 0 {
			t.Fatalf("no other-seed vectors for %s", algo)
		}
		for seed, want := range seeds {
			h, err := NewEngineHasher(algo, seed)
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(h.NoneHash()); got != want {
				t.Errorf("%s seed %q NONE_HASH = %s, want %s", algo, seed, got, want)
			}
		}
	}
}

func TestBlockHashVectors(t *testing.T) {
	v := loadVectors(t)
	checked := 0
	for seqName, seq := range v.Sequences {
		tokens, id := identityOf(t, seq.Request)
		for algoName, blocks := range seq.Algos {
			t.Run(seqName+"/"+algoName, func(t *testing.T) {
				algo, err := ParseAlgo(algoName)
				if err != nil {
					t.Fatal(err)
				}
				h, err := NewEngineHasher(algo, v.Params.Seed)
				if err != nil {
					t.Fatal(err)
				}
				got, err := h.HashPrompt(tokens, seq.BlockSize, id)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(blocks) {
					t.Fatalf("%d blocks, want %d", len(got), len(blocks))
				}
				for _, b := range blocks {
					if hx := hex.EncodeToString(got[b.Index]); hx != b.HashHex {
						t.Errorf("block %d hash %s, want %s", b.Index, hx, b.HashHex)
					}
					wantWire, err := strconv.ParseUint(b.WireInt.String(), 10, 64)
					if err != nil {
						t.Fatal(err)
					}
					if w := WireInt(got[b.Index]); w != wantWire || fmt.Sprintf("%016x", w) != b.WireIntHex {
						t.Errorf("block %d wire int %d, want %d (%s)", b.Index, w, wantWire, b.WireIntHex)
					}
					wantExtras := extrasOfJSON(t, b.ExtraKeys)
					if ex := id.BlockExtras(nil, b.Index, seq.BlockSize); !ex.Equal(wantExtras) {
						t.Errorf("block %d extras %v, want %v", b.Index, ex, wantExtras)
					}
					if b.SerializedHex != nil {
						var parent []byte
						if b.Index > 0 {
							parent = got[b.Index-1]
						}
						in, err := h.Serialize(parent, tokens[b.TokenRange[0]:b.TokenRange[1]], wantExtras)
						if err != nil {
							t.Fatal(err)
						}
						if hx := hex.EncodeToString(in); hx != *b.SerializedHex {
							t.Errorf("block %d serialized\n got %s\nwant %s", b.Index, hx, *b.SerializedHex)
						}
					}
					checked++
				}
			})
		}
	}
	if checked == 0 {
		t.Fatal("no block vectors checked")
	}
}
