package kvevents

import (
	"encoding/hex"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvwire"
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
	// Topic is the topic the engine publishes with (<prefix>@<host>@<model>); messages with any
	// other topic are counted (TopicMismatches) and dropped.
	Topic string
	// Ingest overrides Options.Ingest for this stream.
	Ingest *IngestOptions
}

// batchApplier applies decoded batches to the index: the stream's *Ingester, or in tests one
// that misbehaves.
type batchApplier interface {
	Apply(b *kvwire.Batch) (cleared bool)
}

// stream is one stream's state. The sequence fields are owned by its worker goroutine; the
// poller touches only queue, kick, the drop marks and the counters.
type stream struct {
	key   StreamKey
	cfg   StreamConfig
	id    index.ReplicaID
	ix    *index.Index
	sub   *Subscriber
	c     counters
	queue chan kvwire.Message
	kick  chan struct{} // poller -> worker: a message was dropped on overflow
	ctl   chan func()
	stop  chan struct{}
	done  chan struct{}

	dropPending atomic.Bool
	dropSeq     atomic.Uint64 // highest seq dropped on overflow

	// worker-owned
	dec       *kvwire.Decoder
	ing       batchApplier
	next      uint64      // next expected seq
	base      StreamState // Exact, Approximate or Inexact; Replaying is shown while replaying
	fresh     bool        // nothing applied since the engine's (or router's) start: seq 0 heals
	prevLive  uint64
	havePrev  bool
	replaying bool

	lastPanicLog time.Time
	logged       [numDropKinds]bool
}

func (st *stream) setState() {
	s := st.base
	if st.replaying {
		s = Replaying
	}
	st.c.state.Store(int32(s))
}

// enqueue is called by the poller; a full queue drops the message and marks the gap.
func (st *stream) enqueue(m kvwire.Message) {
	select {
	case st.queue <- m:
	default:
		st.c.overflows.Add(1)
		for {
			old := st.dropSeq.Load()
			if m.Seq <= old && st.dropPending.Load() || st.dropSeq.CompareAndSwap(old, m.Seq) {
				break
			}
		}
		st.dropPending.Store(true)
		select {
		case st.kick <- struct{}{}:
		default:
		}
	}
}

func (st *stream) run() {
	defer close(st.done)
	st.fresh = true
	st.base = Approximate // unknown until the first message or the start-up replay decides
	if st.cfg.ReplayEndpoint != "" {
		st.replay(0)
	}
	st.setState()
	for {
		select {
		case <-st.stop:
			return
		case f := <-st.ctl:
			f()
		case m := <-st.queue:
			st.live(m)
		case <-st.kick:
			st.dropPending.Store(false)
			dropped := st.dropSeq.Load()
			for drained := false; !drained; {
				select {
				case m := <-st.queue:
					st.live(m)
				default:
					drained = true
				}
			}
			st.overflowed(dropped)
		}
	}
}

// live handles one message from the SUB socket.
func (st *stream) live(m kvwire.Message) {
	backwards := st.havePrev && m.Seq <= st.prevLive
	st.prevLive, st.havePrev = m.Seq, true
	switch {
	case backwards:
		// A PUB connection keeps order, so a live seq not above the previous one is a new engine
		// process: forget the old one and take the new one from its seq 0.
		st.c.backwards.Add(1)
		st.restart()
		if m.Seq > 0 {
			st.c.gaps.Add(1)
			st.repair()
		}
	case m.Seq < st.next:
		st.c.duplicates.Add(1) // already applied from a replay
		return
	case m.Seq > st.next:
		st.c.gaps.Add(1)
		st.repair()
	}
	switch {
	case m.Seq == st.next:
		st.apply(m)
	case m.Seq > st.next: // the repair could not reach it: resume from this batch
		st.uncoverable()
		st.next = m.Seq
		st.apply(m)
	default:
		st.c.duplicates.Add(1) // the replay went past it
	}
	st.setState()
}

// overflowed repairs messages the poller dropped, once the queue has been drained.
func (st *stream) overflowed(dropped uint64) {
	if dropped < st.next {
		return // a later seq already triggered the repair
	}
	st.c.gaps.Add(1)
	st.repair()
	if dropped >= st.next {
		st.uncoverable()
		st.next = dropped + 1
	}
	st.setState()
}

// restart forgets everything known from the engine's previous process.
func (st *stream) restart() {
	st.clearReplica()
	st.base = Inexact
	st.fresh = true
	st.next = 0
	st.setState()
}

