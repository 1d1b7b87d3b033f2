package kvevents

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvwire"
	"github.com/kvroute/kvroute/router/peersnap"
)

// StreamKey names one event stream: an engine and one of its DP ranks.
type StreamKey struct {
	Engine string
	Rank   int
}

func (k StreamKey) String() string { return fmt.Sprintf("%s/%d", k.Engine, k.Rank) }

// StreamConfig describes one (engine, DP rank) stream.
type StreamConfig struct {
	Engine string
	Rank   int
	// Endpoint is the engine's PUB address the SUB connects to (tcp://HOST:PORT). Empty in bound
	// mode: the stream is then fed by a socket from Subscriber.Bind, identified by Topic.
	Endpoint string
	// ReplayEndpoint is the engine's ROUTER replay address; empty when the engine has none.
	ReplayEndpoint string
	// SnapshotEndpoint is the engine's snapshot ROUTER address (vLLM's snapshot_endpoint, PR
	// #57789); empty when it has none. With it the stream starts from the engine's whole cache
	// state instead of the ring, and a gap the ring no longer covers is rebuilt from a snapshot.
	SnapshotEndpoint string
	// Topic is the topic the engine publishes with (<prefix>@<host>@<model>); messages with any
	// other topic are counted (TopicMismatches) and dropped.
	Topic string
	// MaxBlocks bounds the replica's distinct GPU blocks (0: Options.MaxBlocks): the engine's
	// num_gpu_blocks with slack (MaxBlocksFor).
	MaxBlocks int
	// Ingest overrides Options.Ingest for this stream.
	Ingest *IngestOptions
	// OnChange, when set, is told the stream's state and learned block size (0: none yet)
	// whenever either changes, from the stream's worker goroutine: the router's fleet pushes
	// them into the replica's view so a decision reads them without asking the subscriber. It
	// must not block or call back into the Subscriber.
	OnChange func(state StreamState, blockSize int)
	// Seed, when set, starts the stream from a peer router's snapshot of it instead of the
	// engine's ring from seq 0: its blocks are restored, and the ring is asked for the
	// snapshot's last batch; the same bytes (the same engine process) confirm it and the replay
	// goes on from there, anything else throws it away and replays from seq 0 (see seed). The
	// caller checks the engine's incarnation and the snapshot's key scheme first.
	Seed *peersnap.Stream
}

// MaxBlocksFor is the replica block limit for an engine with numGPUBlocks blocks: an engine
// holds at most that many distinct blocks; the slack covers a batch that stores before it
// removes.
func MaxBlocksFor(numGPUBlocks int) int { return numGPUBlocks + numGPUBlocks/8 + 256 }

// batchApplier applies decoded batches to the index: the stream's *Ingester, or in tests one
// that misbehaves.
type batchApplier interface {
	Apply(b *kvwire.Batch) (cleared bool)
}

// stream is one stream's state. The sequence fields are owned by its worker goroutine; the
// poller touches only queue, kick, queued, the drop marks and the counters.
type stream struct {
	key   StreamKey
	cfg   StreamConfig
	id    index.ReplicaID
	ix    *index.Index
	sub   *Subscriber
	c     counters
	queue chan kvwire.Message
	kick  chan struct{} // poller -> worker: a message was dropped on overflow
	lost  chan struct{} // poller -> worker: the SUB lost its connection and was opened again
	ctl   chan func()
	stop  chan struct{}
	done  chan struct{}

	// queued is the bytes (msgCost) of live messages accepted and not handled yet: in queue or
	// held in pending. The poller refuses a message that would take it past Options.QueueBytes.
	queued      atomic.Int64
	dropPending atomic.Bool
	dropSeq     atomic.Uint64 // highest seq dropped on overflow

	// worker-owned
	dec      *kvwire.Decoder
	ing      batchApplier
	next     uint64      // next expected seq
	base     StreamState // Exact, Approximate or Inexact; Replaying is shown while replaying
	fresh    bool        // nothing applied since the engine's (or router's) start: seq 0 heals
	prevLive uint64
	havePrev bool

	rep     *replayRun       // the replay in flight; nil when none
	pending []kvwire.Message // live messages taken while a replay is in flight, in arrival order
	// headChecked: pending[0] passed handle's arrival checks and started the replay in flight
	headChecked bool
	mustReach   uint64 // seqs below it were published (some dropped on overflow)
	failFrom    uint64 // a replay from failFrom made no progress fails times
	fails       int

	down    bool   // the engine's health probe fails: not exact meanwhile
	stale   bool   // the engine serves requests but publishes nothing (Subscriber.Stale)
	suspect bool   // the engine was unreachable since the last batch known to be its process's
	lastSum uint64 // XXH3-64 of the last applied batch's payload, to recognise the process
	haveSum bool
	// seeding: the stream was started from a peer's snapshot that the engine has not confirmed
	// yet (the identity replay is in flight).
	seeding bool

	// pid is the engine process's publisher id, from its 24-byte sequence frames (havePID: one
	// was seen since the last restart). An engine that sends it also sends a heartbeat batch
	// every idle second, so a stream silent past Options.StallAfter is stalled.
	pid      kvwire.PublisherID
	havePID  bool
	lastRecv time.Time // when the worker last took a message off the queue
	stalled  bool      // heartbeats stopped: not exact until a message comes again
	// loggedPIDRestart, loggedStall: the first publisher change and stall were logged.
	loggedPIDRestart, loggedStall bool
	// snapBlocked: a snapshot failed; none is asked again until the stream restarts or heals.
	snapBlocked, loggedSnapFail bool

	lastPanicLog time.Time
	logged       [numDropKinds]bool

	// told is what OnChange last heard (state, block size); toldAny: it heard something.
	toldState     StreamState
	toldBlockSize int
	toldAny       bool
}

