package load

import (
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/route"
	"github.com/kvroute/kvroute/router/score"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// recorder is a policy that picks candidate 0 and counts what it is told.
type recorder struct{ routed, retracted, forgot int }

func (p *recorder) Name() string { return "recorder" }
func (p *recorder) Pick(_ *score.Request, cands []score.Candidate) (int, error) {
	return 0, nil
}
func (p *recorder) OnRouted(*score.Request, []score.Candidate, int) { p.routed++ }
func (p *recorder) Retract(*score.Request, []score.Candidate, int)  { p.retracted++ }
func (p *recorder) Forget(string)                                   { p.forgot++ }

type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) add(s string)                      { e.mu.Lock(); e.got = append(e.got, s); e.mu.Unlock() }
func (e *events) Routed(ID, *Record)                { e.add("routed") }
func (e *events) FirstToken(ID, *Record, time.Time) { e.add("first") }
func (e *events) Done(_ ID, _ *Record, u *Usage) {
	if u != nil {
		e.add("done+usage")
	} else {
		e.add("done")
	}
}
func (e *events) Failed(ID, *Record) { e.add("failed") }

func keys(n int) []blockkey.Key {
	out := make([]blockkey.Key, n)
	for i := range out {
		out[i] = blockkey.Key(i + 1)
	}
	return out
}

func TestLifecycle(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	pol := &recorder{}
	ev := &events{}
	l := New(Options{Now: c.now, Policy: pol, Observers: []Observer{ev}})
	r := l.NewReplica(0, "e0/0")
	req := &score.Request{Keys: keys(4), Tokens: 64, BlockSize: 16}
	cands := []score.Candidate{{ID: "e0/0", Healthy: true}}
	id, rc, err := l.Decide(decision(req, cands), nil, func(i int) Routing {
		return Routing{Replica: r, Keys: req.Keys, Uncached: 48, Held: 64, Cached: 16}
	})
	if err != nil || rc.Chosen != 0 || pol.routed != 1 {
		t.Fatalf("decide: %v chosen %d routed %d", err, rc.Chosen, pol.routed)
	}
	// Before its first token the request's whole prompt is held for the decode term
	// (score.Candidate.ContextTokens), its uncached part counted as prefill, with the attention
	// of its 48 new tokens over the 16 cached and each other (48 x 16 + 48 x 47 / 2 pairs).
	if got := r.Load(); got != (Load{PrefillTokens: 48, PrefillHeldTokens: 64, PrefillAttention: 48*16 + 48*47/2, Running: 1}) {
		t.Fatalf("after routed: %+v", got)
	}
	if pred, _ := l.Match(req.Keys, 1, false, nil, nil); pred[0] != 4 {
		t.Fatalf("predicted %d blocks, want 4", pred[0])
	}
	c.t = c.t.Add(100 * time.Millisecond)
	if err := l.FirstToken(id); err != nil {
		t.Fatal(err)
	}
	if got := r.Load(); got != (Load{DecodeTokens: 64, Running: 1}) {
		t.Fatalf("after first token: %+v", got)
	}
	if got, _ := l.Done(id, &Usage{PromptTokens: 64, CachedTokens: 16}); got.FirstTokenAt.Sub(got.At) != 100*time.Millisecond {
		t.Fatalf("first token after %v", got.FirstTokenAt.Sub(got.At))
	}
	if got := r.Load(); got != (Load{}) {
		t.Fatalf("after done: %+v", got)
	}
	// Done keeps the prediction (events confirm it later); the injected clock expires it.
	if pred, _ := l.Match(req.Keys, 1, false, nil, nil); pred[0] != 4 {
		t.Fatalf("predicted %d blocks after done, want 4", pred[0])
	}
	c.t = c.t.Add(10 * time.Second)
	if pred, _ := l.Match(req.Keys, 1, false, nil, nil); pred[0] != 0 {
		t.Fatalf("predicted %d blocks after the TTL, want 0", pred[0])
	}
	if _, err := l.Done(id, nil); err != ErrUnknown {
		t.Fatalf("second done: %v", err)
	}
	if want := []string{"routed", "first", "done+usage"}; len(ev.got) != 3 || ev.got[0] != want[0] || ev.got[1] != want[1] || ev.got[2] != want[2] {
		t.Fatalf("observer saw %v, want %v", ev.got, want)
	}
}

