package kvevents

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvwire"
	"github.com/kvroute/kvroute/router/peersnap"
)

// Options configure a Subscriber. Zero values take the defaults named.
type Options struct {
	// Index receives every stream's events; required.
	Index *index.Index
	// QueueLen is each stream's queue between the poller and its worker, in messages (4096).
	QueueLen int
	// RcvHWM is each SUB socket's receive high-water mark, in messages (100000, vLLM's send HWM).
	RcvHWM int
	// ReconnectIvl and ReconnectIvlMax are libzmq's reconnect backoff (100ms doubling to 5s).
	ReconnectIvl, ReconnectIvlMax time.Duration
	// ReplayTimeout is the longest wait for a replay's first reply (5s: an engine's publisher
	// thread answers between its sends, and a loaded one, or one still pushing a previous burst
	// of large frames, takes seconds); ReplayIdle the longest
	// pause inside a burst before the rest is taken as dropped and asked for again (500ms).
	ReplayTimeout, ReplayIdle time.Duration
	// Ring is how many batches an engine's replay ring holds (10000, vLLM's buffer_steps); the
	// replay DEALER's receive HWM is sized to it.
	Ring int
	// MaxMsgSize is the largest frame the SUB and replay sockets accept (ZMQ_MAXMSGSIZE; 16 MiB).
	// libzmq drops a connection that brings a bigger one; such a batch is counted (TooLarge)
	// and skipped.
	MaxMsgSize int64
	// QueueBytes bounds each stream's live messages accepted and not applied yet, in bytes
	// (64 MiB): its queue plus what is held while a replay runs. Past it a message is dropped as
	// an overflow (a gap, repaired by replay).
	QueueBytes int64
	// MaxBlocks bounds each replica's distinct GPU blocks when its StreamConfig gives none
	// (1<<20); MaxOffloadBlocks its CPU and disk blocks, per tier (1<<21). Past them the replica is
	// cleared and the stream inexact (OverCap).
	MaxBlocks, MaxOffloadBlocks int
	// StallAfter is how long a stream whose engine sends heartbeats (it sends a publisher id in
	// its sequence frames) may stay silent before it is stalled and not exact (5s: vLLM's idle
	// publisher sends an empty batch every second, and its snapshot subscriber example gives up
	// after 5s).
	StallAfter time.Duration
	// SnapshotTimeout is the longest wait for an engine's snapshot reply (10s: the engine builds
	// it on its publisher's side thread, sharing the engine's CPU).
	SnapshotTimeout time.Duration
	// Ingest is every stream's ingestion configuration unless its StreamConfig overrides it.
	Ingest IngestOptions
	// Now is the subscriber's clock (time.Now when nil): when a batch was applied, and how long
	// an engine has served requests since (Served).
	Now func() time.Time
	// Logger receives what the streams cannot say through counters alone: the first drop of each
	// kind and recovered panics (slog.Default() when nil).
	Logger *slog.Logger

	// wrapApplier, set by tests only, replaces each stream's ingester with what it returns.
	wrapApplier func(*Ingester) batchApplier
}

// Defaults of Options.
const (
	DefaultRing            = 10000    // vLLM's buffer_steps
	DefaultMaxMsgSize      = 16 << 20 // far above a real batch (a few KiB to a few hundred KiB)
	DefaultQueueBytes      = 64 << 20
	DefaultStallAfter      = 5 * time.Second
	DefaultSnapshotTimeout = 10 * time.Second
)

// ErrClosed is returned after Close.
var ErrClosed = errors.New("kvevents: subscriber closed")

// Subscriber receives the event streams of many engines, from one polling goroutine, and feeds
// the index. Safe for concurrent use.
type Subscriber struct {
	opts Options
	ctx  *zmq.Context
	log  *slog.Logger

	mu      sync.Mutex
	streams map[StreamKey]*stream
	closed  bool

	cmds     chan command
	wakeMu   sync.Mutex
	wakeErrs sync.Map    // wake-up errors already logged
	wakeTx   *zmq.Socket // callers' end of the inproc PAIR; used under wakeMu
	done     chan struct{}

	monitors map[*zmq.Socket]*source // the poller's: monitor socket -> its source

	// unroutable counts messages on bound sockets whose topic names no stream.
	unroutable atomic.Uint64
}

type cmdKind uint8

