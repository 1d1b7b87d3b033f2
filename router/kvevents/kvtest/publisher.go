// Package kvtest is a stand-in for one vLLM engine's KV-event side, for tests over real ZMQ
// sockets: Publisher binds a PUB (XPUB, so a test can wait for its subscribers) and a ROUTER
// replay socket with a ring of past batches, framed as vLLM with #45177 (June 2026) does; Cache
// models an engine's prefix cache and builds the events it would publish, with real vLLM block
// hashes.
package kvtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/router/engine"
	"github.com/kvroute/kvroute/router/kvwire"
)

// Options configure a Publisher.
type Options struct {
	Topic  string
	Rank   int
	Layout kvwire.Layout // LayoutMap when unset
	// Ring is how many batches the replay ring keeps (vLLM's buffer_steps); 10000 when 0.
	Ring int
	// NoReplay: no ROUTER socket (vLLM without replay_endpoint).
	NoReplay bool
	// Connect, when set, makes the PUB dial this address instead of binding (vLLM with a concrete
	// host in its endpoint, for a router in bound mode).
	Connect string
	// ReplayDelay delays every replay answer (a busy engine's publisher thread).
	ReplayDelay time.Duration
	// Publisher, when set, is sent after the seq in 24-byte sequence frames, as vLLM with a
	// snapshot endpoint does (docs/features/kv_events.md, PR #57789); Restart then draws a new
	// one, as a new engine process would.
	Publisher *kvwire.PublisherID
	// Kind, when not vLLM, encodes batches as that engine does (kvwire.AppendEngineBatch) and,
	// for SGLang, answers replays without the topic frame, as SGLang's publisher does.
	Kind engine.Kind
}

// Publisher publishes batches on a PUB socket and serves replays from its ring. Safe for
// concurrent use: every use of the PUB socket holds mu; the ROUTER is owned by its goroutine.
type Publisher struct {
	opts   Options
	ctx    *zmq.Context
	mu     sync.Mutex
	pub    *zmq.Socket
	enc    *kvwire.Encoder
	seq    uint64
	ring   []kvwire.Message
	subs   int
	ts     float64
	router *zmq.Socket

	endpoint, replayEndpoint string
	stop                     chan struct{}
	done                     chan struct{}

	// ReplayRequests counts the replay requests served.
	ReplayRequests atomic.Uint64
}

// NewPublisher binds the sockets on 127.0.0.1 with ports the kernel picks.
func NewPublisher(opts Options) (*Publisher, error) {
	if opts.Layout == kvwire.LayoutUnknown {
		opts.Layout = kvwire.LayoutMap
	}
	if opts.Ring <= 0 {
		opts.Ring = 10000
	}
	ctx, err := zmq.NewContext()
	if err != nil {
		return nil, err
	}
	p := &Publisher{opts: opts, ctx: ctx, enc: kvwire.NewEncoder(), ts: 1767225600, stop: make(chan struct{}), done: make(chan struct{})}
	if err := p.open(); err != nil {
		_ = ctx.Term()
		return nil, err
	}
	go p.serve()
	return p, nil
}

func (p *Publisher) open() error {
	var err error
	if p.pub, err = p.ctx.NewSocket(zmq.XPUB); err != nil {
		return err
	}
	_ = p.pub.SetLinger(0)
	_ = p.pub.SetXpubVerbose(1) // every subscription, not just the first of a topic
	_ = p.pub.SetSndhwm(1000000)
	if p.opts.Connect != "" {
		err = p.pub.Connect(p.opts.Connect)
		p.endpoint = p.opts.Connect
	} else if err = p.pub.Bind("tcp://127.0.0.1:*"); err == nil {
		p.endpoint, err = p.pub.GetLastEndpoint()
	}
	if err != nil {
		p.pub.Close()
		return fmt.Errorf("kvtest: pub: %w", err)
	}
	if p.opts.NoReplay {
		return nil
	}
	if p.router, err = p.ctx.NewSocket(zmq.ROUTER); err == nil {
		// The send HWM stays at libzmq's default (1,000), as vLLM leaves it: a replay burst longer
		// than the pipe loses batches, which the router must repair by asking again.
		_ = p.router.SetLinger(0)
		if err = p.router.Bind("tcp://127.0.0.1:*"); err == nil {
			p.replayEndpoint, err = p.router.GetLastEndpoint()
		}
	}
	if err != nil {
		p.pub.Close()
		if p.router != nil {
			p.router.Close()
		}
		return fmt.Errorf("kvtest: replay: %w", err)
	}
	return nil
}

// Endpoint is the PUB address (tcp://127.0.0.1:PORT), or the Connect address.
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint is the ROUTER address, "" with NoReplay.
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// Topic is the topic every message carries.
func (p *Publisher) Topic() string { return p.opts.Topic }

// NextSeq is the sequence number the next batch gets.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// WaitSubscribers waits until n subscriptions reached the PUB (XPUB) or the timeout passes, so a
// test does not publish into a connection ZMQ has not finished (the slow-joiner problem).
func (p *Publisher) WaitSubscribers(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	p.mu.Lock()
	defer p.mu.Unlock()
	poller := zmq.NewPoller()
	poller.Add(p.pub, zmq.POLLIN)
	for p.subs < n {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("kvtest: %d of %d subscribers after %v", p.subs, n, timeout)
		}
		polled, err := poller.Poll(min(left, 50*time.Millisecond))
		if err != nil {
			return err
		}
		if len(polled) == 0 {
			continue
		}
		msg, err := p.pub.RecvBytes(zmq.DONTWAIT)
		if err == nil && len(msg) > 0 && msg[0] == 1 {
			p.subs++
		}
	}
	return nil
}