func (st *stream) clearReplica() {
	if err := st.ix.Clear(st.id); err != nil {
		st.c.ingest.indexErrors.Add(1)
	}
	st.c.resets.Add(1)
}

// repair fetches the batches from st.next on from the replay socket. The caller checks how far
// st.next got and declares the rest uncoverable.
func (st *stream) repair() {
	if st.cfg.ReplayEndpoint != "" {
		st.replay(st.next)
	}
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
	st.c.lastSeq.Store(m.Seq)
	st.c.haveSeq.Store(true)
	fresh := st.fresh
	st.fresh = false
	cleared, ok := st.decodeAndApply(m)
	if !ok {
		return
	}
	if cleared || (fresh && m.Seq == 0) {
		st.base = Exact
		st.c.partial.Store(false)
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
// the engine's replay ring every restarted router replays it and dies again (issue 15). The
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
	numDropKinds
)

// logDrop logs the first drop of each kind on the stream, with its reason; the counters carry
// the rest.
func (st *stream) logDrop(k dropKind, m kvwire.Message, err error) {
	if st.logged[k] {
		return
	}
	st.logged[k] = true
	st.sub.log.Warn("event batch skipped: it does not decode (counted in decode errors; further ones are not logged)",
		"engine", st.key.Engine, "rank", st.key.Rank, "seq", m.Seq, "payload_bytes", len(m.Payload),
		"payload_head", hexHead(m.Payload), "err", err)
}

var errReplayTimeout = errors.New("replay timed out")

// replay asks the engine's ring for every batch from `from` on and applies them in order; a ring
// that starts after st.next is an uncoverable gap.
func (st *stream) replay(from uint64) {
	st.replaying = true
	st.setState()
	defer func() { st.replaying = false; st.setState() }()
	st.c.replays.Add(1)
	got, err := st.fetch(from)
	if err != nil {
		st.c.replayFailures.Add(1)
	}
	if err == nil && len(got) == 0 && st.fresh && from == 0 {
		st.base = Exact // an empty ring after a start: the engine has published nothing yet
		st.c.partial.Store(false)
		return
	}
	for _, m := range got {
		switch {
		case m.Seq < st.next:
			st.c.duplicates.Add(1)
			continue
		case m.Seq > st.next:
			st.uncoverable()
			st.next = m.Seq
		}
		st.apply(m)
		st.c.replayedBatches.Add(1)
	}
}

// fetch runs one replay exchange on a DEALER that lives only for it (replays are rare; a socket
// kept per stream would hold a connection per engine for nothing). It returns the batches
// received before any error.
func (st *stream) fetch(from uint64) ([]kvwire.Message, error) {
	soc, err := st.sub.ctx.NewSocket(zmq.DEALER)
	if err != nil {
		return nil, err
	}
	defer soc.Close()
	_ = soc.SetLinger(0)
	if err := soc.Connect(st.cfg.ReplayEndpoint); err != nil {
		return nil, fmt.Errorf("replay connect %s: %w", st.cfg.ReplayEndpoint, err)
	}
	if _, err := soc.SendMessage(kvwire.ReplayRequest(from)); err != nil {
		return nil, err
	}
	poller := zmq.NewPoller()
	poller.Add(soc, zmq.POLLIN)
	var out []kvwire.Message
	for {
		deadline := time.Now().Add(st.sub.opts.ReplayTimeout)
		polled, err := pollUntil(poller, deadline, st.stop)
		if err != nil {
			return out, err
		}
		if len(polled) == 0 {
			return out, errReplayTimeout
		}
		frames, err := soc.RecvMessageBytes(0)
		if err != nil {
			return out, err
		}
		m, end, err := kvwire.ParseReplayReply(frames)
		if err != nil {
			st.c.malformedFrames.Add(1)
			return out, err
		}
		if end {
			return out, nil
		}
		if string(m.Topic) != st.cfg.Topic && len(m.Topic) > 0 {
			st.c.topicMismatches.Add(1)
			continue
		}
		out = append(out, m)
	}
}

// pollUntil polls in short slices so a stream being stopped does not wait out a replay timeout.
func pollUntil(p *zmq.Poller, deadline time.Time, stop <-chan struct{}) ([]zmq.Polled, error) {
	for {
		select {
		case <-stop:
			return nil, errors.New("stream stopped")
		default:
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