// replayRun is one replay exchange: a goroutine owns its DEALER and sends what it receives to
// the worker in chunks, so the worker keeps taking live messages while the engine answers.
type replayRun struct {
	snap   bool // a snapshot exchange, not a replay
	from   uint64
	verify bool // an identity check after an outage: the first batch must be the last applied one
	resync bool // asked after the SUB reconnected, not for a known gap
	out    chan replayChunk
	stop   chan struct{} // worker -> goroutine: the rest is not wanted
	done   chan struct{}

	got      bool // a batch of this exchange was seen
	progress bool // a batch of this exchange was applied
	short    bool // a batch was missing mid-burst: the rest is fetched by a new exchange
	halted   bool
}

// halt tells the goroutine the rest of the exchange is not wanted.
func (r *replayRun) halt() {
	if !r.halted {
		r.halted = true
		close(r.stop)
	}
}

type replayChunk struct {
	msgs    []kvwire.Message
	last    bool  // the exchange is over
	end     bool  // the engine's end marker arrived
	refused bool  // libzmq dropped the connection on a frame over Options.MaxMsgSize
	err     error // no end marker: timeout, connection lost, malformed reply
	// snapshot is a snapshot exchange's reply (nil with err).
	snapshot *kvwire.Snapshot
}

// msgCost is what a held message counts against the byte budget: its frames plus the
// bookkeeping around them.
func msgCost(m kvwire.Message) int64 { return int64(len(m.Payload)+len(m.Topic)) + 96 }

func (st *stream) snapshot() Stats {
	s := st.c.snapshot(st.key.Engine, st.key.Rank)
	s.QueuedBytes = st.queued.Load()
	return s
}

func (st *stream) setState() {
	s := st.base
	switch {
	case st.down || st.stale || st.stalled:
		s = Inexact
	case st.rep != nil:
		s = Replaying
	}
	st.c.state.Store(int32(s))
	st.c.pending.Store(int64(len(st.pending)))
	st.c.stalled.Store(st.stalled)
	switch p := st.c.publisher.Load(); {
	case !st.havePID && p != nil:
		st.c.publisher.Store(nil)
	case st.havePID && (p == nil || *p != st.pid):
		pid := st.pid
		st.c.publisher.Store(&pid)
	}
	if st.cfg.OnChange != nil {
		bs := int(st.c.ingest.blockSizeSet.Load())
		if !st.toldAny || s != st.toldState || bs != st.toldBlockSize {
			st.toldAny, st.toldState, st.toldBlockSize = true, s, bs
			st.cfg.OnChange(s, bs)
		}
	}
}

// enqueue is called by the poller; a full queue (in messages or bytes) drops the message and
// marks the gap.
func (st *stream) enqueue(m kvwire.Message) {
	cost := msgCost(m)
	if st.queued.Add(cost) > st.sub.opts.QueueBytes {
		st.queued.Add(-cost)
		st.c.byteOverflows.Add(1)
		st.dropped(m.Seq)
		return
	}
	select {
	case st.queue <- m:
	default:
		st.queued.Add(-cost)
		st.dropped(m.Seq)
	}
}

func (st *stream) dropped(seq uint64) {
	st.c.overflows.Add(1)
	for {
		old := st.dropSeq.Load()
		if seq <= old && st.dropPending.Load() || st.dropSeq.CompareAndSwap(old, seq) {
			break
		}
	}
	st.dropPending.Store(true)
	select {
	case st.kick <- struct{}{}:
	default:
	}
}

func (st *stream) run() {
	defer close(st.done)
	defer st.cancelReplay()
	st.fresh = true
	st.base = Approximate // unknown until the first message or the start-up replay decides
	switch {
	case st.cfg.Seed != nil && st.seed(st.cfg.Seed):
		// Started from a peer's snapshot: the identity replay (startReplay with verify) confirms
		// the engine process and brings what followed the snapshot.
	case st.cfg.SnapshotEndpoint != "":
		st.startSnapshot() // the engine's whole state, whether or not its ring still has seq 0
	case st.cfg.ReplayEndpoint != "":
		st.startReplay(0, false)
	}
	st.cfg.Seed = nil // the snapshot's blocks are in the index; do not hold them twice
	st.setState()
	tick := time.NewTicker(st.sub.opts.StallAfter / 4)
	defer tick.Stop()
	for {
		var out <-chan replayChunk
		if st.rep != nil {
			out = st.rep.out
		}
		select {
		case <-st.stop:
			return
		case f := <-st.ctl:
			f()
		case m := <-st.queue:
			st.take(m)
		case <-st.kick:
			st.kicked()
		case <-st.lost:
			st.resync()
		case c := <-out:
			st.onChunk(c)
		case now := <-tick.C:
			st.checkStall(now)
		}
		st.setState()
	}
}