const (
	cmdAdd cmdKind = iota
	cmdRemove
	cmdBind
	cmdClose
)

type command struct {
	kind  cmdKind
	st    *stream
	addr  string
	reply chan cmdReply
}

type cmdReply struct {
	addr string
	err  error
}

var wakeSeq atomic.Uint64

// New starts a subscriber with no streams.
func New(opts Options) (*Subscriber, error) {
	if opts.Index == nil {
		return nil, errors.New("kvevents: Options.Index is required")
	}
	if opts.QueueLen <= 0 {
		opts.QueueLen = 4096
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.RcvHWM <= 0 {
		opts.RcvHWM = 100000
	}
	if opts.ReconnectIvl <= 0 {
		opts.ReconnectIvl = 100 * time.Millisecond
	}
	if opts.ReconnectIvlMax <= 0 {
		opts.ReconnectIvlMax = 5 * time.Second
	}
	if opts.ReplayTimeout <= 0 {
		opts.ReplayTimeout = 5 * time.Second
	}
	if opts.ReplayIdle <= 0 {
		opts.ReplayIdle = 500 * time.Millisecond
	}
	if opts.Ring <= 0 {
		opts.Ring = DefaultRing
	}
	if opts.MaxMsgSize <= 0 {
		opts.MaxMsgSize = DefaultMaxMsgSize
	}
	if opts.QueueBytes <= 0 {
		opts.QueueBytes = DefaultQueueBytes
	}
	if opts.MaxBlocks <= 0 {
		opts.MaxBlocks = 1 << 20
	}
	if opts.MaxOffloadBlocks <= 0 {
		opts.MaxOffloadBlocks = 1 << 21
	}
	if opts.StallAfter <= 0 {
		opts.StallAfter = DefaultStallAfter
	}
	if opts.SnapshotTimeout <= 0 {
		opts.SnapshotTimeout = DefaultSnapshotTimeout
	}
	ctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("kvevents: zmq context: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Subscriber{opts: opts, ctx: ctx, log: log, streams: map[StreamKey]*stream{}, cmds: make(chan command, 64), done: make(chan struct{})}
	addr := fmt.Sprintf("inproc://kvevents-wake-%d", wakeSeq.Add(1))
	rx, err := ctx.NewSocket(zmq.PAIR)
	if err == nil {
		err = rx.Bind(addr)
	}
	if err == nil {
		s.wakeTx, err = ctx.NewSocket(zmq.PAIR)
	}
	if err == nil {
		err = s.wakeTx.Connect(addr)
	}
	if err != nil {
		_ = ctx.Term()
		return nil, fmt.Errorf("kvevents: wake socket: %w", err)
	}
	go s.poll(rx) // rx belongs to the poller from here on
	return s, nil
}

// send hands a command to the poller and waits for its answer.
func (s *Subscriber) send(c command) cmdReply {
	c.reply = make(chan cmdReply, 1)
	s.cmds <- c
	s.wakeMu.Lock()
	_, err := s.wakeTx.SendBytes([]byte{0}, zmq.DONTWAIT)
	s.wakeMu.Unlock()
	// A full pipe (EAGAIN) means a wake-up is pending already. Anything else leaves the command
	// to the poller's next turn (its poll timeout), later than it should be: said once per error.
	if err != nil && zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
		if _, seen := s.wakeErrs.LoadOrStore(err.Error(), true); !seen {
			s.log.Error("kvevents: poller not woken; the command waits for its next poll", "err", err)
		}
	}
	return <-c.reply
}

// Add registers the stream's replica in the index (emptied, if it was there) and starts
// receiving: it connects the SUB (or joins a bound socket by topic) and replays the engine's ring
// from seq 0.
func (s *Subscriber) Add(cfg StreamConfig) error {
	ing := s.opts.Ingest
	if cfg.Ingest != nil {
		ing = *cfg.Ingest
	}
	key := StreamKey{cfg.Engine, cfg.Rank}
	if cfg.Engine == "" || cfg.Rank < 0 {
		return fmt.Errorf("kvevents: stream %v: engine name and a rank >= 0 are required", key)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if _, ok := s.streams[key]; ok {
		return fmt.Errorf("kvevents: stream %v already added", key)
	}
	ix := s.opts.Index
	id, err := ix.AddReplica(cfg.Engine, cfg.Rank)
	if err != nil {
		return fmt.Errorf("kvevents: stream %v: %w", key, err)
	}
	st := &stream{
		key: key, cfg: cfg, id: id, ix: ix, sub: s,
		queue: make(chan kvwire.Message, s.opts.QueueLen),
		kick:  make(chan struct{}, 1), lost: make(chan struct{}, 1), ctl: make(chan func()), stop: make(chan struct{}), done: make(chan struct{}),
		dec: kvwire.NewDecoder(),
	}
	var g *Ingester
	if g, err = newIngester(ix, id, ing, &st.c.ingest); err == nil {
		st.ing = g
		if s.opts.wrapApplier != nil {
			st.ing = s.opts.wrapApplier(g)
		}
		err = ix.Clear(id)
	}
	for t := range index.Tier(index.NumTiers) {
		lim := s.opts.MaxOffloadBlocks
		if t == index.GPU {
			lim = cmp.Or(cfg.MaxBlocks, s.opts.MaxBlocks)
		}
		if err == nil {
			err = ix.SetLimit(id, t, lim)
		}
	}
	if err == nil {
		st.c.state.Store(int32(Approximate))
		err = s.send(command{kind: cmdAdd, st: st}).err
	}
	if err != nil {
		_ = ix.RemoveReplica(id)
		return fmt.Errorf("kvevents: stream %v: %w", key, err)
	}
	s.streams[key] = st
	go st.run()
	return nil
}

// Remove stops a stream and removes its replica from the index.
func (s *Subscriber) Remove(engine string, rank int) error {
	key := StreamKey{engine, rank}
	s.mu.Lock()
	st, ok := s.streams[key]
	if ok {
		delete(s.streams, key)
	}
	closed := s.closed
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("kvevents: no stream %v", key)
	}
	if !closed {
		s.send(command{kind: cmdRemove, st: st})
	}
	close(st.stop)
	<-st.done
	return s.opts.Index.RemoveReplica(st.id)
}

// Restarted tells the stream that its engine process restarted (discovery saw the pod's restart
// count or start time change): the replica's entries are dropped at once, and the new process's
// ring is replayed from seq 0 (see the package doc).
func (s *Subscriber) Restarted(engine string, rank int) error {
	return s.do(engine, rank, func(st *stream) {
		st.c.restarts.Add(1)
		st.restart()
		st.havePrev = false
		// The new process may have published already (its first batches even applied, seen as
		// a seq going back): take its ring from seq 0 now rather than wait for a next batch.
		if st.cfg.ReplayEndpoint != "" {
			st.startReplay(0, false)
		} else {
			st.drainPending()
		}
	})
}

// Down tells the stream that its engine's health probe fails: the stream stops counting as
// exact at once (its blocks stay, scored approximately) and the engine is suspected of
// restarting until Up proves otherwise.
func (s *Subscriber) Down(engine string, rank int) error {
	return s.do(engine, rank, func(st *stream) { st.setDown() })
}

// Up tells the stream that its engine answers its health probe again. If batches were applied
// before the outage, the engine's ring is asked for the last of them: the same bytes mean the
// same process; anything else is a new process, whose blocks replace the old ones (see the
// package doc).
func (s *Subscriber) Up(engine string, rank int) error {
	return s.do(engine, rank, func(st *stream) { st.setUp() })
}

// QuietAfter and QuietHits: a stream whose engine answers QuietHits requests in a row, each of
// which must have stored a new full block and each QuietAfter or more after the stream's last
// applied batch, has a publisher that stopped (a prefill stores blocks, and vLLM publishes them
// within milliseconds). Several in a row, to ride out a batch that is merely late.
const (
	QuietAfter = 2 * time.Second
	QuietHits  = 3
)

// Served tells the stream that its engine answered a request; storedBlock says the answer must
// have stored a new full block, so that a publishing engine sent a BlockStored for it (the
// caller knows the engine's caching rule; fleet.MustStoreBlock). The stream owns the verdict:
// QuietHits such answers in a row, each QuietAfter or more past the last applied batch, mark it
// stale (Stale), logged once per mark. An answer that stores no block is no evidence either way.
func (s *Subscriber) Served(engine string, rank int, storedBlock bool) error {
	if !storedBlock {
		return nil
	}
	s.mu.Lock()
	st, ok := s.streams[StreamKey{engine, rank}]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("kvevents: no stream %v", StreamKey{engine, rank})
	}
	now := s.opts.Now()
	if last := st.c.lastApplied.Load(); last != 0 && now.Sub(time.Unix(0, last)) < QuietAfter {
		st.c.quiet.Store(0)
		return nil
	}
	st.c.lastQuiet.Store(now.UnixNano())
	if st.c.quiet.Add(1) < QuietHits || StreamState(st.c.state.Load()) != Exact {
		return nil
	}
	return s.do(engine, rank, func(st *stream) {
		if st.markStale() {
			last := st.c.lastApplied.Load()
			s.log.Warn("engine serves but publishes no KV events; replica scored approximately until they resume",
				"engine", engine, "rank", rank, "quiet_requests", st.c.quiet.Load(), "last_event", time.Unix(0, last))
		}
	})
}

