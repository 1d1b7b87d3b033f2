package kvwire

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"testing"
)

// contractPath holds batches of vLLM's 2026 event contract with their frames; see
// testdata/vllm/README.md and the generator beside the file for the sources and commits read.
const contractPath = "../../testdata/vllm/kv-contract/vectors.json"

type contractCase struct {
	Name      string          `json:"name"`
	FramesHex []string        `json:"frames_hex"`
	Decoded   json.RawMessage `json:"decoded"`
}

func loadContract(t testing.TB) (cases map[string]contractCase, replay map[string][]string) {
	t.Helper()
	raw, err := os.ReadFile(contractPath)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Cases  []contractCase  `json:"cases"`
		Replay json.RawMessage `json:"replay"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	cases = map[string]contractCase{}
	for _, c := range f.Cases {
		cases[c.Name] = c
	}
	var r map[string]any
	_ = json.Unmarshal(f.Replay, &r)
	replay = map[string][]string{}
	for _, k := range []string{"request_hex", "reply_hex", "end_hex"} {
		for _, x := range r[k].([]any) {
			replay[k] = append(replay[k], x.(string))
		}
	}
	return cases, replay
}

func hexFrames(t testing.TB, hs []string) [][]byte {
	out := make([][]byte, len(hs))
	for i, h := range hs {
		out[i] = unhex(t, h)
	}
	return out
}

// Every batch of the contract decodes to what msgspec gives back for it and re-encodes to the
// same bytes; the fields the contract added (ownership, session_id) are read, unknown ones
// skipped, and 24-byte sequence frames carry the publisher id.
func TestVLLMEventContractVectors(t *testing.T) {
	cases, replay := loadContract(t)
	if len(cases) != 9 {
		t.Fatalf("%d cases, want 9", len(cases))
	}
	d, enc := NewDecoder(), NewEncoder()
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			m, err := ParseFrames(hexFrames(t, c.FramesHex))
			if err != nil {
				t.Fatal(err)
			}
			b, err := d.DecodeBatch(m.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if c.Decoded == nil { // not a batch msgspec writes itself (unknown fields added)
				return
			}
			if got, want := sameNumbers(jsonValue(t, pyBatch(b))), sameNumbers(jsonValue(t, c.Decoded)); !reflect.DeepEqual(got, want) {
				t.Errorf("decoded\n got %v\nwant %v", got, want)
			}
			out, err := enc.AppendBatchShape(nil, b, ShapeE3)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, m.Payload) {
				t.Errorf("re-encoded\n got %x\nwant %x", out, m.Payload)
			}
		})
	}

	b, err := d.DecodeBatch(unhex(t, cases["contract_wire_shape"].FramesHex[2]))
	if err != nil {
		t.Fatal(err)
	}
	st, rm := b.Events[0].Stored, b.Events[1].Removed
	if st.SessionID != Some("session") || st.Locality != Some("LOCAL") || st.Ownership.OK ||
		rm.Ownership != Some("kvcr") || rm.Medium != Some("CPU") || b.Events[2].Type != EventAllBlocksCleared {
		t.Errorf("contract batch read as %+v / %+v", st, rm)
	}

	b, err = d.DecodeBatch(unhex(t, cases["unknown_fields_ignored"].FramesHex[2]))
	if err != nil || len(b.Events) != 1 || b.Events[0].Type != EventBlockRemoved || b.Events[0].Removed.BlockHashes[0].Uint64() != 11 ||
		!b.DataParallelRank.OK || b.DataParallelRank.V != 0 {
		t.Errorf("unknown fields: %+v, %v", b, err)
	}

	live, err := ParseFrames(hexFrames(t, cases["snapshot_live_store"].FramesHex))
	if err != nil || !live.HasPublisher || live.Seq != 7 || live.Publisher[0] != 0xa0 || live.Publisher[15] != 0xaf {
		t.Fatalf("24-byte live frame: %+v, %v", live, err)
	}
	hb, _ := ParseFrames(hexFrames(t, cases["snapshot_heartbeat"].FramesHex))
	if b, err := d.DecodeBatch(hb.Payload); err != nil || len(b.Events) != 0 || hb.Seq != 8 || hb.Publisher != live.Publisher {
		t.Fatalf("heartbeat: %+v %v", hb, err)
	}
	rep, end, err := ParseReplayReply(hexFrames(t, replay["reply_hex"]))
	if err != nil || end || rep.Seq != 7 || rep.Publisher != live.Publisher || !bytes.Equal(rep.Payload, live.Payload) {
		t.Fatalf("replay reply: %+v end %v err %v", rep, end, err)
	}
	if _, end, err := ParseReplayReply(hexFrames(t, replay["end_hex"])); err != nil || !end {
		t.Fatalf("end marker: end %v err %v", end, err)
	}
	if _, seq, err := ParseReplayRequest(append([][]byte{[]byte("id")}, hexFrames(t, replay["request_hex"])...)); err != nil || seq != 7 {
		t.Fatalf("replay request: seq %d err %v", seq, err)
	}
}