func TestFailedRollsBack(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	pol := &recorder{}
	l := New(Options{Now: c.now, Policy: pol})
	r := l.NewReplica(3, "e1/0")
	req := &score.Request{Keys: keys(8), Tokens: 128, BlockSize: 16}
	id, _, err := l.Decide(decision(req, []score.Candidate{{ID: "e1/0", Healthy: true}}), nil, func(int) Routing {
		return Routing{Replica: r, Keys: req.Keys, Approximate: true, Uncached: 128, Held: 128}
	})
	if err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st != (Stats{InFlight: 1, Predicted: 8, Approximate: 8}) {
		t.Fatalf("before failure: %+v", st)
	}
	if _, err := l.Failed(id); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st != (Stats{}) {
		t.Fatalf("after failure: %+v", st)
	}
	if got := r.Load(); got != (Load{}) || pol.retracted != 1 {
		t.Fatalf("after failure: load %+v, retracted %d", got, pol.retracted)
	}
	pred, appr := l.Match(req.Keys, 4, true, nil, nil)
	if pred[3] != 0 || appr[3] != 0 {
		t.Fatalf("after failure: predicted %d, approximate %d", pred[3], appr[3])
	}
}

// A replica's predictions are bounded by its engine's KV capacity: a request beyond it evicts
// the least recently used, counted in Stats; the capacity change moves the generation.
func TestSetCapacityEvictsPredictions(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Options{Now: c.now, Policy: &recorder{}})
	r := l.NewReplica(2, "e0/0")
	g := l.Generation()
	l.SetCapacity(r, 6)
	if l.Generation() == g {
		t.Fatal("SetCapacity left the generation unchanged")
	}
	first := keys(4)
	second := []blockkey.Key{101, 102, 103, 104}
	l.Routed(Routing{Replica: r, Keys: first, Approximate: true, Uncached: 64, Held: 64})
	l.Routed(Routing{Replica: r, Keys: second, Approximate: true, Uncached: 64, Held: 64})
	pred, appr := l.Match(first, 3, true, nil, nil)
	if pred[2] != 2 || appr[2] != 2 {
		t.Fatalf("first request after 8 blocks into 6: predicted %d, approximate %d; want its head (2) in both", pred[2], appr[2])
	}
	if st := l.Stats(); st.PredictedEvicted != 2 || st.ApproximateEvicted != 2 || st.Predicted != 6 || st.Approximate != 6 {
		t.Fatalf("stats %+v, want 6 entries and 2 evicted in each side index", st)
	}
}

func TestRemoveForgetsAndInFlightSettlesOnOldReplica(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	pol := &recorder{}
	l := New(Options{Now: c.now, Policy: pol})
	old := l.NewReplica(0, "e0/0")
	id, _ := l.Routed(Routing{Replica: old, Keys: keys(2), Uncached: 10, Held: 32})
	l.Remove(old)
	if pol.forgot != 1 || l.Stats().Predicted != 0 {
		t.Fatalf("remove: forgot %d, predicted %d", pol.forgot, l.Stats().Predicted)
	}
	// A newcomer reuses the index slot; the old request must not touch its counters.
	nu := l.NewReplica(0, "e9/0")
	if _, err := l.Failed(id); err != nil {
		t.Fatal(err)
	}
	if nu.Load() != (Load{}) || old.Load() != (Load{}) {
		t.Fatalf("new %+v old %+v", nu.Load(), old.Load())
	}
}