// Stale tells the stream that its engine keeps serving requests that should have produced
// events, and none came: the publisher stalled or died. The stream is not exact until its next
// batch is applied in order (its blocks stay, scored approximately: a stalled publisher that
// resumes brings the index back without a repair).
func (s *Subscriber) Stale(engine string, rank int) error {
	return s.do(engine, rank, func(st *stream) { st.markStale() })
}

// markStale marks the stream stale; true when it was not already.
func (st *stream) markStale() bool {
	if st.stale {
		return false
	}
	st.c.staleMarks.Add(1)
	st.stale = true
	return true
}

// do runs f on the stream's worker and waits for it.
func (s *Subscriber) do(engine string, rank int, f func(*stream)) error {
	s.mu.Lock()
	st, ok := s.streams[StreamKey{engine, rank}]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("kvevents: no stream %v", StreamKey{engine, rank})
	}
	done := make(chan struct{})
	g := func() {
		f(st)
		close(done)
	}
	select {
	case st.ctl <- g:
		<-done
		return nil
	case <-st.done:
		return ErrClosed
	}
}

// Stats returns one stream's snapshot.
func (s *Subscriber) Stats(engine string, rank int) (Stats, bool) {
	s.mu.Lock()
	st, ok := s.streams[StreamKey{engine, rank}]
	s.mu.Unlock()
	if !ok {
		return Stats{}, false
	}
	return st.snapshot(), true
}

