package load

import (
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
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
	id, rc, err := l.Decide(req, cands, func(i int) Routing {
		return Routing{Replica: r, Keys: req.Keys, Uncached: 48, Held: 64, Cached: 16}
	})
	if err != nil || rc.Chosen != 0 || pol.routed != 1 {
		t.Fatalf("decide: %v chosen %d routed %d", err, rc.Chosen, pol.routed)
	}
	if got := r.Load(); got != (Load{PrefillTokens: 48, Running: 1}) {
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
	id, _, err := l.Decide(req, []score.Candidate{{ID: "e1/0", Healthy: true}}, func(int) Routing {
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

// A peer router's routed keys enter the predicted index as this router's own would (a sibling
// reaching this router matches them), add no load, expire with the TTL, and are not entered for
// a replica that left.
func TestPredictPeer(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Options{Now: c.now, Policy: &recorder{}, PredictedTTL: 10 * time.Second})
	r := l.NewReplica(0, "e0/0")
	l.PredictPeer(r, keys(4))
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
	l.PredictPeer(r, keys(4))
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
