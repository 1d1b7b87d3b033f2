package kvwire

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/engine"
)

// engineVectors is the format of testdata/<engine>/vectors.json (see the README there).
type engineVectors struct {
	Engine  string `json:"engine"`
	Vectors []struct {
		Name    string      `json:"name"`
		Payload [][2]string `json:"payload"`
		Want    struct {
			DPRank *int64      `json:"dp_rank"`
			Events []wantEvent `json:"events"`
		} `json:"want"`
	} `json:"vectors"`
	Frames struct {
		Publish   []string `json:"publish"`
		Replay    []string `json:"replay"`
		ReplayEnd []string `json:"replay_end"`
	} `json:"frames"`
}

type wantEvent struct {
	Type        string   `json:"type"`
	BlockHashes []int64  `json:"block_hashes"`
	Parent      *int64   `json:"parent"`
	TokenIDs    []uint32 `json:"token_ids"`
	BlockSize   int64    `json:"block_size"`
	Medium      string   `json:"medium"`
	CacheSalt   string   `json:"cache_salt"`
	SessionID   string   `json:"session_id"`
}

func loadEngineVectors(t *testing.T, kind engine.Kind) engineVectors {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "testdata", string(kind), "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v engineVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if v.Engine != string(kind) || len(v.Vectors) == 0 {
		t.Fatalf("vectors for %q hold engine %q and %d vectors", kind, v.Engine, len(v.Vectors))
	}
	return v
}

