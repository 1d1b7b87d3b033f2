package vllmsim

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// publisher is one rank's ZmqEventPublisher: it numbers batches from 0, encodes them, sends
// [topic, seq8, payload] on PUB and keeps the last BufferSteps batches for replay. One goroutine
// owns the PUB socket and another the ROUTER replay socket; they share the ring under mu.
type publisher struct {
	rank  int
	topic string
	shape eventShape
	kind  string        // Config.EngineKind: whose wire (kinds.go)
	enc   *eventEncoder // used by the send loop only
	// replayTopic sends the topic frame in replay replies (vLLM PR #45177, merged June 2026);
	// false gives the older [seq, payload] replies and [ff*8, ""] end marker.
	replayTopic bool
	drop        int // drop every Nth batch on PUB (fault switch)
	clock       func() float64
	// snapshot: the engine has a snapshot endpoint (vLLM PR #57789, docs/features/kv_events.md
	// read at commit 0aa3ce853c7d): every live and replay data frame's sequence is 24 bytes (seq
	// and this process's 16-byte publisher id, pid), and an idle publisher sends an empty batch
	// every heartbeat. pid is drawn at start and on every restart (a new process).
	snapshot  bool
	pid       [16]byte // under mu
	heartbeat time.Duration
	lastSend  time.Time // send loop only
	// snap is the snapshot ROUTER; rec what it answers from (under mu), fed with every batch
	// numbered, so a snapshot and the seq it names are one cut.
	snap     *zmq.Socket
	snapAddr string
	rec      recorder

	in      chan pubItem
	pub     *zmq.Socket
	replay  *zmq.Socket
	pubAddr string
	repAddr string
	quit    chan struct{}
	wg      sync.WaitGroup

	mu         sync.Mutex
	seq        uint64
	ring       []ringEntry // circular, len cap
	ringStart  int
	ringLen    int
	stallAfter int  // stall once this many batches went out (0 = never)
	sent       int  // batches numbered since start or restart
	stalled    bool // held batches wait for unstall
	held       []pubItem
	dropped    int
	gen        uint64 // send loop only
}

type ringEntry struct {
	seq     uint64
	payload []byte
}

type pubItem struct {
	ts  float64
	evs []simEvent
	ctl pubCtl
	gen uint64
}

type pubCtl int

const (
	ctlNone pubCtl = iota
	ctlRestart
	ctlStall
	ctlUnstall
)

// endpointForRank shifts a tcp endpoint's port by the rank, as vLLM's offset_endpoint_port.
func endpointForRank(endpoint string, rank int) (string, error) {
	if rank == 0 {
		return endpoint, nil
	}
	i := strings.LastIndex(endpoint, ":")
	if !strings.HasPrefix(endpoint, "tcp://") || i < 0 {
		return "", fmt.Errorf("endpoint %q: only tcp endpoints can be offset per DP rank", endpoint)
	}
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil || port+rank > 65535 {
		return "", fmt.Errorf("endpoint %q: bad port for rank %d", endpoint, rank)
	}
	return endpoint[:i+1] + strconv.Itoa(port+rank), nil
}

// bindAddr is tcp://host:port, with port -1 meaning "any free port" (ZMQ's wildcard).
func bindAddr(host string, port, rank int) string {
	if port < 0 {
		return "tcp://" + host + ":*"
	}
	return "tcp://" + host + ":" + strconv.Itoa(port+rank)
}

