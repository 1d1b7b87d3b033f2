package kvevents

import (
	"encoding/hex"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/router/kvwire"
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
	panics, byteOverflows, replayShort, tooLarge, downs, silentRestarts    atomic.Uint64
	overCap, subReconnects, staleMarks, seedRejects                        atomic.Uint64
	publisherRestarts, stalls, heartbeats                                  atomic.Uint64
	snapshots, snapshotsInstalled, snapshotFailures                        atomic.Uint64
	publisher                                                              atomic.Pointer[kvwire.PublisherID]
	stalled                                                                atomic.Bool
	seeded                                                                 atomic.Bool
	pending                                                                atomic.Int64
	lastApplied                                                            atomic.Int64 // unix ns
	// quiet counts block-storing answers in a row served QuietAfter or more past the last applied
	// batch (Subscriber.Served), lastQuiet when the last of them came (unix ns, 0: never).
	quiet, lastQuiet atomic.Int64

	ingest ingestCounters
}

// ingestCounters are what the ingester counts while applying events.
type ingestCounters struct {
	events, blocksStored, blocksRemoved, clears, unknownEvents   atomic.Uint64
	unknownParent, rekeyErrors, skippedGroups, skippedMedia      atomic.Uint64
	unknownRemoves, indexErrors, blockSizeMismatches, overLimit  atomic.Uint64
	parityChecked, parityMismatches, paritySkipped, blockSizeSet atomic.Uint64
	blocksReannounced                                            atomic.Uint64
	copiesStored, sessionStores                                  atomic.Uint64
	tokenlessResolved, tokenlessUnresolved                       atomic.Uint64
	sharedStored, sharedRemoved, sharedDropped                   atomic.Uint64
	sharedBlocks, sharedCopies                                   atomic.Uint64 // levels
	owners                                                       atomic.Pointer[[]string]
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
	// Seeded: the stream started from a peer's snapshot, confirmed by the engine's ring (the
	// same process), and has applied in order since.
	Seeded bool
	// BlockSize is the block size learned from the stream's first indexed BlockStored (0: none yet).
	BlockSize int
	// Publisher is the engine process's publisher id (hex) from its 24-byte sequence frames;
	// empty for an engine without a snapshot endpoint.
	Publisher string
	// Stalled: the engine sends heartbeats (it sent a publisher id) and none came for longer than
	// Options.StallAfter; the stream is not exact meanwhile.
	Stalled bool

	// Receive path.
	Received        uint64 // messages taken off the SUB socket for this stream
	Applied         uint64 // batches applied in order (live and replayed)
	TopicMismatches uint64 // messages whose topic was not the engine's identity (dropped)
	MalformedFrames uint64 // messages that were not [topic, seq8, payload] (dropped)
	DecodeErrors    uint64 // payloads that did not decode (their seq is consumed, nothing applied)
	Panics          uint64 // batches whose decoding or applying panicked (recovered; batch skipped)
	Overflows       uint64 // messages dropped because the stream's queue was full, in messages or bytes (each heals by replay)
	ByteOverflows   uint64 // of those, dropped because the queue held Options.QueueBytes
	QueuedBytes     int64  // bytes of live messages accepted and not yet applied (queue and held during a replay)
	Pending         int64  // live messages held while a replay runs
	TooLarge        uint64 // batches over Options.MaxMsgSize (libzmq drops the connection on them; skipped)
	SubReconnects   uint64 // times the SUB lost its connection and was opened again

	// Sequence.
	Gaps            uint64    // seq jumps or overflows found
	Replays         uint64    // replays requested
	ReplayFailures  uint64    // replays that failed (no replay socket, timeout, bad reply)
	ReplayedBatches uint64    // batches applied from replays
	Uncoverable     uint64    // gaps the ring no longer covered
	Duplicates      uint64    // batches seen again (replay overlap) and skipped
	Backwards       uint64    // sequence decreases (engine restarts seen on the wire)
	ReplayShort     uint64    // replay bursts that came back with a hole (the engine's ROUTER dropped at its HWM) and were asked for again
	Restarts        uint64    // Restarted calls
	Downs           uint64    // times the engine's health probe was seen failing (Subscriber.Down)
	SilentRestarts  uint64    // new engine processes found without a backwards seq: a seq jump after an outage, or the last applied batch missing from the ring
	OverCap         uint64    // times the replica went past its block limit (cleared, stream inexact)
	StaleMarks      uint64    // times the engine served requests with no events coming (Subscriber.Stale)
	LastApplied     time.Time // when the last batch was applied (zero: none)
	QuietRequests   uint64    // block-storing answers in a row with no batch applied for QuietAfter (Subscriber.Served)
	LastQuiet       time.Time // when the last of those came (zero: never)
	Resets          uint64    // times the replica's entries were cleared because the stream became inexact
	SeedRejected    uint64    // peer snapshots not used: another engine process, the ring wrapped past them, no replay socket, over the block limit
	// PublisherRestarts: new engine processes seen as a changed publisher id (each also a reset).
	PublisherRestarts uint64
	Stalls            uint64 // times the stream went silent past Options.StallAfter while the engine advertised heartbeats
	Heartbeats        uint64 // batches with no events applied (an idle engine's heartbeat, with a snapshot endpoint)
	// Snapshots asked of the engine (StreamConfig.SnapshotEndpoint), installed, and failed
	// (timeout, unavailable, malformed, over the block limit: the stream fell back to its ring).
	Snapshots          uint64
	SnapshotsInstalled uint64
	SnapshotFailures   uint64

	// Ingestion.
	Events              uint64 // events applied
	BlocksStored        uint64
	BlocksReannounced   uint64 // of BlocksStored, blocks the replica already held (full-mode re-announcements of prefix hits)
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
	// CopiesStored: of BlocksStored, blocks already held that counted one more physical copy
	// (IngestOptions.CopyPerStore, or a store with a parent).
	CopiesStored uint64
	// Copies in storage the engine reaches but does not hold (locality REMOTE; media FS, OBJ,
	// STORAGE): counted per residency key, shown, never routed on.
	SharedStored  uint64
	SharedRemoved uint64
	SharedDropped uint64 // shared copies not kept: the stream's bound on shared residency keys was reached
	SharedBlocks  uint64 // level: residency keys with a shared copy
	SharedCopies  uint64 // level: shared copies
	SessionStores uint64 // BlockStored events that carried a session_id
	// Blocks of tokenless stores (a snapshot's tier updates) resolved through the engine hash the
	// replica already held, and those it did not hold (skipped).
	TokenlessResolved   uint64
	TokenlessUnresolved uint64
	// Owners are the ownership values the engine's events named (at most 16 kept).
	Owners []string
}