// A decision reads a replica's load by its slot (Ledger.Load): the replica counted there now,
// values read at the call; a removed replica's slot reads zero even while its requests run, and
// removing a replica the slot no longer holds leaves the newcomer there.
func TestLoadBySlot(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Options{Now: c.now, Policy: &recorder{}})
	if got := l.Load(5); got != (route.ReplicaLoad{}) {
		t.Fatalf("unknown slot: %+v", got)
	}
	old := l.NewReplica(2, "e0/0")
	l.Routed(Routing{Replica: old, Uncached: 10, Held: 32})
	want := route.ReplicaLoad{Load: Load{PrefillTokens: 10, PrefillHeldTokens: 32, PrefillAttention: 10 * 9 / 2, Running: 1}, PrefillSince: c.t.UnixNano()}
	got := l.Load(2)
	if got != want {
		t.Fatalf("slot 2: %+v, want %+v", got, want)
	}
	l.Routed(Routing{Replica: old, Uncached: 5, Held: 8})
	if got.PrefillTokens != 10 || l.Load(2).PrefillTokens != 15 {
		t.Fatalf("a value read earlier moved (%d) or a new read missed the routing (%d)", got.PrefillTokens, l.Load(2).PrefillTokens)
	}
	l.Remove(old)
	if got := l.Load(2); got != (route.ReplicaLoad{}) {
		t.Fatalf("removed replica still read: %+v", got)
	}
	nu := l.NewReplica(2, "e9/0")
	l.Routed(Routing{Replica: nu, Uncached: 7, Held: 7})
	l.Remove(old) // again: the slot is the newcomer's now
	if got := l.Load(2); got.PrefillTokens != 7 || got.Running != 1 {
		t.Fatalf("newcomer's slot: %+v", got)
	}
}

// failing is a policy whose Pick always fails.
type failing struct{ recorder }

func (p *failing) Pick(*score.Request, []score.Candidate) (int, error) {
	return 0, score.ErrNoCandidate
}

func TestUnknownAndRepeatedCalls(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	ev := &events{}
	l := New(Options{Now: c.now, Policy: &recorder{}, Observers: []Observer{ev}})
	r := l.NewReplica(0, "e0/0")
	if err := l.FirstToken(42); err != ErrUnknown {
		t.Fatalf("first token of an unknown id: %v", err)
	}
	if _, err := l.Done(42, nil); err != ErrUnknown {
		t.Fatalf("done of an unknown id: %v", err)
	}
	if _, err := l.Failed(42); err != ErrUnknown {
		t.Fatalf("failed of an unknown id: %v", err)
	}
	id, _ := l.Routed(Routing{Replica: r, Uncached: 30, Held: 50})
	// A second first token moves nothing again.
	for range 2 {
		if err := l.FirstToken(id); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.Load(); got != (Load{DecodeTokens: 50, Running: 1}) {
		t.Fatalf("after two first tokens: %+v", got)
	}
	if _, err := l.Done(id, nil); err != nil {
		t.Fatal(err)
	}
	// Done twice, or Failed after Done: unknown, and the counters stay at zero.
	if _, err := l.Done(id, nil); err != ErrUnknown {
		t.Fatalf("second done: %v", err)
	}
	if _, err := l.Failed(id); err != ErrUnknown {
		t.Fatalf("failed after done: %v", err)
	}
	if got := r.Load(); got != (Load{}) {
		t.Fatalf("after repeated ends: %+v", got)
	}
	// Unknown ids and the repeated first token tell the observers nothing.
	if want := []string{"routed", "first", "done"}; !slices.Equal(ev.got, want) {
		t.Fatalf("observer saw %v, want %v", ev.got, want)
	}
}

// A request that fails after its first token gives back its decode tokens, not its prefill;
// the other, still in prefill, keeps its prefill and what it will hold.
func TestFailedAfterFirstToken(t *testing.T) {
	l := New(Options{Policy: &recorder{}})
	r := l.NewReplica(0, "e0/0")
	other, _ := l.Routed(Routing{Replica: r, Uncached: 7, Held: 9})
	id, _ := l.Routed(Routing{Replica: r, Uncached: 30, Held: 50})
	if err := l.FirstToken(id); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Failed(id); err != nil {
		t.Fatal(err)
	}
	if got := r.Load(); got != (Load{PrefillTokens: 7, PrefillHeldTokens: 9, PrefillAttention: 7 * 6 / 2, Running: 1}) {
		t.Fatalf("after failing one of two: %+v", got)
	}
	if _, err := l.Done(other, nil); err != nil || r.Load() != (Load{}) {
		t.Fatalf("after the other ends: %v %+v", err, r.Load())
	}
}

// Rolling back one request keeps the prediction a later sibling refreshed.
func TestRollbackKeepsASiblingsPrediction(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Options{Now: c.now, Policy: &recorder{}})
	r := l.NewReplica(0, "e0/0")
	first, _ := l.Routed(Routing{Replica: r, Keys: keys(4)})
	c.t = c.t.Add(time.Second)
	l.Routed(Routing{Replica: r, Keys: keys(6)})
	if _, err := l.Failed(first); err != nil {
		t.Fatal(err)
	}
	if pred, _ := l.Match(keys(6), 1, false, nil, nil); pred[0] != 6 {
		t.Fatalf("predicted %d after the first was rolled back, want the sibling's 6", pred[0])
	}
}