// BlockSize is the block size the stream learned from its first validated GPU event (0: none
// yet). One atomic read: the request path asks it per decision, where Stats would copy every
// counter.
func (s *Subscriber) BlockSize(engine string, rank int) int {
	s.mu.Lock()
	st, ok := s.streams[StreamKey{engine, rank}]
	s.mu.Unlock()
	if !ok {
		return 0
	}
	return int(st.c.ingest.blockSizeSet.Load())
}

// AllStats returns every stream's snapshot, ordered by engine and rank.
func (s *Subscriber) AllStats() []Stats {
	s.mu.Lock()
	out := make([]Stats, 0, len(s.streams))
	for _, st := range s.streams {
		out = append(out, st.snapshot())
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Engine != out[j].Engine {
			return out[i].Engine < out[j].Engine
		}
		return out[i].Rank < out[j].Rank
	})
	return out
}

// State returns one stream's state.
func (s *Subscriber) State(engine string, rank int) (StreamState, bool) {
	st, ok := s.Stats(engine, rank)
	return st.State, ok
}

// Unroutable counts messages on bound sockets whose topic named no stream.
func (s *Subscriber) Unroutable() uint64 { return s.unroutable.Load() }

// Bind opens a SUB bound to addr (bound mode: engines connect to the router) and returns the
// address it got (a "*" port resolved). Streams added with an empty Endpoint are fed from every
// bound socket by their Topic, which must then be unique.
func (s *Subscriber) Bind(addr string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", ErrClosed
	}
	r := s.send(command{kind: cmdBind, addr: addr})
	return r.addr, r.err
}

// Close stops every stream and closes every socket. The index keeps what was applied.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	streams := s.streams
	s.streams = map[StreamKey]*stream{}
	s.send(command{kind: cmdClose})
	s.mu.Unlock()
	<-s.done
	for _, st := range streams {
		close(st.stop)
		<-st.done
	}
	s.wakeMu.Lock()
	s.wakeTx.Close()
	s.wakeMu.Unlock()
	return s.ctx.Term()
}

