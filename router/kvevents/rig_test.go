package kvevents

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

const testBS = 16

// waitBound bounds a wait on a condition (a bound, not a sleep as synchronisation).
const waitBound = 10 * time.Second

// toks returns n distinct-looking token ids starting from a seed.
func toks(seed uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = seed*7919 + uint32(i)
	}
	return out
}

func newCache(t *testing.T) *kvtest.Cache {
	t.Helper()
	c, err := kvtest.NewCache(blockkey.AlgoSHA256, "0", testBS)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

type rig struct {
	t   *testing.T
	ix  *index.Index
	sub *Subscriber
}

func newRig(t *testing.T, opts Options) *rig {
	t.Helper()
	ix := index.New(index.Options{})
	opts.Index = ix
	if opts.Ingest.Parity == nil {
		opts.Ingest = IngestOptions{BlockSize: testBS, Parity: &Parity{Algo: blockkey.AlgoSHA256, Seed: "0", Every: 1}}
	}
	if opts.ReplayTimeout == 0 {
		opts.ReplayTimeout = 500 * time.Millisecond
	}
	sub, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sub.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return &rig{t: t, ix: ix, sub: sub}
}

func newPub(t *testing.T, o kvtest.Options) *kvtest.Publisher {
	t.Helper()
	if o.Topic == "" {
		o.Topic = fmt.Sprintf("kv@127.0.0.1@m%d", o.Rank)
	}
	p, err := kvtest.NewPublisher(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// add adds a stream fed by p and waits until its start-up replay is over and the SUB is
// subscribed, so what the test publishes next is live.
func (r *rig) add(engine string, p *kvtest.Publisher, rank int) {
	r.t.Helper()
	cfg := StreamConfig{Engine: engine, Rank: rank, Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Topic: p.Topic()}
	if err := r.sub.Add(cfg); err != nil {
		r.t.Fatal(err)
	}
	if p.ReplayEndpoint() != "" {
		r.waitStats(engine, rank, "start-up replay", func(s Stats) bool { return s.Replays >= 1 && s.State != Replaying })
	}
	if err := p.WaitSubscribers(1, 10*time.Second); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) stats(engine string, rank int) Stats {
	r.t.Helper()
	s, ok := r.sub.Stats(engine, rank)
	if !ok {
		r.t.Fatalf("no stream %s/%d", engine, rank)
	}
	return s
}

func (r *rig) waitStats(engine string, rank int, what string, cond func(Stats) bool) Stats {
	r.t.Helper()
	var s Stats
	testkit.WaitFor(r.t, waitBound, what, func() bool { s = r.stats(engine, rank); return cond(s) })
	return s
}

func (r *rig) id(engine string, rank int) index.ReplicaID {
	r.t.Helper()
	id, ok := r.ix.Replica(engine, rank)
	if !ok {
		r.t.Fatalf("no replica %s/%d", engine, rank)
	}
	return id
}

// waitMirror waits until the replica holds exactly the cache's blocks and the stream is in state.
func (r *rig) waitMirror(engine string, rank int, c *kvtest.Cache, state StreamState) Stats {
	r.t.Helper()
	id := r.id(engine, rank)
	var diff string
	var s Stats
	mirrored := func() bool {
		s = r.stats(engine, rank)
		diff = kvtest.Diff(r.ix, id, c.Resident())
		return diff == "" && s.State == state
	}
	// A bound, not a wait: a loaded CI machine replays 10,000-batch rings slowly.
	if !testkit.Until(30*time.Second, mirrored) {
		r.t.Fatalf("index never mirrored the engine in state %v: %s (state %v, stats %+v)", state, diff, s.State, s)
	}
	return s
}

func publish(t *testing.T, p *kvtest.Publisher, evs ...kvwire.Event) uint64 {
	t.Helper()
	seq, err := p.Publish(evs...)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

func lost(t *testing.T, p *kvtest.Publisher, evs ...kvwire.Event) uint64 {
	t.Helper()
	seq, err := p.PublishLost(evs...)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}