// take handles a live message, or holds it while a replay runs: it is applied in order after.
func (st *stream) take(m kvwire.Message) {
	st.lastRecv = time.Now()
	st.stalled = false // the publisher is back; seq continuity tells whether anything was lost
	if st.rep != nil {
		st.pending = append(st.pending, m)
		return
	}
	st.handle(m, false)
}

func (st *stream) release(m kvwire.Message) { st.queued.Add(-msgCost(m)) }

// handle applies one live message in sequence, or starts a repair and holds it. checked: the
// message was held after passing the arrival checks (it started the repair).
func (st *stream) handle(m kvwire.Message, checked bool) {
	// A publisher id names the engine process: a different one is a restart whatever the seq
	// does, and the same one after an outage is the same process (no seq or byte reasoning).
	newPID := !checked && m.HasPublisher && st.havePID && m.Publisher != st.pid
	samePID := !checked && m.HasPublisher && st.havePID && m.Publisher == st.pid
	backwards := !checked && !newPID && st.havePrev && m.Seq <= st.prevLive
	if !checked {
		st.prevLive, st.havePrev = m.Seq, true
	}
	switch {
	case checked:
	case newPID:
		st.newPublisher(m.Publisher)
	case samePID && st.suspect:
		st.suspect = false
	case backwards:
		// A PUB connection keeps order, so a live seq not above the previous one is a new engine
		// process: forget the old one and take the new one from its seq 0.
		st.c.backwards.Add(1)
		st.restart()
	case st.suspect && m.Seq > st.next:
		// The engine was unreachable and its seq jumped: a new process that published past the
		// old one's last seq while the SUB reconnected. A replay from st.next would return the new
		// process's batches as if they followed the old ones.
		st.c.silentRestarts.Add(1)
		st.restart()
	}
	if m.HasPublisher && !st.havePID {
		st.pid, st.havePID = m.Publisher, true
	}
	if m.Seq < st.next {
		st.c.duplicates.Add(1) // already applied from a replay
		st.release(m)
		return
	}
	if m.Seq > st.next {
		if st.canReplay() || st.canSnapshot() {
			st.c.gaps.Add(1)
			if st.canReplay() {
				st.startReplay(st.next, false)
			} else {
				st.startSnapshot()
			}
			st.pending = append([]kvwire.Message{m}, st.pending...) // older than anything held
			st.headChecked = true
			return
		}
		st.c.gaps.Add(1)
		st.uncoverable() // the ring does not hold it: resume from this batch
		st.next = m.Seq
	}
	st.release(m)
	st.apply(m)
}

// canReplay: there is a replay socket, and a replay from st.next has not already come back
// without it.
func (st *stream) canReplay() bool {
	return st.cfg.ReplayEndpoint != "" && !(st.fails >= 2 && st.failFrom == st.next)
}

// kicked handles the poller's overflow mark once the messages queued before the drop are taken.
func (st *stream) kicked() {
	st.dropPending.Store(false)
	dropped := st.dropSeq.Load()
	for drained := false; !drained; {
		select {
		case m := <-st.queue:
			st.take(m)
		default:
			drained = true
		}
	}
	st.mustReach = max(st.mustReach, dropped+1)
	if st.rep == nil {
		st.reach()
	}
}

// resync asks the ring for what followed the last applied batch after the SUB lost its
// connection: messages published meanwhile are gone, and if the engine publishes nothing more,
// no later seq would show the gap. A replay already running covers it.
func (st *stream) resync() {
	if st.rep != nil || st.cfg.ReplayEndpoint == "" || !st.haveSum {
		return
	}
	st.startReplay(st.next, false)
	st.rep.resync = true
}

// reach makes sure every seq below mustReach was seen: repaired by replay, else uncoverable.
func (st *stream) reach() {
	if st.next >= st.mustReach {
		return
	}
	if st.canReplay() {
		st.c.gaps.Add(1)
		st.startReplay(st.next, false)
		return
	}
	st.uncoverable()
	st.next = st.mustReach
}

// restart forgets everything known from the engine's previous process.
func (st *stream) restart() {
	st.cancelReplay()
	st.clearReplica()
	st.base = Inexact
	st.fresh = true
	st.next, st.mustReach, st.fails = 0, 0, 0
	st.suspect, st.haveSum, st.havePID, st.snapBlocked = false, false, false, false
	st.setState()
}

// newPublisher handles a publisher id other than the stream's: the engine process restarted
// (its id is drawn per process). The replica is reset (counted in resets, the reason in
// publisher_restarts) and the new process is taken from its seq 0; held live messages of another
// process are dropped, so they cannot restart the stream again.
func (st *stream) newPublisher(p kvwire.PublisherID) {
	old := st.pid
	st.c.publisherRestarts.Add(1)
	st.restart()
	st.pid, st.havePID = p, true
	kept := st.pending[:0]
	for i, m := range st.pending {
		if m.HasPublisher && m.Publisher != p {
			st.release(m)
			if i == 0 {
				st.headChecked = false
			}
			continue
		}
		kept = append(kept, m)
	}
	clear(st.pending[len(kept):])
	st.pending = kept
	if !st.loggedPIDRestart {
		st.loggedPIDRestart = true
		st.sub.log.Warn("engine publisher id changed: a new engine process; replica reset and taken from its seq 0 (counted in publisher_restarts and resets; further ones are not logged)",
			"engine", st.key.Engine, "rank", st.key.Rank, "old_publisher_id", hex.EncodeToString(old[:]), "publisher_id", hex.EncodeToString(p[:]))
	}
}