// source is one polled SUB socket: a connected one feeds one stream; a bound one feeds the
// streams named by topic.
type source struct {
	soc   *zmq.Socket
	mon   *zmq.Socket // a connected SUB's monitor: its disconnections
	st    *stream     // nil for a bound socket
	bound bool
}

// maxBurst bounds how many messages one socket delivers per poll round, so a busy engine
// cannot starve the others.
const maxBurst = 256

// poll is the poller goroutine: it owns every SUB socket and the wake PAIR's receiving end.
func (s *Subscriber) poll(wake *zmq.Socket) {
	defer close(s.done)
	defer wake.Close()
	sources := map[*zmq.Socket]*source{}
	byStream := map[*stream]*source{}
	byTopic := map[string]*stream{}
	monitors := map[*zmq.Socket]*source{}
	s.monitors = monitors
	poller := zmq.NewPoller()
	poller.Add(wake, zmq.POLLIN)
	closeAll := func() {
		for soc, src := range sources {
			soc.Close()
			if src.mon != nil {
				src.mon.Close()
			}
		}
	}
	for {
		polled, err := poller.Poll(-1)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			closeAll()
			return
		}
		for _, p := range polled {
			if p.Socket == wake {
				for {
					if _, err := wake.RecvBytes(zmq.DONTWAIT); err != nil {
						break
					}
				}
				for pending := true; pending; {
					select {
					case c := <-s.cmds:
						if c.kind == cmdClose {
							closeAll()
							c.reply <- cmdReply{}
							return
						}
						c.reply <- s.exec(c, poller, sources, byStream, byTopic)
					default:
						pending = false
					}
				}
				continue
			}
			if src := monitors[p.Socket]; src != nil {
				s.disconnected(src, poller, sources, byStream)
				continue
			}
			src := sources[p.Socket]
			if src == nil {
				continue // removed in this round
			}
			for range maxBurst {
				frames, err := p.Socket.RecvMessageBytes(zmq.DONTWAIT)
				if err != nil {
					break // EAGAIN: drained
				}
				s.deliver(src, frames, byTopic)
			}
		}
	}
}

func (s *Subscriber) exec(c command, poller *zmq.Poller, sources map[*zmq.Socket]*source, byStream map[*stream]*source, byTopic map[string]*stream) cmdReply {
	switch c.kind {
	case cmdAdd:
		st := c.st
		if st.cfg.Endpoint == "" {
			if other, ok := byTopic[st.cfg.Topic]; ok {
				return cmdReply{err: fmt.Errorf("topic %q is already stream %v's", st.cfg.Topic, other.key)}
			}
			byTopic[st.cfg.Topic] = st
			return cmdReply{}
		}
		if err := s.connect(st, poller, sources, byStream); err != nil {
			return cmdReply{err: err}
		}
	case cmdRemove:
		if byTopic[c.st.cfg.Topic] == c.st {
			delete(byTopic, c.st.cfg.Topic)
		}
		if src, ok := byStream[c.st]; ok {
			s.disconnect(src, poller, sources, byStream)
		}
	case cmdBind:
		soc, err := s.newSub()
		if err != nil {
			return cmdReply{err: err}
		}
		addr := c.addr
		if err = soc.Bind(c.addr); err == nil {
			addr, err = soc.GetLastEndpoint()
		}
		if err != nil {
			soc.Close()
			return cmdReply{err: fmt.Errorf("kvevents: bind %s: %w", c.addr, err)}
		}
		sources[soc] = &source{soc: soc, bound: true}
		poller.Add(soc, zmq.POLLIN)
		return cmdReply{addr: addr}
	}
	return cmdReply{}
}

// connect opens the stream's SUB, with a monitor: libzmq reconnects a SUB by itself after a
// network error, but not after a protocol error, and a frame over MaxMsgSize is one: the
// connection is closed for good without a word to the reader.
func (s *Subscriber) connect(st *stream, poller *zmq.Poller, sources map[*zmq.Socket]*source, byStream map[*stream]*source) error {
	soc, err := s.newSub()
	if err != nil {
		return fmt.Errorf("connect %s: %w", st.cfg.Endpoint, err)
	}
	src := &source{soc: soc, st: st}
	addr := fmt.Sprintf("inproc://kvevents-sub-mon-%d", monitorSeq.Add(1))
	if err = soc.Monitor(addr, zmq.EVENT_DISCONNECTED); err == nil {
		if src.mon, err = s.ctx.NewSocket(zmq.PAIR); err == nil {
			_ = src.mon.SetLinger(0)
			err = src.mon.Connect(addr)
		}
	}
	if err == nil {
		err = soc.Connect(st.cfg.Endpoint)
	}
	if err != nil {
		soc.Close()
		if src.mon != nil {
			src.mon.Close()
		}
		return fmt.Errorf("connect %s: %w", st.cfg.Endpoint, err)
	}
	sources[soc], byStream[st] = src, src
	s.monitors[src.mon] = src
	poller.Add(soc, zmq.POLLIN)
	poller.Add(src.mon, zmq.POLLIN)
	return nil
}

