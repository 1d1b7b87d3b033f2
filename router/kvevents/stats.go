package kvevents

import (
	"sync/atomic"
)

// StreamState is how far the index can be trusted for one stream (see the package doc).
type StreamState int32

const (
	Exact StreamState = iota
	Replaying
	Approximate
	Inexact
)

func (s StreamState) String() string {
	switch s {
	case Exact:
		return "exact"
	case Replaying:
		return "replaying"
	case Approximate:
		return "approximate"
	case Inexact:
		return "inexact"
	}
	return "unknown"
}

// counters are one stream's atomic counters: written by the poller and the stream's worker,
// read by Stats at any time.
type counters struct {
	state   atomic.Int32
	partial atomic.Bool
	lastSeq atomic.Uint64
	haveSeq atomic.Bool

	received, applied, topicMismatches, malformedFrames, decodeErrors      atomic.Uint64
	overflows, gaps, replays, replayFailures, replayedBatches, uncoverable atomic.Uint64
	duplicates, backwards, restarts, resets                                atomic.Uint64
	panics                                                                 atomic.Uint64

	ingest ingestCounters
}

// ingestCounters are what the ingester counts while applying events.
type ingestCounters struct {
	events, blocksStored, blocksRemoved, clears, unknownEvents   atomic.Uint64
	unknownParent, rekeyErrors, skippedGroups, skippedMedia      atomic.Uint64
	unknownRemoves, indexErrors, blockSizeMismatches             atomic.Uint64
	parityChecked, parityMismatches, paritySkipped, blockSizeSet atomic.Uint64
}

// Stats is a snapshot of one stream: its state and every counter, as plain values.
type Stats struct {
	Engine string
	Rank   int
	State  StreamState
	// Partial: the stream began after the engine's ring had dropped its first batches.
	Partial bool
	// LastSeq is the last applied sequence number (valid when HaveSeq).
	LastSeq uint64
	HaveSeq bool
	// BlockSize is the block size learned from the stream's first indexed BlockStored (0: none yet).
	BlockSize int

	// Receive path.
	Received        uint64 // messages taken off the SUB socket for this stream
	Applied         uint64 // batches applied in order (live and replayed)
	TopicMismatches uint64 // messages whose topic was not the engine's identity (dropped)
	MalformedFrames uint64 // messages that were not [topic, seq8, payload] (dropped)
	DecodeErrors    uint64 // payloads that did not decode (their seq is consumed, nothing applied)
	Panics          uint64 // batches whose decoding or applying panicked (recovered; batch skipped)
	Overflows       uint64 // messages dropped because the stream's queue was full (each heals by replay)

	// Sequence.
	Gaps            uint64 // seq jumps or overflows found
	Replays         uint64 // replays requested
	ReplayFailures  uint64 // replays that failed (no replay socket, timeout, bad reply)
	ReplayedBatches uint64 // batches applied from replays
	Uncoverable     uint64 // gaps the ring no longer covered
	Duplicates      uint64 // batches seen again (replay overlap) and skipped
	Backwards       uint64 // sequence decreases (engine restarts seen on the wire)
	Restarts        uint64 // Restarted calls
	Resets          uint64 // times the replica's entries were cleared because the stream became inexact

	// Ingestion.
	Events              uint64 // events applied
	BlocksStored        uint64
	BlocksRemoved       uint64
	Clears              uint64 // AllBlocksCleared applied
	UnknownEvents       uint64 // event types this version does not know (skipped)
	UnknownParent       uint64 // BlockStored whose parent the replica does not hold (skipped)
	RekeyErrors         uint64 // BlockStored whose sizes are inconsistent (block size out of range, tokens not one block per hash) or whose extras cannot be keyed (skipped)
	SkippedGroups       uint64 // events of non-attention KV groups (skipped)
	SkippedMedia        uint64 // events with an unknown medium (skipped)
	UnknownRemoves      uint64 // removed hashes the replica did not hold
	IndexErrors         uint64 // index calls that failed (replica removed under the stream)
	BlockSizeMismatches uint64 // BlockStored events whose block size is not the configured (or else the learned) one
	ParityChecked       uint64 // blocks whose vLLM hash was recomputed
	ParityMismatches    uint64 // of those, wire ints that differed: seed or algorithm mismatch
	ParitySkipped       uint64 // sampled blocks that could not be recomputed (unmodelled extra keys)
}

func (c *counters) snapshot(engine string, rank int) Stats {
	in := &c.ingest
	return Stats{
		Engine: engine, Rank: rank,
		State:   StreamState(c.state.Load()),
		Partial: c.partial.Load(),
		LastSeq: c.lastSeq.Load(), HaveSeq: c.haveSeq.Load(),
		BlockSize: int(in.blockSizeSet.Load()),

		Received: c.received.Load(), Applied: c.applied.Load(),
		TopicMismatches: c.topicMismatches.Load(), MalformedFrames: c.malformedFrames.Load(),
		DecodeErrors: c.decodeErrors.Load(), Overflows: c.overflows.Load(), Panics: c.panics.Load(),

		Gaps: c.gaps.Load(), Replays: c.replays.Load(), ReplayFailures: c.replayFailures.Load(),
		ReplayedBatches: c.replayedBatches.Load(), Uncoverable: c.uncoverable.Load(),
		Duplicates: c.duplicates.Load(), Backwards: c.backwards.Load(),
		Restarts: c.restarts.Load(), Resets: c.resets.Load(),

		Events: in.events.Load(), BlocksStored: in.blocksStored.Load(),
		BlocksRemoved: in.blocksRemoved.Load(), Clears: in.clears.Load(),
		UnknownEvents: in.unknownEvents.Load(), UnknownParent: in.unknownParent.Load(),
		RekeyErrors: in.rekeyErrors.Load(), SkippedGroups: in.skippedGroups.Load(),
		SkippedMedia: in.skippedMedia.Load(), UnknownRemoves: in.unknownRemoves.Load(),
		IndexErrors: in.indexErrors.Load(), BlockSizeMismatches: in.blockSizeMismatches.Load(),
		ParityChecked: in.parityChecked.Load(), ParityMismatches: in.parityMismatches.Load(),
		ParitySkipped: in.paritySkipped.Load(),
	}
}
