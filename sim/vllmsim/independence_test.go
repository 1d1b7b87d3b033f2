package vllmsim

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The sim's encoder and hasher must not be the router's: the package (tests aside) depends on
// neither router/kvwire nor router/blockkey, so agreeing with them and with the vectors is a
// real cross-check.
func TestIndependentOfRouterCodecs(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/kvroute/kvroute/router/") {
			t.Errorf("sim/vllmsim depends on %s; the simulator's codecs must be its own", pkg)
		}
	}
	if !strings.Contains(string(out), "github.com/vmihailenco/msgpack/v5") {
		t.Errorf("go list -deps lists no msgpack library; output:\n%s", out)
	}
}

type vectorBlock struct {
	Index      int      `json:"index"`
	TokenRange [2]int   `json:"token_range"`
	ExtraKeys  []string `json:"extra_keys"`
	HashHex    string   `json:"hash_hex"`
	WireInt    uint64   `json:"wire_int"`
	Serialized string   `json:"serialized_input_hex"`
}

// The sim's hasher gives the spec's vectors byte for byte: serialized input, digest and wire int
// of every block of every sequence, for all four algorithms, and NONE_HASH for several seeds.
func TestBlockHashesMatchVLLMVectors(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/vllm/vllm-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vec struct {
		Params struct {
			Seed      string `json:"PYTHONHASHSEED"`
			BlockSize int    `json:"block_size"`
		} `json:"params"`
		NoneHash map[string]struct {
			Serialized string `json:"serialized_seed_hex"`
			Hash       string `json:"none_hash_hex"`
		} `json:"none_hash"`
		Sequences map[string]struct {
			Request struct {
				Tokens    []uint32 `json:"tokens"`
				CacheSalt string   `json:"cache_salt"`
			} `json:"request"`
			BlockSize int                      `json:"block_size"`
			Algos     map[string][]vectorBlock `json:"algos"`
		} `json:"sequences"`
		OtherSHA  map[string]string `json:"none_hash_other_seeds_sha256"`
		OtherCBOR map[string]string `json:"none_hash_other_seeds_sha256_cbor"`
	}
	if err := json.Unmarshal(raw, &vec); err != nil {
		t.Fatal(err)
	}
	if len(vec.NoneHash) != 4 || len(vec.Sequences) < 4 {
		t.Fatalf("vectors: %d none hashes, %d sequences", len(vec.NoneHash), len(vec.Sequences))
	}
	blocks := 0
	for algo, nh := range vec.NoneHash {
		h, err := newBlockHasher(algo, vec.Params.Seed)
		if err != nil {
			t.Fatal(err)
		}
		if in, _ := h.serialize(vec.Params.Seed); hex.EncodeToString(in) != nh.Serialized {
			t.Errorf("%s: seed serialized %x, want %s", algo, in, nh.Serialized)
		}
		if got := hex.EncodeToString(h.none); got != nh.Hash {
			t.Errorf("%s: NONE_HASH %s, want %s", algo, got, nh.Hash)
		}
		for name, seq := range vec.Sequences {
			id := simIdentity{CacheSalt: seq.Request.CacheSalt}
			var parent []byte
			for _, b := range seq.Algos[algo] {
				toks := seq.Request.Tokens[b.TokenRange[0]:b.TokenRange[1]]
				extras := id.blockExtras(b.Index)
				if strings.Join(extras, "\x00") != strings.Join(b.ExtraKeys, "\x00") || (extras == nil) != (b.ExtraKeys == nil) {
					t.Errorf("%s/%s block %d: extras %q, want %q", algo, name, b.Index, extras, b.ExtraKeys)
				}
				p := parent
				if p == nil {
					p = h.none
				}
				in, err := h.serialize(blockInput{parent: p, tokens: toks, extras: extras})
				if err != nil || (b.Serialized != "" && hex.EncodeToString(in) != b.Serialized) {
					t.Errorf("%s/%s block %d: serialized %x (%v)\nwant %s", algo, name, b.Index, in, err, b.Serialized)
				}
				d, err := h.block(parent, toks, extras)
				if err != nil || hex.EncodeToString(d) != b.HashHex || wireHash(d) != b.WireInt {
					t.Errorf("%s/%s block %d: hash %x wire %d (%v), want %s %d", algo, name, b.Index, d, wireHash(d), err, b.HashHex, b.WireInt)
				}
				parent = d
				blocks++
			}
		}
	}
	for algo, seeds := range map[string]map[string]string{"sha256": vec.OtherSHA, "sha256_cbor": vec.OtherCBOR} {
		for seed, want := range seeds {
			h, err := newBlockHasher(algo, seed)
			if err != nil || hex.EncodeToString(h.none) != want {
				t.Errorf("%s seed %q: NONE_HASH %x (%v), want %s", algo, seed, h.none, err, want)
			}
		}
	}
	if blocks < 40 {
		t.Errorf("only %d vector blocks checked", blocks)
	}
}