// The approximate index is written only for replicas scored approximately, and Unpredict takes
// a started request's keys out of the predicted index at once.
func TestApproximateAndUnpredict(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Options{Now: c.now, Policy: &recorder{}})
	exact, approx := l.NewReplica(0, "e0/0"), l.NewReplica(1, "e1/0")
	a, _ := l.Routed(Routing{Replica: exact, Keys: keys(3)})
	l.Routed(Routing{Replica: approx, Keys: keys(5), Approximate: true})
	pred, appr := l.Match(keys(8), 2, true, nil, nil)
	if pred[0] != 3 || pred[1] != 5 || appr[0] != 0 || appr[1] != 5 {
		t.Fatalf("predicted %v approximate %v", pred, appr)
	}
	if pred, appr := l.Match(keys(8), 2, false, nil, nil); appr != nil || pred[1] != 5 {
		t.Fatalf("approximate read when not asked: %v %v", pred, appr)
	}
	l.Unpredict(a)
	if pred, _ := l.Match(keys(8), 2, false, nil, nil); pred[0] != 0 || pred[1] != 5 {
		t.Fatalf("after unpredict: %v", pred)
	}
	// Its load is still there: only the prediction went.
	if exact.Load().Running != 1 {
		t.Fatalf("unpredict changed the load: %+v", exact.Load())
	}
}

// Every record is stamped by the injected clock, and the TTL runs on it.
func TestInjectedClock(t *testing.T) {
	c := &clock{t: time.Unix(5000, 0)}
	l := New(Options{Now: c.now, Policy: &recorder{}, PredictedTTL: 3 * time.Second})
	r := l.NewReplica(0, "e0/0")
	id, rc := l.Routed(Routing{Replica: r, Keys: keys(2)})
	if !rc.At.Equal(c.t) || !l.Now().Equal(c.t) {
		t.Fatalf("routed at %v, ledger now %v, clock %v", rc.At, l.Now(), c.t)
	}
	c.t = c.t.Add(2 * time.Second)
	if err := l.FirstToken(id); err != nil || rc.FirstTokenAt.Sub(rc.At) != 2*time.Second {
		t.Fatalf("first token %v after, %v", rc.FirstTokenAt.Sub(rc.At), err)
	}
	if pred, _ := l.Match(keys(2), 1, false, nil, nil); pred[0] != 2 {
		t.Fatalf("predicted %d within the TTL", pred[0])
	}
	c.t = c.t.Add(time.Second + time.Nanosecond)
	l.Expire()
	if st := l.Stats(); st.Predicted != 0 || st.InFlight != 1 {
		t.Fatalf("after the TTL on the injected clock: %+v", st)
	}
}

