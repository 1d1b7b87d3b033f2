package kvevents

import (
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

// An engine with a snapshot endpoint (vLLM PR #57789; docs/features/kv_events.md at commit
// 0aa3ce853c7d) frames every live and replay batch with a 24-byte sequence: seq and a 16-byte
// publisher id. Before the router read that framing such a batch indexed nothing.
func testPID(b byte) *kvwire.PublisherID {
	var p kvwire.PublisherID
	for i := range p {
		p[i] = b + byte(i)
	}
	return &p
}

func TestPublisherIDFramesAreIndexed(t *testing.T) {
	r := newRig(t, Options{})
	pid := testPID(0x40)
	p := newPub(t, kvtest.Options{Publisher: pid})
	c := newCache(t)
	st := must[kvwire.Event](t)
	// One batch before the router starts (taken by the start-up replay, also 24-byte framed),
	// one live.
	publish(t, p, st(c.Store(toks(1, 3*testBS), 0)))
	r.add("e", p, 0)
	publish(t, p, st(c.Store(toks(2, 2*testBS), 0)))
	s := r.waitMirror("e", 0, c, Exact)
	if s.BlocksStored != 5 || s.Publisher != hex.EncodeToString(pid[:]) {
		t.Fatalf("stored %d blocks, publisher %q; want 5 and %x", s.BlocksStored, s.Publisher, pid[:])
	}
}

// A new engine process draws a new publisher id. When its seq has already passed the old
// process's (its first batches lost, or only heartbeats while the SUB reconnected) nothing on
// the seq shows the restart, and a replay from the old process's next seq would graft the new
// process's batches onto the old one's blocks. The id shows it: the replica is reset and the new
// ring taken from seq 0.
func TestChangedPublisherIDIsARestart(t *testing.T) {
	r := newRig(t, Options{})
	p := newPub(t, kvtest.Options{Publisher: testPID(0x10)})
	c := newCache(t)
	st := must[kvwire.Event](t)
	r.add("e", p, 0)
	publish(t, p, st(c.Store(toks(1, 2*testBS), 0)))
	r.waitMirror("e", 0, c, Exact)

	p.Restart()
	c = newCache(t)
	lost(t, p, st(c.Store(toks(5, 2*testBS), 0)))
	lost(t, p)                                       // a heartbeat
	publish(t, p, st(c.Store(toks(6, 1*testBS), 0))) // seq 2: above the old process's 0
	s := r.waitMirror("e", 0, c, Exact)
	if s.PublisherRestarts != 1 || s.Resets != 1 || s.Backwards != 0 || s.SilentRestarts != 0 {
		t.Fatalf("publisher restarts %d resets %d backwards %d silent %d; want 1 1 0 0",
			s.PublisherRestarts, s.Resets, s.Backwards, s.SilentRestarts)
	}
	newID, _ := p.PublisherID()
	if s.Publisher != hex.EncodeToString(newID[:]) {
		t.Fatalf("publisher %s, want the new process's %x", s.Publisher, newID[:])
	}
}

// Heartbeats are empty batches: they advance the seq and keep the stream live; when they stop
// the stream is stalled (not exact) until a batch comes again.
func TestSilentHeartbeatStreamIsStalled(t *testing.T) {
	r := newRig(t, Options{StallAfter: 200 * time.Millisecond})
	p := newPub(t, kvtest.Options{Publisher: testPID(0x20)})
	c := newCache(t)
	st := must[kvwire.Event](t)
	r.add("e", p, 0)
	publish(t, p, st(c.Store(toks(1, 2*testBS), 0)))
	publish(t, p) // heartbeat
	r.waitStats("e", 0, "heartbeat applied", func(s Stats) bool { return s.Heartbeats == 1 && s.State == Exact })

	s := r.waitStats("e", 0, "stall", func(s Stats) bool { return s.Stalled })
	if s.State != Inexact || s.Stalls != 1 {
		t.Fatalf("stalled stream: state %v stalls %d; want inexact, 1", s.State, s.Stalls)
	}
	if ist, _ := r.ix.Stats(r.id("e", 0)); ist.Blocks[0] != 2 {
		t.Fatalf("a stall dropped the replica's blocks (%d left); it only stops trusting them", ist.Blocks[0])
	}
	publish(t, p) // the engine is back, nothing was lost
	s = r.waitStats("e", 0, "exact again", func(s Stats) bool { return !s.Stalled && s.State == Exact })
	if s.Heartbeats != 2 {
		t.Fatalf("heartbeats %d, want 2", s.Heartbeats)
	}
}

// An engine without a publisher id sends no heartbeats: its silence says nothing.
func TestNoPublisherIDNeverStalls(t *testing.T) {
	sub := &Subscriber{opts: Options{StallAfter: time.Second}}
	st := &stream{sub: sub, lastRecv: time.Unix(100, 0)}
	st.checkStall(time.Unix(200, 0))
	if st.stalled || st.c.stalls.Load() != 0 {
		t.Fatal("a stream without heartbeats was stalled")
	}
	st.havePID = true
	st.checkStall(time.Unix(100, 0).Add(time.Second)) // at the limit, not past it
	if st.stalled {
		t.Fatal("stalled at the limit")
	}
}

// An engine whose snapshot endpoint does not answer: the failure is counted and the stream takes
// the ring from seq 0 as it would without one.
func TestSnapshotFailureFallsBackToTheRing(t *testing.T) {
	r := newRig(t, Options{SnapshotTimeout: 200 * time.Millisecond})
	p := newPub(t, kvtest.Options{Publisher: testPID(0x30)})
	c := newCache(t)
	st := must[kvwire.Event](t)
	publish(t, p, st(c.Store(toks(1, 2*testBS), 0)))
	silent := fmt.Sprintf("tcp://127.0.0.1:%d", testkit.FreePort(t)) // nothing listens there
	if err := r.sub.Add(StreamConfig{Engine: "e", Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(),
		SnapshotEndpoint: silent, Topic: p.Topic()}); err != nil {
		t.Fatal(err)
	}
	s := r.waitMirror("e", 0, c, Exact)
	if s.Snapshots != 1 || s.SnapshotFailures != 1 || s.SnapshotsInstalled != 0 || s.Replays != 1 {
		t.Fatalf("snapshots %d failures %d installed %d replays %d; want 1 1 0 1", s.Snapshots, s.SnapshotFailures, s.SnapshotsInstalled, s.Replays)
	}
}

// After an outage the publisher id decides: the ring's answer with the same id is the same
// process whatever the seq did; another id is a restart, counted as such.
func TestOutageIdentityByPublisherID(t *testing.T) {
	for _, restarted := range []bool{false, true} {
		t.Run(fmt.Sprint("restarted=", restarted), func(t *testing.T) {
			r := newRig(t, Options{})
			p := newPub(t, kvtest.Options{Topic: "kv@pid@m", Publisher: testPID(0x50)})
			r.add("e", p, 0)
			eng := newEngineSim(t, p, 20, 4096)
			eng.publish(10)
			r.waitMirror("e", 0, eng.cache, Exact)
			if err := r.sub.Down("e", 0); err != nil {
				t.Fatal(err)
			}
			if restarted {
				p.Restart()
				eng = newEngineSim(t, p, 21, 4096)
			}
			for range 20 { // published while away: the seq jumps past 10 either way
				if _, err := p.PublishLost(eng.batch()...); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.sub.Up("e", 0); err != nil {
				t.Fatal(err)
			}
			s := r.waitMirror("e", 0, eng.cache, Exact)
			want := uint64(0)
			if restarted {
				want = 1
			}
			if s.PublisherRestarts != want || s.SilentRestarts != 0 || s.Resets != want {
				t.Fatalf("publisher restarts %d silent %d resets %d; want %d 0 %d", s.PublisherRestarts, s.SilentRestarts, s.Resets, want, want)
			}
		})
	}
}