func (c *counters) snapshot(engine string, rank int) Stats {
	in := &c.ingest
	var last time.Time
	if ns := c.lastApplied.Load(); ns != 0 {
		last = time.Unix(0, ns)
	}
	var pub string
	if p := c.publisher.Load(); p != nil {
		pub = hex.EncodeToString(p[:])
	}
	return Stats{
		Publisher: pub, Stalled: c.stalled.Load(),
		PublisherRestarts: c.publisherRestarts.Load(), Stalls: c.stalls.Load(), Heartbeats: c.heartbeats.Load(),
		Snapshots: c.snapshots.Load(), SnapshotsInstalled: c.snapshotsInstalled.Load(), SnapshotFailures: c.snapshotFailures.Load(),
		LastApplied: last, QuietRequests: uint64(max(c.quiet.Load(), 0)), LastQuiet: unixOrZero(c.lastQuiet.Load()),
		Engine:      engine, Rank: rank,
		State:   StreamState(c.state.Load()),
		Partial: c.partial.Load(), Seeded: c.seeded.Load(), SeedRejected: c.seedRejects.Load(),
		LastSeq: c.lastSeq.Load(), HaveSeq: c.haveSeq.Load(),
		BlockSize: int(in.blockSizeSet.Load()),

		Received: c.received.Load(), Applied: c.applied.Load(),
		TopicMismatches: c.topicMismatches.Load(), MalformedFrames: c.malformedFrames.Load(),
		DecodeErrors: c.decodeErrors.Load(), Overflows: c.overflows.Load(), Panics: c.panics.Load(),
		ByteOverflows: c.byteOverflows.Load(), Pending: c.pending.Load(), TooLarge: c.tooLarge.Load(),
		ReplayShort: c.replayShort.Load(), Downs: c.downs.Load(), SilentRestarts: c.silentRestarts.Load(),
		OverCap: c.overCap.Load(), SubReconnects: c.subReconnects.Load(), StaleMarks: c.staleMarks.Load(),

		Gaps: c.gaps.Load(), Replays: c.replays.Load(), ReplayFailures: c.replayFailures.Load(),
		ReplayedBatches: c.replayedBatches.Load(), Uncoverable: c.uncoverable.Load(),
		Duplicates: c.duplicates.Load(), Backwards: c.backwards.Load(),
		Restarts: c.restarts.Load(), Resets: c.resets.Load(),

		Events: in.events.Load(), BlocksStored: in.blocksStored.Load(), BlocksReannounced: in.blocksReannounced.Load(),
		BlocksRemoved: in.blocksRemoved.Load(), Clears: in.clears.Load(),
		UnknownEvents: in.unknownEvents.Load(), UnknownParent: in.unknownParent.Load(),
		RekeyErrors: in.rekeyErrors.Load(), SkippedGroups: in.skippedGroups.Load(),
		SkippedMedia: in.skippedMedia.Load(), UnknownRemoves: in.unknownRemoves.Load(),
		IndexErrors: in.indexErrors.Load(), BlockSizeMismatches: in.blockSizeMismatches.Load(),
		ParityChecked: in.parityChecked.Load(), ParityMismatches: in.parityMismatches.Load(),
		ParitySkipped: in.paritySkipped.Load(),
		CopiesStored:  in.copiesStored.Load(), SessionStores: in.sessionStores.Load(),
		TokenlessResolved: in.tokenlessResolved.Load(), TokenlessUnresolved: in.tokenlessUnresolved.Load(),
		SharedStored: in.sharedStored.Load(), SharedRemoved: in.sharedRemoved.Load(), SharedDropped: in.sharedDropped.Load(),
		SharedBlocks: in.sharedBlocks.Load(), SharedCopies: in.sharedCopies.Load(),
		Owners: ownersOf(in),
	}
}

func ownersOf(in *ingestCounters) []string {
	if p := in.owners.Load(); p != nil {
		return *p
	}
	return nil
}

// unixOrZero is ns as a time, zero for 0.
func unixOrZero(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