func newPublisher(cfg *Config, rank int, topic string) (*publisher, error) {
	shape, err := parseEventShape(cfg.EventLayout)
	if err != nil {
		return nil, err
	}
	p := &publisher{rank: rank, topic: topic, shape: shape, enc: newEventEncoder(), kind: cfg.kind(), replayTopic: !cfg.ReplayNoTopicFrame && cfg.kind() != KindSGLang, drop: cfg.DropEventEvery,
		stallAfter: cfg.StallEventsAfter, clock: cfg.eventClock, in: make(chan pubItem, 4096), quit: make(chan struct{}),
		ring: make([]ringEntry, cfg.BufferSteps), snapshot: cfg.KVSnapshotPort != 0, heartbeat: time.Second}
	p.newPID()
	if p.pub, err = zmq.NewSocket(zmq.PUB); err != nil {
		return nil, err
	}
	_ = p.pub.SetLinger(0)
	if err := p.pub.SetSndhwm(cfg.HWM); err != nil {
		p.close()
		return nil, err
	}
	if cfg.KVEventsConnect != "" {
		addr, err := endpointForRank(cfg.KVEventsConnect, rank)
		if err == nil {
			err = p.pub.Connect(addr)
		}
		if err != nil {
			p.close()
			return nil, fmt.Errorf("kv events connect: %w", err)
		}
		p.pubAddr = addr
	} else {
		addr, err := cfg.pubBindAddr(rank)
		if err == nil && ipv6Endpoint(addr) {
			err = p.pub.SetIpv6(true)
		}
		if err == nil {
			err = p.pub.Bind(addr)
		}
		if err != nil {
			p.close()
			return nil, fmt.Errorf("kv events bind rank %d: %w", rank, err)
		}
		p.pubAddr, _ = p.pub.GetLastEndpoint()
	}
	if cfg.KVReplayPort != 0 || cfg.KVReplayBind != "" {
		// vLLM sets no HWM on the replay ROUTER (kv_events.py ZmqEventPublisher._socket_setup), so
		// libzmq's default send HWM of 1000 applies; a replayer must read as it goes.
		if p.replay, err = zmq.NewSocket(zmq.ROUTER); err == nil {
			_ = p.replay.SetLinger(0)
			var addr string
			if addr, err = cfg.replayBindAddr(rank); err == nil && ipv6Endpoint(addr) {
				err = p.replay.SetIpv6(true)
			}
			if err == nil {
				err = p.replay.Bind(addr)
			}
		}
		if err != nil {
			p.close()
			return nil, fmt.Errorf("kv replay bind rank %d: %w", rank, err)
		}
		p.repAddr, _ = p.replay.GetLastEndpoint()
	}
	if p.snapshot {
		// Snapshot sockets bind, even when the PUB dials out (docs/features/kv_events.md).
		if p.snap, err = zmq.NewSocket(zmq.ROUTER); err == nil {
			_ = p.snap.SetLinger(0)
			err = p.snap.Bind(bindAddr(cfg.Host, cfg.KVSnapshotPort, rank))
		}
		if err != nil {
			p.close()
			return nil, fmt.Errorf("kv snapshot bind rank %d: %w", rank, err)
		}
		p.snapAddr, _ = p.snap.GetLastEndpoint()
	}
	return p, nil
}

func (p *publisher) start() {
	p.wg.Add(1)
	go p.sendLoop()
	if p.replay != nil {
		p.wg.Add(1)
		go p.replayLoop()
	}
	if p.snap != nil {
		p.wg.Add(1)
		go p.snapshotLoop()
	}
}

// close stops both loops and closes the sockets (each loop closes its own).
func (p *publisher) close() {
	select {
	case <-p.quit:
		return
	default:
	}
	close(p.quit)
	p.wg.Wait()
	for _, s := range []*zmq.Socket{p.pub, p.replay, p.snap} {
		if s != nil {
			_ = s.Close()
		}
	}
}

// publish queues one step's events; like vLLM's bounded queue it blocks when full.
func (p *publisher) publish(ctx context.Context, evs []simEvent, gen uint64) {
	p.enqueue(ctx, pubItem{ts: p.now(), evs: evs, gen: gen})
}

func (p *publisher) enqueue(ctx context.Context, it pubItem) {
	select {
	case p.in <- it:
	case <-ctx.Done():
	case <-p.quit:
	}
}

// restart starts generation gen: seq 0, empty ring, older batches discarded.
func (p *publisher) restart(gen uint64) {
	p.enqueue(context.Background(), pubItem{ctl: ctlRestart, gen: gen})
}

// setStalled stalls or resumes the PUB side; held batches go out in order on resume.
func (p *publisher) setStalled(stalled bool) {
	ctl := ctlUnstall
	if stalled {
		ctl = ctlStall
	}
	p.enqueue(context.Background(), pubItem{ctl: ctl})
}

func (p *publisher) sendLoop() {
	defer p.wg.Done()
	var tick <-chan time.Time
	if p.snapshot {
		t := time.NewTicker(p.heartbeat / 4)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-p.quit:
			return
		case it := <-p.in:
			p.handle(it)
		case now := <-tick:
			// An idle publisher's heartbeat: an empty batch with the next seq, held like any
			// other batch while the publisher is stalled.
			if !p.stalled && now.Sub(p.lastSend) >= p.heartbeat {
				p.handle(pubItem{ts: p.now(), gen: p.gen})
			}
		}
	}
}

func (p *publisher) now() float64 {
	if p.clock != nil {
		return p.clock()
	}
	return float64(time.Now().UnixMicro()) / 1e6
}

// newPID draws a publisher id for a new process lifetime.
func (p *publisher) newPID() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _ = rand.Read(p.pid[:])
}

// dataSeq is a data frame's sequence: 8 bytes, or with a snapshot endpoint 8 plus the publisher
// id (caller holds mu).
func (p *publisher) dataSeq(seq uint64) []byte {
	b := seqFrame(seq)
	if p.snapshot {
		b = append(b, p.pid[:]...)
	}
	return b
}