// checkStall marks the stream stalled when an engine that advertised heartbeats (it sent a
// publisher id) has been silent past Options.StallAfter: vLLM with a snapshot endpoint sends an
// empty batch every idle second, so silence means the stream or the engine stopped, and batches
// published meanwhile could be missing without any later seq showing the gap.
func (st *stream) checkStall(now time.Time) {
	if !st.havePID || st.stalled || st.lastRecv.IsZero() || now.Sub(st.lastRecv) <= st.sub.opts.StallAfter {
		return
	}
	st.stalled = true
	st.c.stalls.Add(1)
	if !st.loggedStall {
		st.loggedStall = true
		st.sub.log.Warn("engine event stream stalled: no batch or heartbeat for longer than the stall limit; stream not exact until one comes (counted in stalls; further ones are not logged)",
			"engine", st.key.Engine, "rank", st.key.Rank, "silent_for", now.Sub(st.lastRecv).Round(time.Millisecond), "stall_after", st.sub.opts.StallAfter)
	}
}

func (st *stream) clearReplica() {
	if err := st.ix.Clear(st.id); err != nil {
		st.c.ingest.indexErrors.Add(1)
	}
	st.c.resets.Add(1)
}

// uncoverable records a gap no replay can fill (see the package doc for the states).
func (st *stream) uncoverable() {
	st.c.uncoverable.Add(1)
	if st.fresh {
		st.base = Approximate // nothing applied since the start: the index holds no stale block
		st.c.partial.Store(true)
	} else {
		st.clearReplica()
		st.base = Inexact
	}
	st.fresh = false
}

// apply decodes and applies the batch with seq st.next.
func (st *stream) apply(m kvwire.Message) {
	st.next = m.Seq + 1
	st.fails, st.stale = 0, false
	st.c.lastSeq.Store(m.Seq)
	st.c.haveSeq.Store(true)
	st.c.lastApplied.Store(st.sub.opts.Now().UnixNano())
	st.lastSum, st.haveSum = payloadSum(m.Payload), true
	fresh := st.fresh
	st.fresh = false
	over := st.c.ingest.overLimit.Load()
	cleared, ok := st.decodeAndApply(m)
	if st.c.ingest.overLimit.Load() != over {
		// More distinct blocks than the engine can hold: the stream does not describe the
		// engine's cache. Drop the replica's entries rather than grow with the publisher.
		st.c.overCap.Add(1)
		st.clearReplica()
		st.base = Inexact
		st.logDrop(dropOverLimit, m, errors.New("the replica went past its block limit"))
		return
	}
	if !ok {
		return
	}
	if cleared || (fresh && m.Seq == 0) {
		st.base = Exact
		st.c.partial.Store(false)
	}
}

// setDown and setUp are the health probe's view of the engine (Subscriber.Down, Subscriber.Up).
func (st *stream) setDown() {
	if !st.down {
		st.c.downs.Add(1)
	}
	st.down = true
	st.suspect = st.suspect || st.haveSum
}

func (st *stream) setUp() {
	if !st.down {
		return
	}
	st.down = false
	if !st.suspect {
		return
	}
	if st.cfg.ReplayEndpoint == "" {
		// Nothing can tell the old process from a new one that has not published yet: forget it.
		st.c.silentRestarts.Add(1)
		st.restart()
		return
	}
	// Ask for the last applied batch again: the same process answers with the same bytes.
	st.cancelReplay()
	st.startReplay(st.next-1, true)
}

func (st *stream) startReplay(from uint64, verify bool) {
	st.c.replays.Add(1)
	r := &replayRun{from: from, verify: verify, out: make(chan replayChunk, 4), stop: make(chan struct{}), done: make(chan struct{})}
	st.rep = r
	go st.fetch(r)
}

// cancelReplay stops the exchange in flight, if any, and waits for its goroutine (its socket
// must be closed before the ZMQ context terminates).
func (st *stream) cancelReplay() {
	if r := st.rep; r != nil {
		r.halt()
		<-r.done
		st.rep = nil
	}
}