// The sim's encoder, given each shape's decoded content, writes the bytes vLLM's own event
// classes wrote through msgspec (testdata/vllm/vllm-batch-shapes.json).
func TestEncoderMatchesBatchShapes(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/vllm/vllm-batch-shapes.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Shapes map[string]struct {
			Hex     string          `json:"hex"`
			Decoded json.RawMessage `json:"decoded"`
		} `json:"shapes"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Shapes) != 3 {
		t.Fatalf("%d shapes in the file, want E1, E2, E3", len(file.Shapes))
	}
	for name, sh := range file.Shapes {
		t.Run(name, func(t *testing.T) {
			shape, err := parseEventShape(name)
			if err != nil {
				t.Fatal(err)
			}
			b := batchFromDecoded(t, sh.Decoded)
			got, err := newEventEncoder().encode(b, shape)
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(got) != sh.Hex {
				t.Errorf("%s\n got %x\nwant %s", name, got, sh.Hex)
			}
		})
	}
	for alias, want := range map[string]eventShape{"array": shapeE1, "map": shapeE3, "e2": shapeE2} {
		if got, err := parseEventShape(alias); err != nil || got != want {
			t.Errorf("layout %q: %v %v, want %v", alias, got, err, want)
		}
	}
	if _, err := parseEventShape("E4"); err == nil {
		t.Error("layout E4 accepted")
	}
}

// batchFromDecoded reads a batch from its plain-data form (array or map batch, array or map
// events) into the encoder's input; JSON null is None.
func batchFromDecoded(t *testing.T, raw json.RawMessage) *wireBatch {
	t.Helper()
	var top any
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	var ts, evs, rank any
	switch x := top.(type) {
	case []any:
		ts, evs, rank = x[0], x[1], x[2]
	case map[string]any:
		ts, evs, rank = x["ts"], x["events"], x["data_parallel_rank"]
	}
	b := &wireBatch{ts: ts.(float64), rank: optI(rank)}
	storedKeys := []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
		"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedKeys := []string{"block_hashes", "medium", "group_idx"}
	for _, e := range evs.([]any) {
		f := map[string]any{}
		var tag string
		switch x := e.(type) {
		case []any:
			tag = x[0].(string)
			keys := storedKeys
			if tag == "BlockRemoved" {
				keys = removedKeys
			}
			for i, v := range x[1:] {
				f[keys[i]] = v
			}
		case map[string]any:
			tag = x["type"].(string)
			f = x
		}
		w := wireEvent{}
		switch tag {
		case "BlockStored":
			w.kind = evStored
			for _, tk := range f["token_ids"].([]any) {
				w.tokens = append(w.tokens, uint32(tk.(float64)))
			}
			w.blockSize = int64(f["block_size"].(float64))
			w.loraID, w.medium, w.loraName = optI(f["lora_id"]), optS(f["medium"]), optS(f["lora_name"])
			if p := optI(f["parent_block_hash"]); p != nil {
				u := uint64(*p)
				w.parent = &u
			}
			if ek, ok := f["extra_keys"].([]any); ok {
				w.hasExtras = true
				for _, k := range ek {
					var ks []string
					for _, s := range asSlice(k) {
						ks = append(ks, s.(string))
					}
					w.extraKeys = append(w.extraKeys, ks)
				}
			}
			w.groupIdx, w.specKind, w.specWindow = optI(f["group_idx"]), optS(f["kv_cache_spec_kind"]), optI(f["kv_cache_spec_sliding_window"])
		case "BlockRemoved":
			w.kind = evRemoved
			w.medium, w.groupIdx = optS(f["medium"]), optI(f["group_idx"])
		case "AllBlocksCleared":
			w.kind = evCleared
		default:
			t.Fatalf("unknown event %q", tag)
		}
		for _, h := range asSlice(f["block_hashes"]) {
			w.hashes = append(w.hashes, uint64(h.(float64)))
		}
		b.events = append(b.events, w)
	}
	return b
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func optI(v any) *int64 {
	if f, ok := v.(float64); ok {
		i := int64(f)
		return &i
	}
	return nil
}

func optS(v any) *string {
	if s, ok := v.(string); ok {
		return &s
	}
	return nil
}