// A policy that refuses records nothing.
func TestPolicyErrorRecordsNothing(t *testing.T) {
	pol := &failing{}
	l := New(Options{Policy: pol})
	r := l.NewReplica(0, "e0/0")
	called := false
	_, _, err := l.Decide(decision(&score.Request{Keys: keys(2)}, []score.Candidate{{ID: "e0/0", Healthy: true}}), nil, func(int) Routing {
		called = true
		return Routing{Replica: r, Keys: keys(2), Uncached: 5}
	})
	if err == nil || called || pol.routed != 0 || l.Stats() != (Stats{}) || r.Load() != (Load{}) {
		t.Fatalf("err %v, rec called %v, routed %d, stats %+v, load %+v", err, called, pol.routed, l.Stats(), r.Load())
	}
}

// Concurrent requests on one replica settle to zero.
func TestConcurrentSettle(t *testing.T) {
	l := New(Options{Policy: &recorder{}})
	r := l.NewReplica(0, "e0/0")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				id, _ := l.Routed(Routing{Replica: r, Keys: keys(1 + i%4), Uncached: 10 + g, Held: 20})
				if i%3 == 0 {
					_, _ = l.Failed(id)
					continue
				}
				_ = l.FirstToken(id)
				_, _ = l.Done(id, nil)
			}
		}()
	}
	wg.Wait()
	if r.Load() != (Load{}) || l.Stats().InFlight != 0 {
		t.Fatalf("after every request ended: %+v %+v", r.Load(), l.Stats())
	}
}

// A peer router's routed keys enter the predicted index as this router's own would (a sibling
// reaching this router matches them), add no load, expire with the TTL, and are not entered for
// a replica that left.
func TestPeerPredictionsExpire(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Options{Now: c.now, Policy: &recorder{}, PredictedTTL: 10 * time.Second})
	r := l.NewReplica(0, "e0/0")
	l.RoutedPeer(r, keys(4), 0)
	pred, _ := l.Match(keys(6), 1, false, nil, nil)
	if pred[0] != 4 {
		t.Fatalf("predicted match %d after a peer's 4 keys, want 4", pred[0])
	}
	if ld := r.Load(); ld != (Load{}) || l.Stats().InFlight != 0 {
		t.Fatalf("a peer's prediction added load %+v or a record %+v", ld, l.Stats())
	}
	c.t = c.t.Add(11 * time.Second)
	if pred, _ = l.Match(keys(6), 1, false, nil, nil); pred[0] != 0 {
		t.Fatalf("predicted match %d past the TTL, want 0", pred[0])
	}
	l.Remove(r)
	l.RoutedPeer(r, keys(4), 0)
	if st := l.Stats(); st.Predicted != 0 {
		t.Fatalf("%d predicted entries for a removed replica", st.Predicted)
	}
}

// The approximate index of a replica moves between routers through ExportApprox and
// ImportApprox (a peer's snapshot), expiries kept.
func TestApproxExportImport(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	src := New(Options{Now: c.now, Policy: &recorder{}})
	r := src.NewReplica(0, "e0/0")
	src.Routed(Routing{Replica: r, Keys: keys(3), Approximate: true, Uncached: 48, Held: 48})
	es := src.ExportApprox(r, 0)
	if len(es) != 3 {
		t.Fatalf("exported %d approximate entries, want 3", len(es))
	}
	dst := New(Options{Now: c.now, Policy: &recorder{}})
	r2 := dst.NewReplica(0, "e0/0")
	dst.ImportApprox(r2, es)
	if _, appr := dst.Match(keys(5), 1, true, nil, nil); appr[0] != 3 {
		t.Fatalf("approximate match %d after the import, want 3", appr[0])
	}
}

