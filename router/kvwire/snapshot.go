package kvwire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The snapshot exchange of an engine with a snapshot_endpoint (vLLM PR #57789, as
// docs/features/kv_events.md describes it at commit 0aa3ce853c7d; the publisher's source was not
// in the index this was written from): a client sends one frame, "snapshot"; the engine answers
// [seq, publisher id, chunk...], where seq is a signed 8-byte big-endian number naming the last
// batch the snapshot includes (-1: none recorded yet; -2: no snapshot available, no chunks) and
// every chunk is a KVEventBatch payload. A DEALER sends and receives without the empty
// delimiter a REQ socket adds.

// SnapshotRequestFrame is the request's only frame.
const SnapshotRequestFrame = "snapshot"

// Snapshot sequence values with a meaning of their own.
const (
	SnapshotNone        int64 = -1 // the publisher has recorded no batch
	SnapshotUnavailable int64 = -2 // the recorder is invalid: restart the engine to recover it
)

// ErrSnapshotUnavailable is returned for a reply with seq -2.
var ErrSnapshotUnavailable = errors.New("kvwire: the engine has no snapshot available (its recorder is invalid)")

// Snapshot is a parsed snapshot reply. Chunks alias the frames.
type Snapshot struct {
	Seq       int64 // last batch included; SnapshotNone when none
	Publisher PublisherID
	Chunks    [][]byte
}

// SnapshotRequest returns the frames a DEALER sends.
func SnapshotRequest() [][]byte { return [][]byte{[]byte(SnapshotRequestFrame)} }

// IsSnapshotRequest reports whether frames after the ROUTER's identity (and a REQ's empty
// delimiter, which the caller strips) are a snapshot request.
func IsSnapshotRequest(frames [][]byte) bool {
	return len(frames) == 1 && string(frames[0]) == SnapshotRequestFrame
}

// SnapshotReplyFrames returns the reply frames after the ROUTER's identity (and delimiter).
func SnapshotReplyFrames(s Snapshot) [][]byte {
	out := [][]byte{binary.BigEndian.AppendUint64(nil, uint64(s.Seq)), append([]byte(nil), s.Publisher[:]...)}
	return append(out, s.Chunks...)
}

// ParseSnapshotReply parses a reply as a DEALER receives it (a leading empty delimiter, as a
// REQ-shaped reply has, is accepted too).
func ParseSnapshotReply(frames [][]byte) (Snapshot, error) {
	if len(frames) > 0 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	if len(frames) < 2 || len(frames[0]) != 8 || len(frames[1]) != PublisherIDLen {
		return Snapshot{}, fmt.Errorf("kvwire: snapshot reply is not [seq (8 bytes), publisher id (16 bytes), chunks...] (%d frames)", len(frames))
	}
	s := Snapshot{Seq: int64(binary.BigEndian.Uint64(frames[0])), Chunks: frames[2:]}
	copy(s.Publisher[:], frames[1])
	switch {
	case s.Seq == SnapshotUnavailable:
		return s, ErrSnapshotUnavailable
	case s.Seq < SnapshotNone:
		return Snapshot{}, fmt.Errorf("kvwire: snapshot reply sequence %d", s.Seq)
	case s.Seq == SnapshotNone && len(s.Chunks) > 0:
		return Snapshot{}, errors.New("kvwire: snapshot reply with chunks but no sequence")
	}
	return s, nil
}
