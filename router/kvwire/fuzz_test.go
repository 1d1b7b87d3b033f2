package kvwire

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func seedPayloads(f *testing.F) [][]byte {
	v := loadVectors(f)
	var out [][]byte
	for _, msgs := range v.KVEvents.Sets {
		for _, m := range msgs {
			out = append(out, unhex(f, m.Frames["payload"]))
		}
	}
	// The three batch shapes as vLLM's classes write them, and the full batch in each.
	out = append(out, shapePayloads(f)...)
	for _, shape := range []Shape{ShapeE1, ShapeE2, ShapeE3} {
		full, err := NewEncoder().AppendBatchShape(nil, fullBatch(), shape)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, full)
	}
	return out
}

// FuzzDecodeBatch: no panic on any input, and whatever decodes re-encodes to something that
// decodes to the same batch.
func FuzzDecodeBatch(f *testing.F) {
	for _, p := range seedPayloads(f) {
		f.Add(p)
	}
	d, d2, enc := NewDecoder(), NewDecoder(), NewEncoder()
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := d.DecodeBatch(payload)
		if err != nil {
			return
		}
		for _, e := range b.Events {
			if e.Type == EventUnknown {
				return // the encoder writes only the classes it knows
			}
		}
		layout := b.Layout
		if layout == LayoutUnknown {
			layout = LayoutMap
		}
		again, err := enc.appendBatch(nil, b, b.BatchLayout, layout) // a map batch of array events too
		if err != nil {
			t.Fatalf("decoded batch does not re-encode: %v", err)
		}
		b2, err := d2.DecodeBatch(again)
		if err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		b2.Layout = b.Layout
		if a, c := mustJSON(t, b), mustJSON(t, b2); a != c && b.TS == b.TS { // NaN ts never compares equal
			t.Fatalf("round trip changed the batch\n%s\n%s", a, c)
		}
	})
}

// FuzzParseFrames: frames split from one input at fuzzer-chosen points; no panic, and a parsed
// message re-frames to the same bytes. Seeds carry both sequence frames: 8 bytes, and 24 (seq and
// the 16-byte publisher id of an engine with a snapshot endpoint).
func FuzzParseFrames(f *testing.F) {
	pid := bytes.Repeat([]byte{0xa5}, PublisherIDLen)
	for i, p := range seedPayloads(f) {
		seq := binary.BigEndian.AppendUint64(nil, uint64(i))
		f.Add(append(append([]byte("kv@h@m"), seq...), p...), uint16(6), uint16(14))
		f.Add(append(append(append([]byte("kv@h@m"), seq...), pid...), p...), uint16(6), uint16(30))
	}
	f.Fuzz(func(t *testing.T, data []byte, a, b uint16) {
		i, j := min(int(a), len(data)), min(int(b), len(data))
		if i > j {
			i, j = j, i
		}
		frames := [][]byte{data[:i], data[i:j], data[j:]}
		if m, err := ParseFrames(frames); err == nil {
			got := m.Frames()
			for k := range got {
				if !bytes.Equal(got[k], frames[k]) {
					t.Fatalf("frame %d re-framed as %x, was %x", k, got[k], frames[k])
				}
			}
		}
		_, _, _ = ParseReplayReply(frames)
		_, _, _ = ParseReplayReply(frames[1:])
		_, _, _ = ParseReplayRequest(frames)
		if sn, err := ParseSnapshotReply(frames); err == nil {
			if again, err := ParseSnapshotReply(SnapshotReplyFrames(sn)); err != nil || again.Seq != sn.Seq || again.Publisher != sn.Publisher {
				t.Fatalf("snapshot reply does not re-frame: %+v %v", again, err)
			}
		}
	})
}