// onChunk applies what a replay exchange received.
func (st *stream) onChunk(c replayChunk) {
	r := st.rep
	if r.snap {
		st.finishSnapshot(r, c)
		return
	}
msgs:
	for _, m := range c.msgs {
		if m.HasPublisher && st.havePID && m.Publisher != st.pid {
			// The ring is another process's: the engine restarted since the stream last heard it.
			if st.seeding {
				st.seedRejected("the engine's publisher id is not the one the stream knew (another process)")
			}
			st.newPublisher(m.Publisher)
			if st.cfg.ReplayEndpoint != "" {
				st.startReplay(0, false)
			}
			return
		}
		knownPID := m.HasPublisher && st.havePID // and equal: checked above
		if m.HasPublisher && !st.havePID {
			st.pid, st.havePID = m.Publisher, true
		}
		if r.verify {
			r.verify = false
			// The same publisher id is the same process; without one known, the bytes decide.
			same := knownPID || st.haveSum && payloadSum(m.Payload) == st.lastSum
			if m.Seq != r.from || !same {
				st.identityLost()
				return
			}
			st.suspect = false
			st.seedConfirmed()
		}
		switch {
		case m.Seq < st.next:
			st.c.duplicates.Add(1)
			r.got = true
			continue
		case m.Seq > st.next:
			if r.got {
				// A hole mid-burst: the engine's ROUTER dropped batches at its send HWM (vLLM
				// answers with the whole ring at once). Ask again from the first missing one.
				r.short = true
				st.c.replayShort.Add(1)
				r.halt()
				break msgs
			}
			// The ring's first batch is after st.next: the ring no longer holds the gap.
			if st.canSnapshot() {
				r.halt()
				<-r.done
				st.rep = nil
				st.startSnapshot()
				return
			}
			st.uncoverable()
			st.next = m.Seq
		}
		r.got, r.progress = true, true
		st.apply(m)
		st.c.replayedBatches.Add(1)
	}
	if c.last || r.short {
		st.finish(r, c)
	}
}

// identityLost: after an outage the engine's ring no longer holds the last applied batch as it
// was: a new process. Its ring is taken from seq 0.
func (st *stream) identityLost() {
	if st.seeding {
		st.seedRejected("the engine's ring no longer holds the snapshot's last batch as it was (another process, or the ring wrapped)")
	} else {
		st.c.silentRestarts.Add(1)
	}
	st.restart()
	if st.cfg.ReplayEndpoint != "" {
		st.startReplay(0, false)
	}
}

// finish ends an exchange and decides what follows: another exchange from the first missing
// seq, or the held live messages.
func (st *stream) finish(r *replayRun, c replayChunk) {
	<-r.done
	st.rep = nil
	if r.verify { // nothing came back for the last applied seq
		st.identityLost()
		return
	}
	switch {
	case c.refused && !r.progress:
		// libzmq dropped the connection on the batch at st.next: it is over MaxMsgSize. Skip it
		// like a batch that does not decode (fetching it again would fail the same way).
		st.c.tooLarge.Add(1)
		st.logDrop(dropTooLarge, kvwire.Message{Seq: st.next}, fmt.Errorf("a frame is over the %d-byte limit", st.sub.opts.MaxMsgSize))
		st.next++
		st.startReplay(st.next, false)
		return
	case r.short || c.refused || (c.err != nil && r.progress):
		// Cut short after some progress: the rest of the ring is asked for again.
		st.startReplay(st.next, false)
		return
	}
	if c.err != nil {
		st.c.replayFailures.Add(1)
	}
	if !r.progress && !r.resync {
		if st.failFrom == r.from && st.fails > 0 {
			st.fails++
		} else {
			st.failFrom, st.fails = r.from, 1
		}
		if c.err != nil {
			st.fails++ // an unreachable replay socket is not asked twice for the same gap
		}
	}
	if c.err == nil && !r.got && st.fresh && r.from == 0 {
		st.base = Exact // an empty ring after a start: the engine has published nothing yet
		st.c.partial.Store(false)
	}
	st.drainPending()
	if st.rep == nil {
		st.reach()
	}
}

// drainPending handles the live messages held during a replay, in order, until one starts
// another replay.
func (st *stream) drainPending() {
	for len(st.pending) > 0 && st.rep == nil {
		m, checked := st.pending[0], st.headChecked
		st.pending[0], st.headChecked = kvwire.Message{}, false
		st.pending = st.pending[1:]
		st.handle(m, checked)
	}
	if len(st.pending) == 0 {
		st.pending = nil // let the backing array go
	}
}

// decodeAndApply decodes one batch and applies it to the index. A batch that does not decode is
// counted and skipped: replay would return the same bytes, so it is treated like events of a
// type this version does not know.
//
// A panic while decoding or applying is the last line of defence, not a path the code expects
// (sizes from the wire are checked before use): the batch is skipped and counted, the first
// one on the stream is logged with its seq and the start of its payload, and the stream goes on
// with the next batch. Without it one bad batch kills the router, and since the batch stays in
// the engine's replay ring every restarted router replays it and dies again. The
// index takes its locks with defer, so a recovered panic leaves none held; the batch's events
// applied before the panic stay, as they would if its later events had been of unknown types.
func (st *stream) decodeAndApply(m kvwire.Message) (cleared, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			st.c.panics.Add(1)
			st.logPanic(m, r)
			cleared, ok = false, false
		}
	}()
	b, err := st.dec.DecodeBatch(m.Payload)
	if err != nil {
		st.c.decodeErrors.Add(1)
		st.logDrop(dropUndecodable, m, err)
		return false, false
	}
	st.c.applied.Add(1)
	if len(b.Events) == 0 {
		st.c.heartbeats.Add(1)
	}
	return st.ing.Apply(b), true
}

// payloadHead is how much of a skipped batch's payload a log line shows, in bytes (as hex).
const payloadHead = 64

func hexHead(b []byte) string {
	if len(b) > payloadHead {
		return hex.EncodeToString(b[:payloadHead]) + "..."
	}
	return hex.EncodeToString(b)
}

