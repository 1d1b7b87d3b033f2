package kvwire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
)

const vectorsPath = "../../testdata/vllm/vllm-vectors.json"

type vecMessage struct {
	Label  string            `json:"label"`
	Frames map[string]string `json:"zmq_frames_hex"`
	// Decoded is the payload as Python decodes it: events as dicts (map layout) or lists, raw
	// bytes as {"__bytes_hex__": ".."}.
	Decoded json.RawMessage `json:"decoded"`
}

type vecFile struct {
	KVEvents struct {
		Sets map[string][]vecMessage `json:"sets"`
	} `json:"kv_events"`
	Replay struct {
		Request []string `json:"request_from_DEALER_frames_hex"`
		End     []string `json:"end_marker_DEALER_receives_hex"`
	} `json:"replay_protocol"`
}

func loadVectors(t testing.TB) vecFile {
	t.Helper()
	raw, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	var v vecFile
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.KVEvents.Sets) != 4 {
		t.Fatalf("want 4 event sets, got %d", len(v.KVEvents.Sets))
	}
	return v
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func setLayout(t testing.TB, name string) Layout {
	switch {
	case strings.HasPrefix(name, "map"):
		return LayoutMap
	case strings.HasPrefix(name, "array"):
		return LayoutArray
	}
	t.Fatalf("set %q: layout not in its name", name)
	return 0
}

// pyShape renders a decoded batch the way the vectors file writes Python's decoding of it.
func pyShape(b *Batch, layout Layout) any {
	hash := func(h Hash) any {
		if h.IsBytes() {
			return map[string]any{"__bytes_hex__": hex.EncodeToString(h.Bytes)}
		}
		return h.Int
	}
	hashes := func(hs []Hash) []any {
		out := make([]any, len(hs))
		for i, h := range hs {
			out[i] = hash(h)
		}
		return out
	}
	opt := func(ok bool, v any) any {
		if ok {
			return v
		}
		return nil
	}
	events := make([]any, len(b.Events))
	for i, e := range b.Events {
		type f struct {
			k   string
			v   any
			req bool
		}
		var fields []f
		// late renders the fields newer than the array layout (locality, ownership,
		// session_id): in an array up to the last one set, in a map each one set.
		late := func(vals ...Opt[string]) []f {
			names := []string{"locality", "ownership", "session_id"}
			n := 0
			for j, v := range vals {
				if v.OK {
					n = j + 1
				}
			}
			var out []f
			for j, v := range vals[:n] {
				out = append(out, f{names[j], opt(v.OK, v.V), v.OK || layout != LayoutMap})
			}
			return out
		}
		switch e.Type {
		case EventBlockStored:
			s := e.Stored
			var parent any
			if s.ParentBlockHash.OK {
				parent = hash(s.ParentBlockHash.V)
			}
			var ek any
			if s.ExtraKeys.OK {
				list := make([]any, len(s.ExtraKeys.V))
				for j, ex := range s.ExtraKeys.V {
					if len(ex) > 0 {
						list[j] = extrasJSON(ex)
					}
				}
				ek = list
			}
			fields = []f{
				{"block_hashes", hashes(s.BlockHashes), true}, {"parent_block_hash", parent, true},
				{"token_ids", s.TokenIDs, true}, {"block_size", s.BlockSize, true},
				{"lora_id", opt(s.LoRAID.OK, s.LoRAID.V), true}, {"medium", opt(s.Medium.OK, s.Medium.V), true},
				{"lora_name", opt(s.LoRAName.OK, s.LoRAName.V), true}, {"extra_keys", ek, s.ExtraKeys.OK},
				{"group_idx", opt(s.GroupIdx.OK, s.GroupIdx.V), s.GroupIdx.OK},
				{"kv_cache_spec_kind", opt(s.KVCacheSpecKind.OK, s.KVCacheSpecKind.V), s.KVCacheSpecKind.OK},
				{"kv_cache_spec_sliding_window", opt(s.KVCacheSpecSlidingWindow.OK, s.KVCacheSpecSlidingWindow.V), s.KVCacheSpecSlidingWindow.OK},
			}
			fields = append(fields, late(s.Locality, s.Ownership, s.SessionID)...)
		case EventBlockRemoved:
			r := e.Removed
			fields = []f{
				{"block_hashes", hashes(r.BlockHashes), true}, {"medium", opt(r.Medium.OK, r.Medium.V), true},
				{"group_idx", opt(r.GroupIdx.OK, r.GroupIdx.V), r.GroupIdx.OK},
			}
			fields = append(fields, late(r.Locality, r.Ownership)...)
		}
		if layout == LayoutMap {
			m := map[string]any{"type": e.Tag}
			for _, fl := range fields {
				if fl.req {
					m[fl.k] = fl.v
				}
			}
			events[i] = m
		} else {
			a := []any{e.Tag}
			for _, fl := range fields {
				a = append(a, fl.v)
			}
			events[i] = a
		}
	}
	return []any{b.TS, events, opt(b.DataParallelRank.OK, b.DataParallelRank.V)}
}