// A request a peer router routed (RoutedPeer) enters this router's balance window as one of its
// own would, at the ledger's now: its uncached tokens and one request on the replica's window,
// its clock started, its keys predicted. It adds no load (the peer's totals carry that) and no
// record, a request routed without keys still counts, and a replica that left gets nothing.
// Without it each of three routers bounds its replicas by its own third of the fleet's work.
func TestRoutedPeer(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	kv, err := score.New("kv", score.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	l := New(Options{Now: c.now, Policy: kv, PredictedTTL: 10 * time.Second})
	r, other := l.NewReplica(0, "e0/0"), l.NewReplica(1, "e1/0")
	l.RoutedPeer(r, keys(4), 48)
	now := c.t.UnixNano()
	if w := l.Window("e0/0", now); w.Tokens != 48 || w.Requests != 1 || !w.Seen || w.Since != now {
		t.Fatalf("window after a peer's routed request %+v, want 48 tokens, 1 request, seen since now", w)
	}
	if pred, _ := l.Match(keys(6), 2, false, nil, nil); pred[0] != 4 || pred[1] != 0 {
		t.Fatalf("predicted match %v after a peer's 4 keys on e0/0, want [4 0]", pred)
	}
	if ld := r.Load(); ld != (Load{}) || l.Stats().InFlight != 0 {
		t.Fatalf("a peer's routed request added load %+v or a record %+v", ld, l.Stats())
	}
	c.t = c.t.Add(time.Second)
	l.RoutedPeer(r, nil, 96) // unkeyed: no prediction, still work
	if w := l.Window("e0/0", c.t.UnixNano()); w.Tokens != 144 || w.Requests != 2 {
		t.Fatalf("window after an unkeyed peer request %+v, want 144 tokens, 2 requests", w)
	}
	if w := l.Window("e1/0", c.t.UnixNano()); w.Tokens != 0 || w.Requests != 0 {
		t.Fatalf("the other replica's window %+v, want empty", w)
	}
	// Past the window's span the peer's entries leave it like this router's own.
	c.t = c.t.Add(l.win.Span())
	l.Expire()
	if w := l.Window("e0/0", c.t.UnixNano()); w.Tokens != 0 || w.Requests != 0 {
		t.Fatalf("window past its span %+v, want empty", w)
	}
	l.Remove(other)
	l.RoutedPeer(other, keys(4), 48)
	if w := l.Window("e1/0", c.t.UnixNano()); w.Seen || w.Requests != 0 {
		t.Fatalf("a removed replica's window %+v, want none", w)
	}
}

// The ledger measures how fast a replica's routed prefill drains: uncached tokens that reached a
// first token over the time prefill was pending there without a break (since the counter left
// zero, then since the previous first token), and PrefillSince moves with it.
func TestPrefillDrainRate(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Options{Now: c.now, Policy: &recorder{}})
	r := l.NewReplica(0, "e0/0")
	if got := l.Calibration("e0/0").DrainTokensPerS; got != 0 {
		t.Fatalf("before any first token: drain %v, want 0", got)
	}
	route := func(unc int) ID { return routeUncached(t, l, r, unc) }
	a := route(1000)
	if got := r.PrefillSince(); got != c.t.UnixNano() {
		t.Fatalf("prefill since %d, want the first routing %d", got, c.t.UnixNano())
	}
	c.t = c.t.Add(100 * time.Millisecond)
	b := route(3000) // the counter was not zero: since stays
	if got := r.PrefillSince(); got != time.Unix(1000, 0).UnixNano() {
		t.Fatalf("prefill since moved to %d on a routing behind pending prefill", got)
	}
	c.t = c.t.Add(400 * time.Millisecond) // 1,000 tokens in 0.5 s
	if err := l.FirstToken(a); err != nil {
		t.Fatal(err)
	}
	if got := r.PrefillSince(); got != c.t.UnixNano() {
		t.Fatalf("prefill since %d, want the first token %d", got, c.t.UnixNano())
	}
	c.t = c.t.Add(1500 * time.Millisecond) // 3,000 more in 1.5 s: 4,000 in 2 s
	if err := l.FirstToken(b); err != nil {
		t.Fatal(err)
	}
	want := (1000*fleetDecay + 3000) / (0.5*fleetDecay + 1.5)
	if got := l.Calibration("e0/0").DrainTokensPerS; math.Abs(got-want) > 1e-6 {
		t.Fatalf("drain %v tokens/s, want %v", got, want)
	}
}