// logPanic logs a recovered panic: the first on the stream in full (value, seq, payload head,
// stack), later ones at most once a minute with the count since, so a replayed poison batch
// cannot flood the log.
func (st *stream) logPanic(m kvwire.Message, r any) {
	n := st.c.panics.Load()
	now := time.Now()
	if n > 1 && now.Sub(st.lastPanicLog) < time.Minute {
		return
	}
	st.lastPanicLog = now
	st.sub.log.Error("event batch panicked the ingest path; batch skipped, stream continues",
		"engine", st.key.Engine, "rank", st.key.Rank, "seq", m.Seq, "payload_bytes", len(m.Payload),
		"payload_head", hexHead(m.Payload), "panic", fmt.Sprint(r), "panics_total", n,
		"stack", string(debug.Stack()))
}

// dropKind names a way a batch is dropped, for logDrop's once-per-kind log line.
type dropKind uint8

const (
	dropUndecodable dropKind = iota
	dropTooLarge
	dropOverLimit
	numDropKinds
)

var dropWhy = [numDropKinds]string{
	dropUndecodable: "event batch skipped: it does not decode (counted in decode errors; further ones are not logged)",
	dropTooLarge:    "event batch skipped: it is over the message size limit (counted in too-large; further ones are not logged)",
	dropOverLimit:   "replica cleared, stream inexact: more blocks than the engine holds (counted in over-cap; further ones are not logged)",
}

// logDrop logs the first drop of each kind on the stream, with its reason; the counters carry
// the rest.
func (st *stream) logDrop(k dropKind, m kvwire.Message, err error) {
	if st.logged[k] {
		return
	}
	st.logged[k] = true
	st.sub.log.Warn(dropWhy[k],
		"engine", st.key.Engine, "rank", st.key.Rank, "seq", m.Seq, "payload_bytes", len(m.Payload),
		"payload_head", hexHead(m.Payload), "err", err)
}

var errReplayTimeout = errors.New("replay timed out")

var monitorSeq atomic.Uint64

// fetch runs one replay exchange on a DEALER that lives only for it (replays are rare; a socket
// kept per stream would hold a connection per engine for nothing) and sends what arrives to the
// worker in chunks.
//
// vLLM's publisher (vllm/distributed/kv_events.py, ZmqEventPublisher) answers a request with
// every buffered batch from the asked seq on, in one burst, then the end marker, through a
// ROUTER left at libzmq's default send HWM of 1,000 messages; a ROUTER drops what does not fit
// its pipe to a peer. The DEALER's receive HWM is therefore sized to the whole ring (so this
// side takes a burst as fast as TCP brings it), and the worker asks again from the first
// missing seq when a burst comes back with a hole (replayRun.short).
func (st *stream) fetch(r *replayRun) {
	defer close(r.done)
	o := &st.sub.opts
	send := func(c replayChunk) bool {
		select {
		case r.out <- c:
			return true
		case <-r.stop:
		case <-st.stop:
		}
		return false
	}
	fail := func(err error) { send(replayChunk{last: true, err: err}) }
	soc, err := st.sub.ctx.NewSocket(zmq.DEALER)
	if err != nil {
		fail(err)
		return
	}
	defer soc.Close()
	_ = soc.SetLinger(0)
	_ = soc.SetRcvhwm(o.Ring + 16)
	_ = soc.SetMaxmsgsize(o.MaxMsgSize)
	// A frame over MaxMsgSize makes libzmq drop the connection (and reconnect) without a word to
	// the reader; the monitor is how this side learns why the burst stopped.
	monAddr := fmt.Sprintf("inproc://kvevents-replay-mon-%d", monitorSeq.Add(1))
	var mon *zmq.Socket
	if err = soc.Monitor(monAddr, zmq.EVENT_DISCONNECTED); err == nil {
		if mon, err = st.sub.ctx.NewSocket(zmq.PAIR); err == nil {
			defer mon.Close()
			_ = mon.SetLinger(0)
			err = mon.Connect(monAddr)
		}
	}
	if err != nil {
		fail(fmt.Errorf("replay monitor: %w", err))
		return
	}
	if err := soc.Connect(st.cfg.ReplayEndpoint); err != nil {
		fail(fmt.Errorf("replay connect %s: %w", st.cfg.ReplayEndpoint, err))
		return
	}
	if _, err := soc.SendMessage(kvwire.ReplayRequest(r.from)); err != nil {
		fail(err)
		return
	}
	poller := zmq.NewPoller()
	poller.Add(soc, zmq.POLLIN)
	poller.Add(mon, zmq.POLLIN)
	var buf []kvwire.Message
	wait := o.ReplayTimeout
	for {
		// Take what is there, then hand it over before waiting for more.
		for bufBytes := 0; len(buf) < replayChunkLen && bufBytes < replayChunkBytes; {
			frames, err := soc.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				break
			}
			m, end, err := kvwire.ParseReplayReply(frames)
			if err != nil {
				st.c.malformedFrames.Add(1)
				if send(replayChunk{msgs: buf}) {
					fail(err)
				}
				return
			}
			if end {
				send(replayChunk{msgs: buf, last: true, end: true})
				return
			}
			if string(m.Topic) != st.cfg.Topic && len(m.Topic) > 0 {
				st.c.topicMismatches.Add(1)
				continue
			}
			buf = append(buf, m)
			bufBytes += len(m.Payload)
			// Within a burst the next batch follows at once; a pause this long means the rest
			// (or the end marker) was dropped.
			wait = min(o.ReplayTimeout, o.ReplayIdle)
		}
		if len(buf) > 0 {
			if !send(replayChunk{msgs: buf}) {
				return
			}
			buf = nil
			continue
		}
		for {
			e, _, _, err := mon.RecvEvent(zmq.DONTWAIT)
			if err != nil {
				break
			}
			if e != zmq.EVENT_DISCONNECTED {
				continue
			}
			// Mid-exchange the DEALER only loses its connection when the engine goes away or
			// libzmq refuses what came in (a frame over MaxMsgSize). An engine still accepting
			// connections is the second case.
			if reachable(st.cfg.ReplayEndpoint) {
				send(replayChunk{last: true, refused: true, err: errors.New("replay connection dropped on an oversize frame")})
			} else {
				fail(errors.New("replay connection lost"))
			}
			return
		}
		deadline := time.Now().Add(wait)
		polled, err := pollUntil(poller, deadline, st.stop, r.stop)
		if err != nil {
			fail(err)
			return
		}
		if len(polled) == 0 {
			fail(errReplayTimeout)
			return
		}
	}
}