func jsonValue(t testing.TB, v any) any {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var out any
	if err := dec.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestVectorPayloadsDecodeAndReencode(t *testing.T) {
	v := loadVectors(t)
	d := NewDecoder()
	enc := NewEncoder()
	checked := 0
	for setName, msgs := range v.KVEvents.Sets {
		layout := setLayout(t, setName)
		for _, m := range msgs {
			t.Run(setName+"/"+m.Label, func(t *testing.T) {
				frames := [][]byte{unhex(t, m.Frames["topic"]), unhex(t, m.Frames["seq"]), unhex(t, m.Frames["payload"])}
				msg, err := ParseFrames(frames)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(msg.Frames()[1], frames[1]) {
					t.Errorf("seq %d does not re-frame to %x", msg.Seq, frames[1])
				}
				b, err := d.DecodeBatch(msg.Payload)
				if err != nil {
					t.Fatal(err)
				}
				if b.Layout != layout {
					t.Errorf("layout %v, want %v", b.Layout, layout)
				}
				want := jsonValue(t, m.Decoded)
				if got := jsonValue(t, pyShape(b, layout)); !reflect.DeepEqual(got, want) {
					t.Errorf("decoded\n got %v\nwant %v", got, want)
				}
				out, err := enc.AppendBatch(nil, b, layout)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(out, msg.Payload) {
					t.Errorf("re-encoded payload differs\n got %x\nwant %x", out, msg.Payload)
				}
				checked++
			})
		}
	}
	if checked != 16 {
		t.Fatalf("checked %d payloads, want 16", checked)
	}
}

func TestVectorHashesAgreeAcrossModes(t *testing.T) {
	v := loadVectors(t)
	d := NewDecoder()
	for _, pair := range [][2]string{
		{"map_v0.24plus__int_hashes", "map_v0.24plus__bytes_hashes"},
		{"array_v0.22_v0.23__int_hashes", "array_v0.22_v0.23__bytes_hashes"},
	} {
		ints, raws := v.KVEvents.Sets[pair[0]], v.KVEvents.Sets[pair[1]]
		for i := range ints {
			collect := func(m vecMessage) []uint64 {
				b, err := d.DecodeBatch(unhex(t, m.Frames["payload"]))
				if err != nil {
					t.Fatal(err)
				}
				var out []uint64
				for _, e := range b.Events {
					for _, h := range append(append([]Hash(nil), e.Stored.BlockHashes...), e.Removed.BlockHashes...) {
						out = append(out, h.Uint64())
					}
					if e.Stored.ParentBlockHash.OK {
						out = append(out, e.Stored.ParentBlockHash.V.Uint64())
					}
				}
				return out
			}
			a, b := collect(ints[i]), collect(raws[i])
			if !reflect.DeepEqual(a, b) {
				t.Errorf("%s: int hashes %v, bytes hashes' Uint64 %v", ints[i].Label, a, b)
			}
		}
	}
}

// The index re-keys BlockStored events; the vectors' B-tail event (parent = A's block 1) must
// give the router keys of B computed from the whole prompt.
func TestVectorEventsRekeyToPromptKeys(t *testing.T) {
	v := loadVectors(t)
	d := NewDecoder()
	msgs := v.KVEvents.Sets["map_v0.24plus__int_hashes"]
	bA, err := d.DecodeBatch(unhex(t, msgs[0].Frames["payload"]))
	if err != nil {
		t.Fatal(err)
	}
	sa := bA.Events[0].Stored
	keysA, err := sa.AppendRouterKeys(nil, blockkey.RootKey)
	if err != nil {
		t.Fatal(err)
	}
	wantA, _ := blockkey.AppendPromptKeys(nil, sa.TokenIDs, int(sa.BlockSize), blockkey.Identity{})
	if !reflect.DeepEqual(keysA, wantA) {
		t.Fatalf("A event keys %v, prompt keys %v", keysA, wantA)
	}
	tokensA := append([]uint32(nil), sa.TokenIDs...)
	bB, err := d.DecodeBatch(unhex(t, msgs[1].Frames["payload"]))
	if err != nil {
		t.Fatal(err)
	}
	sb := bB.Events[0].Stored
	keysB, err := sb.AppendRouterKeys(nil, keysA[1])
	if err != nil {
		t.Fatal(err)
	}
	wantB, _ := blockkey.AppendPromptKeys(nil, append(tokensA[:32:32], sb.TokenIDs...), 16, blockkey.Identity{})
	if !reflect.DeepEqual(keysB, wantB[2:]) {
		t.Fatalf("B tail keys %v, prompt keys %v", keysB, wantB[2:])
	}
}

func TestVectorReplayFrames(t *testing.T) {
	v := loadVectors(t)
	req := ReplayRequest(5)
	if len(req) != len(v.Replay.Request) {
		t.Fatalf("replay request has %d frames, want %d", len(req), len(v.Replay.Request))
	}
	for i, f := range v.Replay.Request {
		if hex.EncodeToString(req[i]) != f {
			t.Errorf("request frame %d = %x, want %s", i, req[i], f)
		}
	}
	id, seq, err := ParseReplayRequest(append([][]byte{[]byte("client")}, req...))
	if err != nil || seq != 5 || string(id) != "client" {
		t.Errorf("ParseReplayRequest = %q, %d, %v", id, seq, err)
	}
	end := ReplayEndFrames([]byte("client"))[1:] // the DEALER does not see the identity
	for i, f := range v.Replay.End {
		if hex.EncodeToString(end[i]) != f {
			t.Errorf("end frame %d = %x, want %s", i, end[i], f)
		}
	}
	for _, frames := range [][][]byte{end, end[1:], {{}, unhex(t, "ffffffffffffffff"), {}}} {
		m, isEnd, err := ParseReplayReply(frames)
		if err != nil || !isEnd || m.Seq != EndSeq {
			t.Errorf("end marker %x: end=%v seq=%x err=%v", frames, isEnd, m.Seq, err)
		}
	}
}