// With peers, PrefillSince is the replica's last progress any router saw: a peer's progress
// moves it forward (never back), a routing behind the peers' pending prefill does not restart
// it, and this router's next first token measures the drain from the peer's progress.
func TestPeerProgress(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	var peerPrefill int64
	l := New(Options{Now: c.now, Policy: &recorder{}, PeerPrefill: func(string) int64 { return peerPrefill }})
	r := l.NewReplica(0, "e0/0")
	l.PeerProgress(r) // a peer routed the replica's first prefill
	start := c.t.UnixNano()
	peerPrefill = 2000
	if got := r.PrefillSince(); got != start {
		t.Fatalf("since %d after a peer's progress, want %d", got, start)
	}
	c.t = c.t.Add(200 * time.Millisecond)
	route := func(unc int) ID { return routeUncached(t, l, r, unc) }
	a := route(1000) // this router's counter leaves zero, but the peer's 2,000 are pending
	if got := r.PrefillSince(); got != start {
		t.Fatalf("since moved to %d on a routing behind the peers' prefill, want %d", got, start)
	}
	c.t = c.t.Add(300 * time.Millisecond) // the peer's first token, 0.5 s after it started
	peerPrefill = 0
	l.PeerProgress(r)
	peerAt := c.t.UnixNano()
	if got := r.PrefillSince(); got != peerAt {
		t.Fatalf("since %d after the peer's first token, want %d", got, peerAt)
	}
	late := *c
	c.t = c.t.Add(-50 * time.Millisecond) // a peer's batch applied late: since never moves back
	l.PeerProgress(r)
	if got := r.PrefillSince(); got != peerAt {
		t.Fatalf("since moved back to %d, want %d", got, peerAt)
	}
	*c = late
	c.t = c.t.Add(250 * time.Millisecond) // 1,000 tokens in the 0.25 s since the peer's first token
	if err := l.FirstToken(a); err != nil {
		t.Fatal(err)
	}
	if got := l.Calibration("e0/0").DrainTokensPerS; math.Abs(got-4000) > 1e-6 {
		t.Fatalf("drain %v tokens/s, want 4,000 (1,000 tokens since the peer's progress)", got)
	}
	// Without peers' prefill a routing that starts the counter restarts since, as before.
	c.t = c.t.Add(time.Second)
	route(500)
	if got := r.PrefillSince(); got != c.t.UnixNano() {
		t.Fatalf("since %d after routing to an idle replica, want %d", got, c.t.UnixNano())
	}
	// A replica that left the fleet takes no progress.
	l.Remove(r)
	was := r.PrefillSince()
	c.t = c.t.Add(time.Second)
	l.PeerProgress(r)
	if r.PrefillSince() != was {
		t.Fatal("a removed replica's since moved")
	}
}

