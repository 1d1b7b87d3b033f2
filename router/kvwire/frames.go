package kvwire

import (
	"encoding/binary"
	"fmt"
)

// EndSeq is the sequence number of the replay end marker (-1 as a signed 8-byte big-endian int).
const EndSeq = ^uint64(0)

// PublisherIDLen is the length of the publisher id a snapshot-capable engine appends to the
// sequence frame.
const PublisherIDLen = 16

// PublisherID identifies one publisher lifetime (an engine process, per DP rank): vLLM with a
// snapshot endpoint (PR #57789) draws it at start and sends it after the sequence number in every
// live and replay data frame, so a changed id is a restart without comparing any payload.
type PublisherID [PublisherIDLen]byte

// Message is one published batch: the PUB frames [topic, seq, payload], where the sequence
// frame is the 8-byte big-endian seq or, from an engine with snapshot_endpoint set, the same 8
// bytes followed by the 16-byte publisher id (24 bytes; vLLM docs/features/kv_events.md, "Wire
// contract", read at commit 0aa3ce853c7d). Topic and Payload alias the frames they were parsed
// from.
type Message struct {
	Topic   []byte
	Seq     uint64
	Payload []byte
	// Publisher is the id from a 24-byte sequence frame; HasPublisher is false for 8 bytes.
	Publisher    PublisherID
	HasPublisher bool
}

// Frames returns the PUB frames of m: a 24-byte sequence frame when m carries a publisher id.
func (m Message) Frames() [][]byte {
	return [][]byte{m.Topic, m.seqFrame(), m.Payload}
}

func (m Message) seqFrame() []byte {
	if !m.HasPublisher {
		return binary.BigEndian.AppendUint64(nil, m.Seq)
	}
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 8+PublisherIDLen), m.Seq)
	return append(b, m.Publisher[:]...)
}

// parseSeq reads a bare 8-byte sequence frame (replay requests, which stay 8 bytes with
// snapshots on).
func parseSeq(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("kvwire: sequence frame has %d bytes, want 8", len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// parseDataSeq reads a data frame's sequence: 8 bytes, or 8 plus a 16-byte publisher id.
func parseDataSeq(m *Message, b []byte) error {
	switch len(b) {
	case 8:
		m.Seq, m.HasPublisher = binary.BigEndian.Uint64(b), false
	case 8 + PublisherIDLen:
		m.Seq, m.HasPublisher = binary.BigEndian.Uint64(b), true
		copy(m.Publisher[:], b[8:])
	default:
		return fmt.Errorf("kvwire: sequence frame has %d bytes, want 8 or 24 (seq and publisher id)", len(b))
	}
	return nil
}

// ParseFrames parses a PUB message as a SUB socket receives it.
func ParseFrames(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("kvwire: message has %d frames, want 3 [topic, seq, payload]", len(frames))
	}
	m := Message{Topic: frames[0], Payload: frames[2]}
	if err := parseDataSeq(&m, frames[1]); err != nil {
		return Message{}, err
	}
	return m, nil
}

// ReplayRequest returns the frames a DEALER sends to ask a replay socket for every buffered batch
// from seq on: ["", seq].
func ReplayRequest(seq uint64) [][]byte {
	return [][]byte{{}, binary.BigEndian.AppendUint64(nil, seq)}
}

// ParseReplayRequest parses what a ROUTER replay socket receives: [identity, "", seq]. It returns
// the identity to address the replies to.
func ParseReplayRequest(frames [][]byte) (identity []byte, seq uint64, err error) {
	if len(frames) != 3 || len(frames[1]) != 0 {
		return nil, 0, fmt.Errorf("kvwire: replay request has %d frames, want [identity, \"\", seq]", len(frames))
	}
	seq, err = parseSeq(frames[2])
	return frames[0], seq, err
}

// ReplayReplyFrames returns what a ROUTER sends for one buffered batch (vLLM with #45177,
// June 2026; before it the topic frame is absent):
// [identity, "", topic, seq, payload]; the DEALER receives it without the identity.
func ReplayReplyFrames(identity []byte, m Message) [][]byte {
	return append([][]byte{identity, {}}, m.Frames()...)
}

// ReplayEndFrames returns the end marker a ROUTER sends after the last buffered batch, in the
// framing with a topic frame (vLLM PR #45177): [identity, "", "", ff×8, ""]. With snapshots on
// the marker keeps its 8-byte sequence.
func ReplayEndFrames(identity []byte) [][]byte {
	return ReplayReplyFrames(identity, Message{Topic: []byte{}, Seq: EndSeq, Payload: []byte{}})
}

// ParseReplayReply parses one replay reply as a DEALER (or REQ) receives it, with or without the
// topic frame vLLM PR #45177 added (merged June 2026; which release first has it is not
// verified): ["", topic, seq, payload], ["", seq, payload], and the same without the leading
// empty delimiter. The sequence frame is 8 or 24 bytes (see Message). An empty payload is the end
// marker (end is true; the returned message then carries only what the marker had).
func ParseReplayReply(frames [][]byte) (m Message, end bool, err error) {
	switch len(frames) {
	case 4: // "", topic, seq, payload
		if len(frames[0]) != 0 {
			return Message{}, false, fmt.Errorf("kvwire: 4-frame replay reply without the empty delimiter")
		}
		m.Topic, frames = frames[1], frames[2:]
	case 3: // "", seq, payload (no topic frame, DEALER) or topic, seq, payload (REQ): same reading
		m.Topic, frames = frames[0], frames[1:]
	case 2: // seq, payload (no topic frame, REQ)
		m.Topic = []byte{}
	default:
		return Message{}, false, fmt.Errorf("kvwire: replay reply has %d frames, want 2 to 4", len(frames))
	}
	if err = parseDataSeq(&m, frames[0]); err != nil {
		return Message{}, false, err
	}
	m.Payload = frames[1]
	return m, len(m.Payload) == 0, nil
}