// Publish sends one batch with the next seq and keeps it in the ring; it returns its seq.
func (p *Publisher) Publish(events ...kvwire.Event) (uint64, error) { return p.publish(true, events) }

// PublishLost assigns the next seq and keeps the batch in the ring without sending it: a batch
// lost on the way (PUB HWM, slow joiner), which replay can still repair.
func (p *Publisher) PublishLost(events ...kvwire.Event) (uint64, error) {
	return p.publish(false, events)
}

func (p *Publisher) publish(send bool, events []kvwire.Event) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ts += 0.25
	b := kvwire.Batch{TS: p.ts, Events: events, DataParallelRank: kvwire.Some(int64(p.opts.Rank))}
	var payload []byte
	var err error
	if k := p.opts.Kind.Or(engine.VLLM); k != engine.VLLM {
		payload, err = p.enc.AppendEngineBatch(nil, &b, k, kvwire.LayoutUnknown)
	} else {
		payload, err = p.enc.AppendBatch(nil, &b, p.opts.Layout)
	}
	if err != nil {
		return 0, err
	}
	return p.sendLocked(send, payload)
}

// PublishPayload sends an arbitrary payload (a malformed one, say) with the next seq.
func (p *Publisher) PublishPayload(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sendLocked(true, append([]byte(nil), payload...))
}

func (p *Publisher) sendLocked(send bool, payload []byte) (uint64, error) {
	m := kvwire.Message{Topic: []byte(p.opts.Topic), Seq: p.seq, Payload: payload}
	if p.opts.Publisher != nil {
		m.Publisher, m.HasPublisher = *p.opts.Publisher, true
	}
	if send {
		if _, err := p.pub.SendMessage(m.Frames()); err != nil {
			return 0, fmt.Errorf("kvtest: send: %w", err)
		}
	}
	p.seq++
	if len(p.ring) == 2*p.opts.Ring { // amortized: keep the last Ring-1, drop the rest at once
		p.ring = append(p.ring[:0], p.ring[len(p.ring)-p.opts.Ring+1:]...)
	}
	p.ring = append(p.ring, m)
	return m.Seq, nil
}

// SendFrames sends arbitrary frames without touching seq or the ring (malformed framing).
func (p *Publisher) SendFrames(frames ...[]byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.pub.SendMessage(frames)
	return err
}

// Restart models an engine process restart: seq starts again at 0 and the ring is empty (the
// sockets stay, as a restarted pod keeps its address).
func (p *Publisher) Restart() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq = 0
	p.ring = p.ring[:0]
	if p.opts.Publisher != nil {
		next := *p.opts.Publisher
		next[0]++ // any other id: what matters is that it differs
		p.opts.Publisher = &next
	}
}

// PublisherID is the id sent in 24-byte sequence frames (ok false without Options.Publisher).
func (p *Publisher) PublisherID() (kvwire.PublisherID, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.opts.Publisher == nil {
		return kvwire.PublisherID{}, false
	}
	return *p.opts.Publisher, true
}

// serve answers replay requests as vLLM's publisher thread does: every buffered batch with
// seq >= the asked one, oldest first, then the end marker.
func (p *Publisher) serve() {
	defer close(p.done)
	if p.router == nil {
		<-p.stop
		return
	}
	defer p.router.Close()
	poller := zmq.NewPoller()
	poller.Add(p.router, zmq.POLLIN)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		polled, err := poller.Poll(20 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		frames, err := p.router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			continue
		}
		id, from, err := kvwire.ParseReplayRequest(frames)
		if err != nil {
			continue // vLLM logs and ignores a malformed request
		}
		p.ReplayRequests.Add(1)
		if p.opts.ReplayDelay > 0 {
			time.Sleep(p.opts.ReplayDelay)
		}
		p.mu.Lock()
		var out []kvwire.Message
		for _, m := range p.ring[max(0, len(p.ring)-p.opts.Ring):] {
			if m.Seq >= from {
				out = append(out, m)
			}
		}
		p.mu.Unlock()
		if p.opts.Kind == engine.SGLang { // [identity, "", seq, payload]: no topic frame
			for _, m := range out {
				_, _ = p.router.SendMessage(id, []byte{}, binary.BigEndian.AppendUint64(nil, m.Seq), m.Payload)
			}
			_, _ = p.router.SendMessage(id, []byte{}, binary.BigEndian.AppendUint64(nil, kvwire.EndSeq), []byte{})
			continue
		}
		for _, m := range out {
			_, _ = p.router.SendMessage(kvwire.ReplayReplyFrames(id, m))
		}
		_, _ = p.router.SendMessage(kvwire.ReplayEndFrames(id))
	}
}

// Close stops the replay goroutine and closes both sockets.
func (p *Publisher) Close() error {
	select {
	case <-p.stop:
		return errors.New("kvtest: publisher already closed")
	default:
	}
	close(p.stop)
	<-p.done
	p.mu.Lock()
	p.pub.Close()
	p.mu.Unlock()
	return p.ctx.Term()
}
