package kvevents

import (
	"errors"
	"fmt"
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
	ing       *Ingester
	next      uint64      // next expected seq
	base      StreamState // Exact, Approximate or Inexact; Replaying is shown while replaying
	fresh     bool        // nothing applied since the engine's (or router's) start: seq 0 heals
	prevLive  uint64
	havePrev  bool
	replaying bool
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
	b, err := st.dec.DecodeBatch(m.Payload)
	if err != nil {
		// Replay would return the same bytes: count the batch and skip it, like events of a
		// type this version does not know.
		st.c.decodeErrors.Add(1)
		return
	}
	st.c.applied.Add(1)
	cleared := st.ing.Apply(b)
	if cleared || (fresh && m.Seq == 0) {
		st.base = Exact
		st.c.partial.Store(false)
	}
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