// reachable reports whether a tcp:// endpoint accepts a connection now.
func reachable(endpoint string) bool {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return false
	}
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// replayChunkLen and replayChunkBytes bound what is handed to the worker at once, so the replayed
// batches waiting in Go memory stay a few chunks whatever the engine's batch sizes.
const (
	replayChunkLen   = 256
	replayChunkBytes = 1 << 20
)

// pollUntil polls in short slices so a stream being stopped does not wait out a replay timeout.
func pollUntil(p *zmq.Poller, deadline time.Time, stops ...<-chan struct{}) ([]zmq.Polled, error) {
	for {
		for _, stop := range stops {
			select {
			case <-stop:
				return nil, errors.New("stream stopped")
			default:
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil
		}
		polled, err := p.Poll(min(left, 50*time.Millisecond))
		if err != nil || len(polled) > 0 {
			return polled, err
		}
	}
}

// payloadSum identifies a batch by its payload: XXH3-64, the same on every router, so a peer's
// snapshot can name the batch it ends with.
func payloadSum(b []byte) uint64 { return xxh3.Hash(b) }

// seed starts the stream from a peer's snapshot (StreamConfig.Seed). It reports false, leaving
// the stream as it was, when the snapshot cannot be used here: no batch in it, no replay socket
// to confirm the engine process with, or more blocks than the replica may hold.
func (st *stream) seed(sn *peersnap.Stream) bool {
	switch {
	case !sn.HaveSeq:
		st.seedRejected("the peer had applied no batch of the stream")
		return false
	case st.cfg.ReplayEndpoint == "":
		st.seedRejected("no replay socket to confirm the engine process with")
		return false
	}
	if err := st.ix.Restore(st.id, sn.Tiers); err != nil {
		st.seedRejected(err.Error())
		_ = st.ix.Clear(st.id)
		return false
	}
	if g, ok := st.ing.(*Ingester); ok {
		g.restore(sn)
	}
	st.next = sn.LastSeq + 1
	st.lastSum, st.haveSum = sn.Identity, true
	st.fresh = false
	st.base = Approximate
	st.c.partial.Store(!sn.Exact)
	if sn.Exact {
		st.base = Exact
	}
	st.seeding = true
	st.c.lastSeq.Store(sn.LastSeq)
	st.c.haveSeq.Store(true)
	st.startReplay(sn.LastSeq, true)
	return true
}

// seedConfirmed: the engine's ring returned the snapshot's last batch with the same bytes.
func (st *stream) seedConfirmed() {
	if st.seeding {
		st.seeding = false
		st.c.seeded.Store(true)
	}
}

// seedRejected counts a snapshot not used, and logs the first.
func (st *stream) seedRejected(why string) {
	st.seeding = false
	st.c.seeded.Store(false)
	if st.c.seedRejects.Add(1) == 1 {
		st.sub.log.Warn("peer snapshot not used for the stream; its ring is replayed from seq 0 instead (counted in stream_seed_rejected_total)",
			"engine", st.key.Engine, "rank", st.key.Rank, "why", why)
	}
}

// export returns the stream's snapshot as the worker holds it (run on the worker: no batch is
// applied meanwhile, so the blocks match LastSeq). ok is false when the stream has nothing a
// peer could use: no batch applied, the engine seen down or stale, or a snapshot of its own not
// yet confirmed.
func (st *stream) export() (peersnap.Stream, bool) {
	if !st.haveSum || st.down || st.stale || st.suspect || st.seeding || st.base == Inexact {
		return peersnap.Stream{}, false
	}
	tiers, err := st.ix.Export(st.id)
	if err != nil {
		return peersnap.Stream{}, false
	}
	sn := peersnap.Stream{Engine: st.key.Engine, Rank: st.key.Rank, Exact: st.base == Exact,
		HaveSeq: true, LastSeq: st.next - 1, Identity: st.lastSum, Tiers: tiers}
	if g, ok := st.ing.(*Ingester); ok {
		g.export(&sn)
	}
	return sn, true
}

// canSnapshot: the engine has a snapshot endpoint and no snapshot has failed since the stream
// last restarted or installed one.
func (st *stream) canSnapshot() bool { return st.cfg.SnapshotEndpoint != "" && !st.snapBlocked }

func (st *stream) startSnapshot() {
	st.c.snapshots.Add(1)
	r := &replayRun{snap: true, out: make(chan replayChunk, 1), stop: make(chan struct{}), done: make(chan struct{})}
	st.rep = r
	go st.fetchSnapshot(r)
}

// fetchSnapshot asks the engine for its whole cache state on a DEALER that lives for the one
// exchange, and hands the reply to the worker. Live messages wait in pending meanwhile, as
// during a replay.
func (st *stream) fetchSnapshot(r *replayRun) {
	defer close(r.done)
	o := &st.sub.opts
	fail := func(err error) {
		select {
		case r.out <- replayChunk{last: true, err: err}:
		case <-r.stop:
		case <-st.stop:
		}
	}
	soc, err := st.sub.ctx.NewSocket(zmq.DEALER)
	if err != nil {
		fail(err)
		return
	}
	defer soc.Close()
	_ = soc.SetLinger(0)
	_ = soc.SetMaxmsgsize(o.MaxMsgSize)
	if err := soc.Connect(st.cfg.SnapshotEndpoint); err != nil {
		fail(fmt.Errorf("snapshot connect %s: %w", st.cfg.SnapshotEndpoint, err))
		return
	}
	if _, err := soc.SendMessage(kvwire.SnapshotRequest()); err != nil {
		fail(err)
		return
	}
	poller := zmq.NewPoller()
	poller.Add(soc, zmq.POLLIN)
	polled, err := pollUntil(poller, time.Now().Add(o.SnapshotTimeout), st.stop, r.stop)
	if err != nil {
		fail(err)
		return
	}
	if len(polled) == 0 {
		fail(errors.New("snapshot timed out"))
		return
	}
	frames, err := soc.RecvMessageBytes(0)
	if err != nil {
		fail(err)
		return
	}
	sn, err := kvwire.ParseSnapshotReply(frames)
	if err != nil {
		fail(err)
		return
	}
	select {
	case r.out <- replayChunk{last: true, snapshot: &sn}:
	case <-r.stop:
	case <-st.stop:
	}
}

// finishSnapshot installs a snapshot reply: the replica is rebuilt from its chunks, the stream
// continues from the seq after the snapshot's, and the live messages held meanwhile are applied
// (those the snapshot already covers are duplicates). A snapshot of another publisher than the
// one the stream knew is a restart first. A failed snapshot is counted and logged once, and the
// stream falls back to what it does without one (the ring from seq 0, or an uncoverable gap).
func (st *stream) finishSnapshot(r *replayRun, c replayChunk) {
	<-r.done
	st.rep = nil
	err := c.err
	if err == nil {
		err = st.installSnapshot(c.snapshot)
	}
	if err != nil {
		st.c.snapshotFailures.Add(1)
		st.snapBlocked = true
		if !st.loggedSnapFail {
			st.loggedSnapFail = true
			st.sub.log.Warn("engine snapshot not installed; the stream goes on from the replay ring (counted in snapshot_failures; further ones are not logged)",
				"engine", st.key.Engine, "rank", st.key.Rank, "endpoint", st.cfg.SnapshotEndpoint, "err", err)
		}
		if st.fresh && st.next == 0 && st.cfg.ReplayEndpoint != "" {
			st.startReplay(0, false)
			return
		}
	}
	st.drainPending()
	if st.rep == nil {
		st.reach()
	}
}

func (st *stream) installSnapshot(sn *kvwire.Snapshot) error {
	if st.havePID && sn.Publisher != st.pid {
		st.newPublisher(sn.Publisher)
	}
	// Built in place: the stream is not exact until the last chunk is in, so a decision
	// meanwhile scores the replica approximately rather than trusting a partial state.
	if err := st.ix.Clear(st.id); err != nil {
		return err
	}
	st.base = Inexact
	// A snapshot states every copy as a store and the excess as trailing removals: its stores
	// are copies whatever the live stream's report mode.
	if g, ok := st.ing.(*Ingester); ok && !g.copyPerStore {
		g.copyPerStore = true
		defer func() { g.copyPerStore = false }()
	}
	over := st.c.ingest.overLimit.Load()
	for i, chunk := range sn.Chunks {
		b, err := st.dec.DecodeBatch(chunk)
		if err != nil {
			_ = st.ix.Clear(st.id)
			return fmt.Errorf("chunk %d: %w", i, err)
		}
		st.ing.Apply(b)
		if st.c.ingest.overLimit.Load() != over {
			_ = st.ix.Clear(st.id)
			return fmt.Errorf("chunk %d: more blocks than the replica may hold", i)
		}
	}
	st.pid, st.havePID = sn.Publisher, true
	st.haveSum, st.suspect, st.snapBlocked = false, false, false
	st.next, st.fresh = uint64(sn.Seq+1), sn.Seq < 0
	if sn.Seq >= 0 {
		st.c.lastSeq.Store(uint64(sn.Seq))
		st.c.haveSeq.Store(true)
	}
	st.mustReach = 0
	st.base = Exact
	st.c.partial.Store(false)
	st.c.snapshotsInstalled.Add(1)
	return nil
}