// routeUncached routes one request with unc uncached tokens to r, the ledger's only candidate.
func routeUncached(t *testing.T, l *Ledger, r *Replica, unc int) ID {
	t.Helper()
	req := &score.Request{Keys: keys(2), Tokens: unc, BlockSize: 16}
	id, _, err := l.Decide(decision(req, []score.Candidate{{ID: r.Name, Healthy: true}}), nil, func(int) Routing {
		return Routing{Replica: r, Keys: req.Keys, Uncached: unc, Held: unc}
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// decision is a decision over no replicas (nothing for the ledger to re-read into it) with the
// given request and candidates.
func decision(req *score.Request, cands []score.Candidate) *route.Decision {
	return &route.Decision{Req: *req, Cands: cands}
}

// A record whose end is never reported is ended by Expire once it is RecordTTL old, as done
// (its load leaves the replica, the observers hear Done), and counted; a younger one stays, and
// without a TTL nothing expires.
func TestRecordTTLEndsALostRelease(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	ev := &events{}
	l := New(Options{Now: c.now, Policy: &recorder{}, Observers: []Observer{ev}, RecordTTL: time.Minute})
	r := l.NewReplica(0, "e0/0")
	lost, _ := l.Routed(Routing{Replica: r, Uncached: 48, Held: 64})
	c.t = c.t.Add(30 * time.Second)
	young, _ := l.Routed(Routing{Replica: r, Uncached: 16, Held: 16})
	if ended := l.Expire(); len(ended) != 0 || l.ExpiredRecords() != 0 {
		t.Fatalf("at 30 s: ended %d (counted %d), want none", len(ended), l.ExpiredRecords())
	}
	c.t = c.t.Add(31 * time.Second)
	ended := l.Expire()
	if len(ended) != 1 || l.ExpiredRecords() != 1 || ended[0].Uncached != 48 {
		t.Fatalf("at 61 s: ended %d (counted %d), want the lost one only", len(ended), l.ExpiredRecords())
	}
	if got := r.Load(); got.PrefillTokens != 16 || got.Running != 1 {
		t.Fatalf("load after expiry %+v, want only the young request's", got)
	}
	if _, err := l.Done(lost, nil); err != ErrUnknown {
		t.Fatalf("a late Done of the expired record: %v, want ErrUnknown", err)
	}
	if _, err := l.Done(young, nil); err != nil {
		t.Fatal(err)
	}
	if want := []string{"routed", "routed", "done", "done"}; !slices.Equal(ev.got, want) {
		t.Fatalf("observers heard %v, want %v", ev.got, want)
	}

	never := New(Options{Now: c.now, Policy: &recorder{}})
	never.Routed(Routing{Replica: never.NewReplica(0, "e0/0"), Uncached: 1, Held: 1})
	c.t = c.t.Add(24 * time.Hour)
	if ended := never.Expire(); len(ended) != 0 {
		t.Fatalf("without a TTL Expire ended %d records", len(ended))
	}
}

// A split request's decode leg pulls its prompt from the prefill engine: the replica books the
// pulled tokens as transfer, not prefill (vLLM parks the request in WAITING_FOR_REMOTE_KVS, off
// its prefill budget), and its first token, which waited on the transfer, is no progress of the
// replica's prefill (PrefillSince stays). Both ends, served or taken back, clear the transfer.
func TestTransferIsNotPrefill(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Options{Now: c.now, Policy: &recorder{}})
	r := l.NewReplica(0, "e0/0")
	req := &score.Request{Keys: keys(4), Tokens: 64, BlockSize: 16}
	cands := []score.Candidate{{ID: "e0/0", Healthy: true}}
	leg := func() ID {
		id, _, err := l.Decide(decision(req, cands), nil, func(int) Routing {
			return Routing{Replica: r, Keys: req.Keys, Uncached: 1, Transfer: 47, Held: 64, Cached: 63}
		})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	id := leg()
	if got := r.Load(); got.PrefillTokens != 1 || got.TransferTokens != 47 || got.PrefillHeldTokens != 64 || got.Running != 1 {
		t.Fatalf("decode leg booked: %+v, want 1 prefill token (the recomputed last one), 47 transfer", got)
	}
	routedAt := r.PrefillSince()
	c.t = c.t.Add(300 * time.Millisecond)
	if err := l.FirstToken(id); err != nil {
		t.Fatal(err)
	}
	if got := r.Load(); got != (Load{DecodeTokens: 64, Running: 1}) {
		t.Fatalf("after first token: %+v", got)
	}
	if r.PrefillSince() != routedAt {
		t.Errorf("PrefillSince moved to the decode leg's first token (%d -> %d): a transfer wait read as prefill progress", routedAt, r.PrefillSince())
	}
	if cal := l.Calibration("e0/0"); cal.DrainTokensPerS != 0 {
		t.Errorf("drain fitted from a transfer wait: %+v", cal)
	}
	if _, err := l.Done(id, nil); err != nil {
		t.Fatal(err)
	}
	// Taken back before its first token: the transfer leaves with it.
	id = leg()
	if _, err := l.Failed(id); err != nil {
		t.Fatal(err)
	}
	if got := r.Load(); got != (Load{}) {
		t.Fatalf("after failed: %+v", got)
	}
}