func (s *Subscriber) disconnect(src *source, poller *zmq.Poller, sources map[*zmq.Socket]*source, byStream map[*stream]*source) {
	_ = poller.RemoveBySocket(src.soc)
	_ = poller.RemoveBySocket(src.mon)
	delete(sources, src.soc)
	delete(s.monitors, src.mon)
	delete(byStream, src.st)
	src.soc.Close()
	src.mon.Close()
}

// disconnected handles a SUB that lost its connection: a new SUB replaces it, since after a
// protocol error libzmq would not reconnect. Whatever was published meanwhile is a gap, found
// with the next message and repaired by replay.
func (s *Subscriber) disconnected(src *source, poller *zmq.Poller, sources map[*zmq.Socket]*source, byStream map[*stream]*source) {
	lost := false
	for {
		e, _, _, err := src.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			break
		}
		lost = lost || e == zmq.EVENT_DISCONNECTED
	}
	if !lost {
		return
	}
	st := src.st
	st.c.subReconnects.Add(1)
	s.disconnect(src, poller, sources, byStream)
	if err := s.connect(st, poller, sources, byStream); err != nil {
		s.log.Error("event stream lost: its SUB could not be opened again", "engine", st.key.Engine, "rank", st.key.Rank, "err", err)
	}
	select {
	case st.lost <- struct{}{}:
	default:
	}
}

func (s *Subscriber) newSub() (*zmq.Socket, error) {
	soc, err := s.ctx.NewSocket(zmq.SUB)
	if err != nil {
		return nil, err
	}
	_ = soc.SetLinger(0)
	_ = soc.SetRcvhwm(s.opts.RcvHWM)
	_ = soc.SetMaxmsgsize(s.opts.MaxMsgSize)
	_ = soc.SetReconnectIvl(s.opts.ReconnectIvl)
	_ = soc.SetReconnectIvlMax(s.opts.ReconnectIvlMax)
	// Everything is subscribed and the topic checked here, so a wrong topic is counted rather
	// than filtered silently by libzmq.
	if err := soc.SetSubscribe(""); err != nil {
		soc.Close()
		return nil, err
	}
	return soc, nil
}

// deliver routes one received message to its stream's queue.
func (s *Subscriber) deliver(src *source, frames [][]byte, byTopic map[string]*stream) {
	st := src.st
	if src.bound {
		if len(frames) == 0 {
			s.unroutable.Add(1)
			return
		}
		if st = byTopic[string(frames[0])]; st == nil {
			s.unroutable.Add(1)
			return
		}
	}
	st.c.received.Add(1)
	m, err := kvwire.ParseFrames(frames)
	if err != nil {
		st.c.malformedFrames.Add(1)
		return
	}
	if string(m.Topic) != st.cfg.Topic {
		st.c.topicMismatches.Add(1)
		return
	}
	st.enqueue(m)
}

// Snapshot returns every stream a peer could start from (see stream.export), each taken on its
// worker so its blocks match its last sequence number. Streams are taken one after another, not
// at one instant: each is consistent with itself, which is all a receiver needs (it confirms and
// continues each stream on its own).
func (s *Subscriber) Snapshot() []peersnap.Stream {
	s.mu.Lock()
	keys := make([]StreamKey, 0, len(s.streams))
	for k := range s.streams {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].Engine < keys[j].Engine || keys[i].Engine == keys[j].Engine && keys[i].Rank < keys[j].Rank
	})
	var out []peersnap.Stream
	for _, k := range keys {
		var sn peersnap.Stream
		var ok bool
		if err := s.do(k.Engine, k.Rank, func(st *stream) { sn, ok = st.export() }); err == nil && ok {
			out = append(out, sn)
		}
	}
	return out
}