func hexJoin(t *testing.T, segs ...string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(segs, ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func signed(hs []Hash) []int64 {
	out := make([]int64, len(hs))
	for i, h := range hs {
		out[i] = int64(h.Int)
	}
	return out
}

func checkEvent(t *testing.T, i int, got *Event, w wantEvent) {
	t.Helper()
	if got.Type.String() != w.Type {
		t.Fatalf("event %d is %v, want %s", i, got.Type, w.Type)
	}
	switch got.Type {
	case EventBlockStored:
		s := &got.Stored
		if !slices.Equal(signed(s.BlockHashes), w.BlockHashes) || !slices.Equal(s.TokenIDs, w.TokenIDs) || s.BlockSize != w.BlockSize {
			t.Errorf("event %d: hashes %v tokens %v block size %d; want %v %v %d", i, signed(s.BlockHashes), s.TokenIDs, s.BlockSize,
				w.BlockHashes, w.TokenIDs, w.BlockSize)
		}
		if (w.Parent == nil) != !s.ParentBlockHash.OK || (w.Parent != nil && int64(s.ParentBlockHash.V.Int) != *w.Parent) {
			t.Errorf("event %d: parent %+v, want %v", i, s.ParentBlockHash, w.Parent)
		}
		if s.Medium.V != w.Medium || s.CacheSalt.V != w.CacheSalt || s.SessionID.V != w.SessionID {
			t.Errorf("event %d: medium %q salt %q session %q; want %q %q %q", i, s.Medium.V, s.CacheSalt.V, s.SessionID.V,
				w.Medium, w.CacheSalt, w.SessionID)
		}
		if err := s.CheckTokens(); err != nil {
			t.Errorf("event %d: %v", i, err)
		}
	case EventBlockRemoved:
		if r := &got.Removed; !slices.Equal(signed(r.BlockHashes), w.BlockHashes) || r.Medium.V != w.Medium {
			t.Errorf("event %d: removed %v medium %q; want %v %q", i, signed(r.BlockHashes), r.Medium.V, w.BlockHashes, w.Medium)
		}
	}
}

// reencoded are the vectors AppendEngineBatch writes back byte for byte: the current shape of
// each engine (the legacy, bigram and tagged-map SGLang shapes are read, never written).
var reencoded = map[string]Layout{
	"medium-seven-element-events": LayoutArray, "metadata-eighth-element": LayoutArray,
	"coalesced-store-and-remove": LayoutUnknown, "child-and-clear": LayoutUnknown,
}

func TestEngineVectors(t *testing.T) {
	for _, kind := range []engine.Kind{engine.SGLang, engine.TRTLLM} {
		vs := loadEngineVectors(t, kind)
		d := NewDecoderFor(kind)
		for _, v := range vs.Vectors {
			t.Run(string(kind)+"/"+v.Name, func(t *testing.T) {
				var segs []string
				for _, s := range v.Payload {
					segs = append(segs, s[0])
				}
				payload := hexJoin(t, segs...)
				b, err := d.DecodeBatch(payload)
				if err != nil {
					t.Fatal(err)
				}
				if w := v.Want.DPRank; (w == nil) != !b.DataParallelRank.OK || (w != nil && *w != b.DataParallelRank.V) {
					t.Errorf("rank %+v, want %v", b.DataParallelRank, w)
				}
				if len(b.Events) != len(v.Want.Events) {
					t.Fatalf("%d events, want %d", len(b.Events), len(v.Want.Events))
				}
				for i := range b.Events {
					checkEvent(t, i, &b.Events[i], v.Want.Events[i])
				}
				if layout, ok := reencoded[v.Name]; ok {
					out, err := NewEncoder().AppendEngineBatch(nil, b, kind, layout)
					if err != nil || hex.EncodeToString(out) != hex.EncodeToString(payload) {
						t.Errorf("re-encoded %x (%v), want %x", out, err, payload)
					}
				}
			})
		}
	}
}

// TestVLLMDecoderRefusesSGLangMetadata: vLLM's array position 7 is lora_name, a string, so an
// SGLang stream read as vLLM's fails loudly instead of mis-keying; read as SGLang's it decodes.
func TestVLLMDecoderRefusesSGLangMetadata(t *testing.T) {
	vs := loadEngineVectors(t, engine.SGLang)
	for _, v := range vs.Vectors {
		if v.Name != "metadata-eighth-element" {
			continue
		}
		var segs []string
		for _, s := range v.Payload {
			segs = append(segs, s[0])
		}
		if _, err := NewDecoder().DecodeBatch(hexJoin(t, segs...)); err == nil {
			t.Fatal("vLLM's decoder read SGLang's metadata map as lora_name")
		}
		return
	}
	t.Fatal("vector metadata-eighth-element missing")
}

// TestSGLangSaltKeysBlockZero: a salted root page is keyed as the router keys a request with
// that cache_salt, and an unsalted one as a request without; a child page inherits the salt
// through its parent, not through its own metadata.
func TestSGLangSaltKeysBlockZero(t *testing.T) {
	toks := []uint32{100, 101, 102, 103}
	salted := BlockStored{BlockHashes: []Hash{IntHash(1)}, TokenIDs: toks, BlockSize: 4, CacheSalt: Some("tenant-a")}
	got, err := salted.AppendRouterKeys(nil, blockkey.RootKey)
	if err != nil {
		t.Fatal(err)
	}
	want, err := blockkey.AppendPromptKeys(nil, toks, 4, blockkey.Identity{CacheSalt: "tenant-a"})
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := blockkey.AppendPromptKeys(nil, toks, 4, blockkey.Identity{})
	if got[0] != want[0] || got[0] == plain[0] {
		t.Errorf("salted root key %v, want the salted request's %v (unsalted %v)", got[0], want[0], plain[0])
	}
	child := salted
	child.ParentBlockHash = Some(IntHash(7))
	k, _ := child.AppendRouterKeys(nil, got[0])
	if k2, _ := (&BlockStored{BlockHashes: []Hash{IntHash(2)}, TokenIDs: toks, BlockSize: 4, ParentBlockHash: Some(IntHash(7))}).AppendRouterKeys(nil, got[0]); k[0] != k2[0] {
		t.Error("a child page's salt changed its key")
	}
}

func TestEngineFrames(t *testing.T) {
	for _, kind := range []engine.Kind{engine.SGLang, engine.TRTLLM} {
		fr := loadEngineVectors(t, kind).Frames
		frames := func(hexes []string) [][]byte {
			out := make([][]byte, len(hexes))
			for i, h := range hexes {
				if h == "PAYLOAD" {
					out[i] = []byte{0x93}
					continue
				}
				out[i] = hexJoin(t, h)
			}
			return out
		}
		m, err := ParseFrames(frames(fr.Publish))
		if err != nil || m.Seq != 5 || len(m.Payload) != 1 {
			t.Errorf("%s publish: %+v %v", kind, m, err)
		}
		r, end, err := ParseReplayReply(frames(fr.Replay))
		if err != nil || end || r.Seq != 5 || len(r.Payload) != 1 || string(r.Topic) != string(m.Topic) {
			t.Errorf("%s replay: %+v end %v %v (publish topic %q)", kind, r, end, err, m.Topic)
		}
		if _, end, err := ParseReplayReply(frames(fr.ReplayEnd)); err != nil || !end {
			t.Errorf("%s replay end: end %v %v", kind, end, err)
		}
	}
}
