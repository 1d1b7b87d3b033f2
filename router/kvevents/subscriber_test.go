package kvevents

import (
	"encoding/binary"
	"testing"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

func TestGapRepairedByReplay(t *testing.T) {
	r := newRig(t, Options{})
	p := newPub(t, kvtest.Options{})
	c := newCache(t)
	r.add("e", p, 0)
	// The start-up replay answered (the stream is exact on the empty ring) before anything is
	// published: a reply still in flight would bring the lost batches itself, and no gap be seen.
	r.waitStats("e", 0, "exact on the empty ring", func(s Stats) bool { return s.State == Exact })
	st := must[kvwire.Event](t)

	a, b := toks(1, 4*testBS), toks(2, 3*testBS)
	publish(t, p, st(c.Store(a, 0)))
	lost(t, p, st(c.Store(b, 0)))           // lost on the wire
	lost(t, p, st(c.Evict(c.Hashes(a)[3]))) // lost too: without replay it would stay a phantom
	publish(t, p, st(c.Store(append(a[:3*testBS:3*testBS], toks(3, testBS)...), 3)))

	s := r.waitMirror("e", 0, c, Exact)
	if s.Gaps != 1 || s.Replays != 2 || s.ReplayedBatches < 3 || s.LastSeq != 3 {
		t.Errorf("gaps %d replays %d replayed %d last %d; want 1, 2 (start-up + gap), >= 3, 3", s.Gaps, s.Replays, s.ReplayedBatches, s.LastSeq)
	}
	if s.ParityChecked == 0 || s.ParityMismatches != 0 {
		t.Errorf("parity checked %d, mismatches %d", s.ParityChecked, s.ParityMismatches)
	}
}

func TestOverflowIsAGapRepairedByReplay(t *testing.T) {
	r := newRig(t, Options{QueueLen: 2})
	p := newPub(t, kvtest.Options{})
	c := newCache(t)
	r.add("e", p, 0)
	st := must[kvwire.Event](t)

	// Hold the worker so the poller fills the queue and must drop.
	r.sub.mu.Lock()
	w := r.sub.streams[StreamKey{"e", 0}]
	r.sub.mu.Unlock()
	release := make(chan struct{})
	held := make(chan struct{})
	w.ctl <- func() { close(held); <-release }
	<-held
	const n = 12
	for i := range n {
		publish(t, p, st(c.Store(toks(uint32(10+i), 2*testBS), 0)))
	}
	r.waitStats("e", 0, "overflow", func(s Stats) bool { return s.Overflows == n-2 })
	close(release)

	s := r.waitMirror("e", 0, c, Exact)
	if s.Gaps == 0 || s.ReplayedBatches < n-2 || s.LastSeq != n-1 {
		t.Errorf("gaps %d replayed %d last %d; want > 0, >= %d, %d", s.Gaps, s.ReplayedBatches, s.LastSeq, n-2, n-1)
	}
}

func TestOverflowOfTheLastMessageIsRepaired(t *testing.T) {
	// The dropped batch is the last one: no later seq reveals the gap, the overflow mark must.
	r := newRig(t, Options{QueueLen: 1})
	p := newPub(t, kvtest.Options{})
	c := newCache(t)
	r.add("e", p, 0)
	st := must[kvwire.Event](t)
	r.sub.mu.Lock()
	w := r.sub.streams[StreamKey{"e", 0}]
	r.sub.mu.Unlock()
	release, held := make(chan struct{}), make(chan struct{})
	w.ctl <- func() { close(held); <-release }
	<-held
	publish(t, p, st(c.Store(toks(1, testBS), 0)))
	publish(t, p, st(c.Store(toks(2, testBS), 0)))
	r.waitStats("e", 0, "overflow", func(s Stats) bool { return s.Overflows == 1 })
	close(release)
	s := r.waitMirror("e", 0, c, Exact)
	if s.Gaps != 1 || s.LastSeq != 1 {
		t.Errorf("gaps %d last %d; want 1, 1", s.Gaps, s.LastSeq)
	}
}

func TestRestartedMakesInexactThenFreshStreamHeals(t *testing.T) {
	r := newRig(t, Options{})
	p := newPub(t, kvtest.Options{})
	c := newCache(t)
	r.add("e", p, 0)
	st := must[kvwire.Event](t)
	publish(t, p, st(c.Store(toks(1, 3*testBS), 0)))
	publish(t, p, st(c.Store(toks(2, 2*testBS), 0)))
	r.waitMirror("e", 0, c, Exact)

	// Discovery saw the pod restart (the old process is gone, the new one has published
	// nothing yet): the replica is emptied at once, and the new ring (empty) replayed from 0.
	p.Restart()
	if err := r.sub.Restarted("e", 0); err != nil {
		t.Fatal(err)
	}
	s := r.stats("e", 0)
	if s.State == Exact && s.Replays < 2 || s.Restarts != 1 {
		t.Fatalf("after Restarted: state %v restarts %d replays %d; want not exact before the new ring's replay, 1", s.State, s.Restarts, s.Replays)
	}
	if ist, _ := r.ix.Stats(r.id("e", 0)); ist.Blocks[0] != 0 {
		t.Fatalf("replica holds %d blocks after Restarted", ist.Blocks[0])
	}

	// The new process starts at seq 0; its first batch was lost, the second reveals the gap and
	// the replay from seq 0 heals the stream.
	c = newCache(t)
	lost(t, p, st(c.Store(toks(3, 2*testBS), 0)))
	publish(t, p, st(c.Store(toks(4, 2*testBS), 0)))
	s = r.waitMirror("e", 0, c, Exact)
	if s.Partial || s.LastSeq != 1 {
		t.Errorf("partial %v last %d", s.Partial, s.LastSeq)
	}
}

func TestSequenceGoingBackwardsIsARestart(t *testing.T) {
	r := newRig(t, Options{})
	p := newPub(t, kvtest.Options{})
	c := newCache(t)
	r.add("e", p, 0)
	st := must[kvwire.Event](t)
	for i := range 3 {
		publish(t, p, st(c.Store(toks(uint32(1+i), 2*testBS), 0)))
	}
	r.waitMirror("e", 0, c, Exact)

	p.Restart() // no Restarted call: the wire alone shows it
	c = newCache(t)
	publish(t, p, st(c.Store(toks(9, 2*testBS), 0)))
	s := r.waitMirror("e", 0, c, Exact) // old blocks gone, new ones in
	if s.Backwards != 1 || s.Resets != 1 || s.LastSeq != 0 {
		t.Errorf("backwards %d resets %d last %d; want 1, 1, 0", s.Backwards, s.Resets, s.LastSeq)
	}
}

func TestDuplicatesAndFullModeReannouncements(t *testing.T) {
	r := newRig(t, Options{})
	p := newPub(t, kvtest.Options{Layout: kvwire.LayoutArray})
	c := newCache(t)
	r.add("e", p, 0)
	st := must[kvwire.Event](t)

	a := toks(1, 4*testBS)
	h := c.Hashes(a)
	publish(t, p, st(c.Store(a, 0)))
	// Two concurrent requests each cache their own copy of blocks 2..3 after hitting 0..1.
	publish(t, p, st(c.Store(a, 2)))
	publish(t, p, st(c.Reannounce(a, 4))) // full mode: a hit re-announced, no new copy
	r.waitMirror("e", 0, c, Exact)

	publish(t, p, st(c.Evict(h[3]))) // one copy of block 3 remains
	r.waitMirror("e", 0, c, Exact)
	publish(t, p, st(c.Evict(h[3]))) // the last copy: block 3 must leave
	publish(t, p, st(c.Reannounce(a, 3)))
	publish(t, p, st(c.Reannounce(a, 3)))
	s := r.waitMirror("e", 0, c, Exact)
	if _, ok := r.ix.ParentKey(r.id("e", 0), h[3]); ok {
		t.Fatal("evicted block still indexed after re-announcements")
	}
	if s.BlocksRemoved != 2 || s.UnknownRemoves != 0 {
		t.Errorf("removed %d unknown %d; want 2, 0", s.BlocksRemoved, s.UnknownRemoves)
	}
}

func TestDPRanksAreSeparateStreams(t *testing.T) {
	r := newRig(t, Options{})
	p0 := newPub(t, kvtest.Options{Rank: 0})
	p1 := newPub(t, kvtest.Options{Rank: 1})
	c0, c1 := newCache(t), newCache(t)
	r.add("e", p0, 0)
	r.add("e", p1, 1)
	st := must[kvwire.Event](t)
	publish(t, p0, st(c0.Store(toks(1, 3*testBS), 0)))
	publish(t, p1, st(c1.Store(toks(2, 2*testBS), 0)))
	lost(t, p1, st(c1.Store(toks(3, 2*testBS), 0)))
	publish(t, p1, st(c1.Store(toks(4, 2*testBS), 0)))
	s0 := r.waitMirror("e", 0, c0, Exact)
	s1 := r.waitMirror("e", 1, c1, Exact)
	if s0.Gaps != 0 || s1.Gaps != 1 {
		t.Errorf("gaps rank0 %d rank1 %d; want 0, 1", s0.Gaps, s1.Gaps)
	}
	if got := len(r.sub.AllStats()); got != 2 {
		t.Errorf("%d streams", got)
	}
}

func TestMalformedMessagesCountedAndSkipped(t *testing.T) {
	r := newRig(t, Options{})
	p := newPub(t, kvtest.Options{})
	c := newCache(t)
	r.add("e", p, 0)
	st := must[kvwire.Event](t)

	seq8 := binary.BigEndian.AppendUint64(nil, 0)
	if err := p.SendFrames([]byte(p.Topic()), seq8); err != nil { // 2 frames
		t.Fatal(err)
	}
	if err := p.SendFrames([]byte(p.Topic()), []byte{1, 2}, []byte{0x90}); err != nil { // short seq
		t.Fatal(err)
	}
	if err := p.SendFrames([]byte("kv@10.0.0.9@other"), seq8, []byte{0x93}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.PublishPayload([]byte{0x93, 0xcb, 1, 2}); err != nil { // truncated batch
		t.Fatal(err)
	}
	if _, err := p.PublishPayload([]byte{0xc1, 0xff, 0x00}); err != nil {
		t.Fatal(err)
	}
	publish(t, p, st(c.Store(toks(1, 2*testBS), 0)))
	s := r.waitMirror("e", 0, c, Exact)
	if s.MalformedFrames != 2 || s.TopicMismatches != 1 || s.DecodeErrors != 2 || s.Applied != 1 || s.Gaps != 0 {
		t.Errorf("malformed %d topic %d decode %d applied %d gaps %d; want 2, 1, 2, 1, 0",
			s.MalformedFrames, s.TopicMismatches, s.DecodeErrors, s.Applied, s.Gaps)
	}
}

func TestUncoverableGapMakesInexactUntilCleared(t *testing.T) {
	r := newRig(t, Options{})
	p := newPub(t, kvtest.Options{Ring: 2})
	c := newCache(t)
	r.add("e", p, 0)
	st := must[kvwire.Event](t)
	publish(t, p, st(c.Store(toks(1, 2*testBS), 0)))
	r.waitMirror("e", 0, c, Exact)
	a := toks(2, 2*testBS)
	lost(t, p, st(c.Store(a, 0)))
	lost(t, p, st(c.Evict(c.Hashes(a)[1]))) // if ever applied partly, a phantom could stay
	lost(t, p, st(c.Store(toks(3, 2*testBS), 0)))
	publish(t, p, st(c.Store(toks(4, 2*testBS), 0)))
	s := r.waitStats("e", 0, "inexact", func(s Stats) bool { return s.State == Inexact && s.LastSeq == 4 })
	if s.Uncoverable != 1 || s.Resets != 1 {
		t.Errorf("uncoverable %d resets %d; want 1, 1", s.Uncoverable, s.Resets)
	}
	// Cleared at the gap, then the ring's batches 3 and 4 applied: a subset of the engine's blocks.
	ist, _ := r.ix.Stats(r.id("e", 0))
	if ist.Blocks[0] != 4 {
		t.Errorf("replica holds %d blocks, want 4 (batches 3 and 4)", ist.Blocks[0])
	}
	// The engine's cache is reset: from here the index mirrors it again.
	publish(t, p, c.Clear())
	publish(t, p, st(c.Store(toks(5, 2*testBS), 0)))
	r.waitMirror("e", 0, c, Exact)
}

func TestStartReplaysTheRingAndMarksLateRingsPartial(t *testing.T) {
	r := newRig(t, Options{})
	whole := newPub(t, kvtest.Options{Rank: 0})
	late := newPub(t, kvtest.Options{Rank: 1, Ring: 2})
	cw, cl := newCache(t), newCache(t)
	st := must[kvwire.Event](t)
	for i := range 4 { // published before the router started: only replay can bring them
		publish(t, whole, st(cw.Store(toks(uint32(1+i), 2*testBS), 0)))
		publish(t, late, st(cl.Store(toks(uint32(1+i), 2*testBS), 0)))
	}
	r.add("e", whole, 0)
	r.add("e", late, 1)
	s := r.waitMirror("e", 0, cw, Exact)
	if s.Partial || s.ReplayedBatches != 4 {
		t.Errorf("whole ring: partial %v replayed %d", s.Partial, s.ReplayedBatches)
	}
	sl := r.waitStats("e", 1, "partial", func(s Stats) bool { return s.State == Approximate && s.LastSeq == 3 })
	if !sl.Partial || sl.ReplayedBatches != 2 {
		t.Errorf("late ring: partial %v replayed %d", sl.Partial, sl.ReplayedBatches)
	}
	publish(t, late, cl.Clear())
	if s := r.waitMirror("e", 1, cl, Exact); s.Partial {
		t.Error("still partial after AllBlocksCleared")
	}
}

func TestNoReplaySocket(t *testing.T) {
	r := newRig(t, Options{})
	p := newPub(t, kvtest.Options{NoReplay: true})
	c := newCache(t)
	r.add("e", p, 0)
	st := must[kvwire.Event](t)
	publish(t, p, st(c.Store(toks(1, 2*testBS), 0)))
	r.waitMirror("e", 0, c, Exact) // seq 0 seen live: the stream began here
	lost(t, p, st(c.Store(toks(2, 2*testBS), 0)))
	publish(t, p, st(c.Store(toks(3, 2*testBS), 0)))
	s := r.waitStats("e", 0, "inexact", func(s Stats) bool { return s.State == Inexact && s.LastSeq == 2 })
	if s.Replays != 0 || s.Uncoverable != 1 {
		t.Errorf("replays %d uncoverable %d", s.Replays, s.Uncoverable)
	}
}

func TestBoundMode(t *testing.T) {
	r := newRig(t, Options{})
	addr, err := r.sub.Bind("tcp://127.0.0.1:*")
	if err != nil {
		t.Fatal(err)
	}
	p0 := newPub(t, kvtest.Options{Connect: addr, Topic: "kv@10.0.0.1@m"})
	p1 := newPub(t, kvtest.Options{Connect: addr, Topic: "kv@10.0.0.2@m"})
	for i, p := range []*kvtest.Publisher{p0, p1} {
		cfg := StreamConfig{Engine: []string{"a", "b"}[i], Topic: p.Topic(), ReplayEndpoint: p.ReplayEndpoint()}
		if err := r.sub.Add(cfg); err != nil {
			t.Fatal(err)
		}
		if err := p.WaitSubscribers(1, 10e9); err != nil {
			t.Fatal(err)
		}
	}
	stray := newPub(t, kvtest.Options{Connect: addr, Topic: "kv@10.0.0.3@m"})
	if err := stray.WaitSubscribers(1, 10e9); err != nil {
		t.Fatal(err)
	}
	c0, c1 := newCache(t), newCache(t)
	st := must[kvwire.Event](t)
	publish(t, p0, st(c0.Store(toks(1, 2*testBS), 0)))
	publish(t, p1, st(c1.Store(toks(2, 3*testBS), 0)))
	publish(t, stray, st(newCache(t).Store(toks(3, testBS), 0)))
	r.waitMirror("a", 0, c0, Exact)
	r.waitMirror("b", 0, c1, Exact)
	testkit.WaitFor(t, waitBound, "unroutable", func() bool { return r.sub.Unroutable() == 1 })
}

func TestRemoveStream(t *testing.T) {
	r := newRig(t, Options{})
	p := newPub(t, kvtest.Options{})
	c := newCache(t)
	r.add("e", p, 0)
	publish(t, p, must[kvwire.Event](t)(c.Store(toks(1, 2*testBS), 0)))
	r.waitMirror("e", 0, c, Exact)
	if err := r.sub.Remove("e", 0); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.ix.Replica("e", 0); ok {
		t.Error("replica still registered")
	}
	if r.ix.Keys() != 0 {
		t.Errorf("%d keys left", r.ix.Keys())
	}
	if err := r.sub.Remove("e", 0); err == nil {
		t.Error("second Remove succeeded")
	}
	if err := r.sub.Add(StreamConfig{Engine: "", Rank: 0}); err == nil {
		t.Error("stream without an engine name accepted")
	}
}
