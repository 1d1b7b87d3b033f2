package kvevents

import (
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

// snapServer answers snapshot requests on a ROUTER with whatever the test last set.
type snapServer struct {
	mu   sync.Mutex
	sn   kvwire.Snapshot
	addr string
	asks int
}

func newSnapServer(t *testing.T, sn kvwire.Snapshot) *snapServer {
	t.Helper()
	soc, err := zmq.NewSocket(zmq.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	_ = soc.SetLinger(0)
	if err := soc.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	s := &snapServer{sn: sn}
	s.addr, _ = soc.GetLastEndpoint()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer soc.Close()
		poller := zmq.NewPoller()
		poller.Add(soc, zmq.POLLIN)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if polled, _ := poller.Poll(20 * time.Millisecond); len(polled) == 0 {
				continue
			}
			msg, err := soc.RecvMessageBytes(0)
			if err != nil || !kvwire.IsSnapshotRequest(msg[1:]) {
				continue
			}
			s.mu.Lock()
			s.asks++
			out := append([][]byte{msg[0]}, kvwire.SnapshotReplyFrames(s.sn)...)
			s.mu.Unlock()
			_, _ = soc.SendMessage(out)
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return s
}

func (s *snapServer) set(sn kvwire.Snapshot) { s.mu.Lock(); s.sn = sn; s.mu.Unlock() }

// A gap the ring no longer covers, on an engine with a snapshot endpoint: instead of going
// inexact the stream rebuilds the replica from a snapshot and is exact again, the held live
// batch it already covers dropped as a duplicate.
func TestUncoverableGapRebuiltFromSnapshot(t *testing.T) {
	r := newRig(t, Options{})
	pid := testPID(0x60)
	p := newPub(t, kvtest.Options{Ring: 2, Publisher: pid})
	srv := newSnapServer(t, kvwire.Snapshot{Seq: kvwire.SnapshotNone, Publisher: *pid})
	if err := r.sub.Add(StreamConfig{Engine: "e", Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(),
		SnapshotEndpoint: srv.addr, Topic: p.Topic()}); err != nil {
		t.Fatal(err)
	}
	r.waitStats("e", 0, "the start-up snapshot (an engine that published nothing)", func(s Stats) bool {
		return s.SnapshotsInstalled == 1 && s.State == Exact
	})
	if err := p.WaitSubscribers(1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	c := newCache(t)
	st := must[kvwire.Event](t)
	prompts := [][]uint32{toks(1, 2*testBS), toks(2, 3*testBS), toks(3, 2*testBS), toks(4, 1*testBS), toks(5, 2*testBS)}
	publish(t, p, st(c.Store(prompts[0], 0)))
	r.waitMirror("e", 0, c, Exact)
	for _, pr := range prompts[1:4] {
		lost(t, p, st(c.Store(pr, 0))) // seqs 1..3; the 2-batch ring keeps 2 and 3
	}
	// The engine's snapshot through seq 4: every resident block, as stores from block 0.
	snapCache := newCache(t)
	var evs []kvwire.Event
	for _, pr := range prompts {
		evs = append(evs, st(snapCache.Store(pr, 0)))
	}
	payload, err := kvwire.NewEncoder().AppendBatch(nil, &kvwire.Batch{TS: 9, Events: evs, DataParallelRank: kvwire.Some(int64(0))}, kvwire.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	srv.set(kvwire.Snapshot{Seq: 4, Publisher: *pid, Chunks: [][]byte{payload}})
	publish(t, p, st(c.Store(prompts[4], 0))) // seq 4: the gap shows
	s := r.waitMirror("e", 0, c, Exact)
	if s.SnapshotsInstalled != 2 || s.Uncoverable != 0 || s.Resets != 0 || s.Duplicates != 1 || s.LastSeq != 4 {
		t.Fatalf("installed %d uncoverable %d resets %d duplicates %d last seq %d; want 2 0 0 1 4",
			s.SnapshotsInstalled, s.Uncoverable, s.Resets, s.Duplicates, s.LastSeq)
	}
	// And on from there.
	publish(t, p, st(c.Store(toks(6, testBS), 0)))
	r.waitMirror("e", 0, c, Exact)
}
