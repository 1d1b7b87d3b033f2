package kvwire

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// A snapshot-capable vLLM (PR #57789; docs/features/kv_events.md at commit 0aa3ce853c7d) sends
// live and replay data frames whose sequence part is the 8-byte seq followed by a 16-byte
// publisher id; replay requests and the end marker keep 8 bytes.
func TestSequenceFrameWithPublisherID(t *testing.T) {
	var pid PublisherID
	for i := range pid {
		pid[i] = byte(i + 1)
	}
	seq := append(binary.BigEndian.AppendUint64(nil, 7), pid[:]...)
	m, err := ParseFrames([][]byte{[]byte("kv@h@m"), seq, {0x93}})
	if err != nil {
		t.Fatal(err)
	}
	if m.Seq != 7 || !m.HasPublisher || m.Publisher != pid {
		t.Fatalf("parsed seq %d publisher %x (set %v), want 7 and %x", m.Seq, m.Publisher, m.HasPublisher, pid)
	}
	if got := m.Frames()[1]; !bytes.Equal(got, seq) {
		t.Fatalf("re-framed sequence %x, want %x", got, seq)
	}

	old, err := ParseFrames([][]byte{{}, binary.BigEndian.AppendUint64(nil, 3), {0x93}})
	if err != nil || old.HasPublisher || old.Seq != 3 {
		t.Fatalf("8-byte frame: %+v, %v", old, err)
	}
	if len(old.Frames()[1]) != 8 {
		t.Fatal("a message without a publisher id must re-frame with 8 bytes")
	}

	for _, n := range []int{0, 7, 9, 16, 23, 25} {
		_, err := ParseFrames([][]byte{{}, make([]byte, n), {0x93}})
		if err == nil || !strings.Contains(err.Error(), "want 8 or 24") {
			t.Errorf("%d-byte sequence frame: err %v, want a length error", n, err)
		}
	}

	// Replay: ["", topic, seq24, payload] and the unchanged 8-byte end marker.
	r, end, err := ParseReplayReply([][]byte{{}, []byte("kv@h@m"), seq, {0x93}})
	if err != nil || end || r.Seq != 7 || r.Publisher != pid {
		t.Fatalf("replay reply: %+v end=%v err=%v", r, end, err)
	}
	_, end, err = ParseReplayReply(ReplayEndFrames([]byte("id"))[1:])
	if err != nil || !end {
		t.Fatalf("end marker: end=%v err=%v", end, err)
	}
	// A replay request never carries the id.
	if _, _, err := ParseReplayRequest([][]byte{[]byte("id"), {}, seq}); err == nil {
		t.Fatal("a 24-byte replay request was accepted")
	}
}

func TestSnapshotFrames(t *testing.T) {
	var pid PublisherID
	pid[3] = 9
	in := Snapshot{Seq: 41, Publisher: pid, Chunks: [][]byte{{0x93}, {0x94}}}
	got, err := ParseSnapshotReply(SnapshotReplyFrames(in))
	if err != nil || got.Seq != 41 || got.Publisher != pid || len(got.Chunks) != 2 {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	if got, err := ParseSnapshotReply(append([][]byte{{}}, SnapshotReplyFrames(Snapshot{Seq: SnapshotNone, Publisher: pid})...)); err != nil || got.Seq != -1 {
		t.Fatalf("empty publisher with a REQ delimiter: %+v %v", got, err)
	}
	if _, err := ParseSnapshotReply(SnapshotReplyFrames(Snapshot{Seq: SnapshotUnavailable, Publisher: pid})); err != ErrSnapshotUnavailable {
		t.Fatalf("seq -2: %v", err)
	}
	for _, bad := range [][][]byte{nil, {make([]byte, 8)}, {make([]byte, 7), make([]byte, 16)}, {make([]byte, 8), make([]byte, 15)},
		SnapshotReplyFrames(Snapshot{Seq: -3}), SnapshotReplyFrames(Snapshot{Seq: -1, Chunks: [][]byte{{0x93}}})} {
		if _, err := ParseSnapshotReply(bad); err == nil {
			t.Errorf("accepted %x", bad)
		}
	}
	if !IsSnapshotRequest(SnapshotRequest()) || IsSnapshotRequest([][]byte{[]byte("snap")}) {
		t.Fatal("request recognition")
	}
}