func (p *publisher) handle(it pubItem) {
	switch it.ctl {
	case ctlRestart:
		p.gen = it.gen
		p.mu.Lock()
		p.seq, p.sent, p.ringStart, p.ringLen, p.held = 0, 0, 0, 0, nil
		p.rec = recorder{}
		p.mu.Unlock()
		p.newPID()
		return
	case ctlStall:
		p.stalled = true
		return
	case ctlUnstall:
		p.stalled = false
		p.stallAfter = 0
		held := p.held
		p.held = nil
		for _, h := range held {
			p.send(h)
		}
		return
	}
	if it.gen < p.gen {
		return // produced before a restart
	}
	if p.stalled || (p.stallAfter > 0 && p.sent >= p.stallAfter) {
		p.stalled = true
		p.held = append(p.held, it)
		return
	}
	p.send(it)
}

func (p *publisher) send(it pubItem) {
	payload, err := p.enc.encodeKind(toWireBatch(it.ts, it.evs, p.rank), p.shape, p.kind)
	if err != nil {
		slog.Error("vllm-sim: encoding a KV event batch", "rank", p.rank, "err", err)
		return
	}
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.sent++
	i := (p.ringStart + p.ringLen) % len(p.ring)
	if p.ringLen == len(p.ring) {
		p.ringStart = (p.ringStart + 1) % len(p.ring)
	} else {
		p.ringLen++
	}
	p.ring[i] = ringEntry{seq: seq, payload: payload}
	if p.snapshot {
		p.rec.apply(it.evs)
	}
	drop := p.drop > 0 && (seq+1)%uint64(p.drop) == 0
	if drop {
		p.dropped++
	}
	seqB := p.dataSeq(seq)
	p.mu.Unlock()
	p.lastSend = time.Now()
	if drop {
		return
	}
	if _, err := p.pub.SendMessageDontwait([]byte(p.topic), seqB, payload); err != nil && !errors.Is(err, zmq.ETERM) && !errors.Is(err, zmq.Errno(syscall.EAGAIN)) {
		slog.Warn("vllm-sim: PUB send", "rank", p.rank, "err", err)
	}
}

// replayFrom copies the buffered batches with seq >= start, oldest first, with their sequence
// frames.
func (p *publisher) replayFrom(start uint64) (out []ringEntry, seqs [][]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.ringLen {
		e := p.ring[(p.ringStart+k)%len(p.ring)]
		if e.seq >= start {
			out = append(out, e)
			seqs = append(seqs, p.dataSeq(e.seq))
		}
	}
	return out, seqs
}

// replayLoop serves vLLM's replay protocol: [id, "", start_seq8] in; one
// [id, "", topic, seq8, payload] per buffered batch, then [id, "", "", ff*8, ""] (PR #45177);
// with ReplayNoTopicFrame the older [id, "", seq8, payload] and [id, "", ff*8, ""].
func (p *publisher) replayLoop() {
	defer p.wg.Done()
	poller := zmq.NewPoller()
	poller.Add(p.replay, zmq.POLLIN)
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		polled, err := poller.Poll(20 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		msg, err := p.replay.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			continue
		}
		if len(msg) != 3 || len(msg[1]) != 0 || len(msg[2]) != 8 {
			slog.Warn("vllm-sim: ignoring malformed replay request", "rank", p.rank, "frames", len(msg))
			continue
		}
		id, start := msg[0], binary.BigEndian.Uint64(msg[2])
		// With a snapshot endpoint the data replies carry the 24-byte sequence; the request and
		// the end marker keep 8 bytes.
		entries, seqs := p.replayFrom(start)
		for i, e := range entries {
			_, _ = p.replay.SendMessage(p.replayFrames(id, []byte(p.topic), seqs[i], e.payload)...)
		}
		_, _ = p.replay.SendMessage(p.replayFrames(id, []byte{}, seqFrame(replayEndSeq), []byte{})...)
	}
}

// replayEndSeq is the end marker's sequence number (vLLM's END_SEQ, -1 as 8 bytes).
const replayEndSeq = ^uint64(0)

func seqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq) }

// replayFrames is one ROUTER reply: identity, the empty delimiter, then topic (unless the
// topic frame is off), seq and payload.
func (p *publisher) replayFrames(id, topic, seq, payload []byte) []any {
	out := []any{id, []byte{}}
	if p.replayTopic {
		out = append(out, topic)
	}
	return append(out, seq, payload)
}

// SnapshotEndpoints are the bound snapshot ROUTER endpoints per rank, empty when snapshots are
// off.
func (s *Sim) SnapshotEndpoints() []string {
	var out []string
	for _, rk := range s.ranks {
		if rk.pub != nil && rk.pub.snap != nil {
			out = append(out, rk.pub.snapAddr)
		}
	}
	return out
}

