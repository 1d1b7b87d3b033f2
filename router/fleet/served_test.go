package fleet

import (
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
)

// testClock is real time plus an offset the test moves.
type testClock struct{ off atomic.Int64 }

func (c *testClock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *testClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// Served takes an engine for a silent publisher only on StaleHits block-storing answers in a
// row, each StaleAfter or more past the stream's last applied batch on the fleet's clock: an
// answer within StaleAfter starts the count again, and a prompt that stores no new block is no
// evidence. The third answer marks the stream stale (an exact stream is no longer exact).
func TestServedMarksAQuietPublisherStale(t *testing.T) {
	const bs = 16
	sub, err := kvevents.New(kvevents.Options{Index: index.New(index.Options{}), Ingest: kvevents.IngestOptions{BlockSize: bs}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	pub, err := kvtest.NewPublisher(kvtest.Options{Topic: "kv@127.0.0.1@m"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	if err := sub.Add(kvevents.StreamConfig{Engine: "e", Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Topic: pub.Topic()}); err != nil {
		t.Fatal(err)
	}
	if err := pub.WaitSubscribers(1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	cache, err := kvtest.NewCache(blockkey.AlgoSHA256, "0", bs)
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, 4*bs)
	for i := range toks {
		toks[i] = uint32(1000 + i)
	}
	ev, err := cache.Store(toks, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ev); err != nil {
		t.Fatal(err)
	}
	stats := func() kvevents.Stats { s, _ := sub.Stats("e", 0); return s }
	testkit.WaitFor(t, 10*time.Second, "the batch applied on an exact stream", func() bool {
		s := stats()
		return s.Applied > 0 && s.State == kvevents.Exact
	})

	// The fleet's clock starts a minute behind the stream's (real) one, so that the first
	// answers come within StaleAfter of the batch however slowly this machine runs.
	clk := &testClock{}
	clk.advance(-time.Minute)
	f := New(Options{Sub: sub, Now: clk.now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	rep := &Replica{Eng: &Engine{Name: "e"}, Rank: 0, Stream: true}
	serve := func(n, cached int) {
		for range n {
			f.Served(rep, 4*bs, cached, bs)
		}
	}
	serve(StaleHits+1, 0) // right after the batch: the publisher is keeping up
	if s := stats(); s.StaleMarks != 0 || rep.quiet.Load() != 0 {
		t.Fatalf("marked stale within StaleAfter of the last batch: %d marks, %d quiet answers", s.StaleMarks, rep.quiet.Load())
	}
	clk.advance(time.Minute + StaleAfter)
	serve(StaleHits, 3*bs) // a capped full hit stores no new block: no evidence
	serve(StaleHits-1, 0)
	if s := stats(); s.StaleMarks != 0 {
		t.Fatalf("stale after %d quiet answers, want %d", StaleHits-1, StaleHits)
	}
	serve(1, 0)
	testkit.WaitFor(t, 10*time.Second, "the stream marked stale", func() bool { return stats().StaleMarks == 1 })
	if s := stats(); s.State == kvevents.Exact {
		t.Fatalf("stream still exact after the stale mark: %+v", s)
	}
}
