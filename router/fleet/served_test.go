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

// testClock stands still until the test moves it.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// Served hands the stream the evidence; the stream takes its engine for a silent publisher only
// on QuietHits block-storing answers in a row, each QuietAfter or more past its last applied
// batch on the subscriber's clock: an answer within QuietAfter starts the count again, and a
// prompt that stores no new block is no evidence. The third answer marks the stream stale (an
// exact stream is no longer exact).
func TestServedMarksAQuietPublisherStale(t *testing.T) {
	const bs = 16
	clk := newTestClock()
	sub, err := kvevents.New(kvevents.Options{Index: index.New(index.Options{}), Ingest: kvevents.IngestOptions{BlockSize: bs}, Now: clk.now})
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

	f := New(Options{Sub: sub, Now: clk.now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	rep := &Replica{Eng: &Engine{Name: "e"}, Rank: 0, Stream: true}
	serve := func(n, cached int) {
		for range n {
			f.Served(rep, 4*bs, cached, bs)
		}
	}
	serve(kvevents.QuietHits+1, 0) // at the batch's instant: the publisher is keeping up
	if s := stats(); s.StaleMarks != 0 || s.QuietRequests != 0 {
		t.Fatalf("marked stale within QuietAfter of the last batch: %d marks, %d quiet answers", s.StaleMarks, s.QuietRequests)
	}
	clk.advance(kvevents.QuietAfter)
	serve(kvevents.QuietHits, 3*bs) // a capped full hit stores no new block: no evidence
	serve(kvevents.QuietHits-1, 0)
	if s := stats(); s.StaleMarks != 0 || s.QuietRequests != kvevents.QuietHits-1 || !s.LastQuiet.Equal(clk.now()) {
		t.Fatalf("after %d quiet answers: %d marks, %d quiet, last quiet %v; want no mark before %d", kvevents.QuietHits-1, s.StaleMarks, s.QuietRequests, s.LastQuiet, kvevents.QuietHits)
	}
	serve(1, 0)
	if s := stats(); s.StaleMarks != 1 || s.State == kvevents.Exact {
		t.Fatalf("stream still exact after the stale mark: %+v", s)
	}
}