// snapshotChunk bounds the events per snapshot chunk (one KVEventBatch each).
const snapshotChunk = 512

// snapshotLoop answers snapshot requests: "snapshot" in (from a DEALER, or with a REQ's empty
// delimiter); [seq, publisher id, chunk...] out, seq being the last batch the chunks include
// (-1 before the first).
func (p *publisher) snapshotLoop() {
	defer p.wg.Done()
	enc := newEventEncoder()
	poller := zmq.NewPoller()
	poller.Add(p.snap, zmq.POLLIN)
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		polled, err := poller.Poll(20 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		msg, err := p.snap.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil || len(msg) < 2 {
			continue
		}
		id, rest := msg[0], msg[1:]
		var head []any
		if len(rest) == 2 && len(rest[0]) == 0 { // REQ
			head, rest = []any{id, []byte{}}, rest[1:]
		} else {
			head = []any{id}
		}
		if len(rest) != 1 || string(rest[0]) != "snapshot" {
			slog.Warn("vllm-sim: ignoring malformed snapshot request", "rank", p.rank, "frames", len(msg))
			continue
		}
		p.mu.Lock()
		seq, pid := int64(p.seq)-1, p.pid // -1: no batch recorded yet
		evs := p.rec.events()
		p.mu.Unlock()
		ts := p.now()
		var chunks []any
		for len(evs) > 0 {
			n := min(len(evs), snapshotChunk)
			payload, err := enc.encode(toWireBatch(ts, evs[:n], p.rank), p.shape)
			if err != nil {
				slog.Error("vllm-sim: encoding a snapshot chunk", "rank", p.rank, "err", err)
				seq, chunks = -2, nil // unavailable
				break
			}
			chunks = append(chunks, payload)
			evs = evs[n:]
		}
		out := append(head, binary.BigEndian.AppendUint64(nil, uint64(seq)), pid[:])
		_, _ = p.snap.SendMessage(append(out, chunks...)...)
	}
}

// recorder is the event-derived cache state a snapshot is answered from, in the manner
// docs/features/kv_events.md describes for vLLM's: the BlockStored events still needed (a
// resident block's, or an ancestor a retained store chains from), and the copies resident per
// hash; a snapshot is the retained stores followed by removals of what they over-state.
type recorder struct {
	stores []simEvent
	live   map[string]int
}

func (r *recorder) apply(evs []simEvent) {
	if r.live == nil {
		r.live = map[string]int{}
	}
	for _, ev := range evs {
		switch ev.kind {
		case evStored:
			r.stores = append(r.stores, ev)
			for _, h := range ev.hashes {
				r.live[string(h)]++
			}
		case evRemoved:
			for _, h := range ev.hashes {
				if n := r.live[string(h)]; n > 1 {
					r.live[string(h)] = n - 1
				} else {
					delete(r.live, string(h))
				}
			}
		case evCleared: // the sim's pool is the GPU pool: everything goes
			r.stores = nil
			clear(r.live)
		}
	}
	if len(r.stores) > 2*len(r.live)+64 {
		r.compact()
	}
}

// compact drops the stores no resident block and no retained descendant needs (newest first:
// a store's parent is in an earlier store).
func (r *recorder) compact() {
	need := map[string]bool{}
	keep := make([]bool, len(r.stores))
	for i := len(r.stores) - 1; i >= 0; i-- {
		ev := r.stores[i]
		for _, h := range ev.hashes {
			if r.live[string(h)] > 0 || need[string(h)] {
				keep[i] = true
				break
			}
		}
		if keep[i] && ev.parent != nil {
			need[string(ev.parent)] = true
		}
	}
	kept := r.stores[:0]
	for i, ev := range r.stores {
		if keep[i] {
			kept = append(kept, ev)
		}
	}
	clear(r.stores[len(kept):])
	r.stores = kept
}

// events is the snapshot: the retained stores, then one removal per copy they state beyond the
// resident ones.
func (r *recorder) events() []simEvent {
	r.compact()
	out := slices.Clone(r.stores)
	stated := map[string]int{}
	for _, ev := range r.stores {
		for _, h := range ev.hashes {
			stated[string(h)]++
		}
	}
	rm := simEvent{kind: evRemoved}
	for _, ev := range r.stores {
		for _, h := range ev.hashes {
			if k := string(h); stated[k] > r.live[k] {
				stated[k]--
				rm.hashes = append(rm.hashes, h)
			}
		}
	}
	if len(rm.hashes) > 0 {
		out = append(out, rm)
	}
	return out
}
