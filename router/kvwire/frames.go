package kvwire

import (
	"encoding/binary"
	"fmt"
)

// EndSeq is the sequence number of the replay end marker (-1 as a signed 8-byte big-endian int).
const EndSeq = ^uint64(0)

// Message is one published batch: the PUB frames [topic, seq (8-byte big-endian), payload].
// Topic and Payload alias the frames they were parsed from.
type Message struct {
	Topic   []byte
	Seq     uint64
	Payload []byte
}

// Frames returns the PUB frames of m.
func (m Message) Frames() [][]byte {
	return [][]byte{m.Topic, binary.BigEndian.AppendUint64(nil, m.Seq), m.Payload}
}

func parseSeq(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("kvwire: sequence frame has %d bytes, want 8", len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// ParseFrames parses a PUB message as a SUB socket receives it.
func ParseFrames(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("kvwire: message has %d frames, want 3 [topic, seq, payload]", len(frames))
	}
	seq, err := parseSeq(frames[1])
	if err != nil {
		return Message{}, err
	}
	return Message{Topic: frames[0], Seq: seq, Payload: frames[2]}, nil
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
// framing with a topic frame (vLLM PR #45177): [identity, "", "", ff×8, ""].
func ReplayEndFrames(identity []byte) [][]byte {
	return ReplayReplyFrames(identity, Message{Topic: []byte{}, Seq: EndSeq, Payload: []byte{}})
}

// ParseReplayReply parses one replay reply as a DEALER (or REQ) receives it, with or without the
// topic frame vLLM PR #45177 added (merged June 2026; which release first has it is not
// verified): ["", topic, seq, payload], ["", seq, payload], and the same without the leading
// empty delimiter. An empty payload is the end marker (end is true; the
// returned message then carries only what the marker had).
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
	if m.Seq, err = parseSeq(frames[0]); err != nil {
		return Message{}, false, err
	}
	m.Payload = frames[1]
	return m, len(m.Payload) == 0, nil
}
