package degraded

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestEvaluate(t *testing.T) {
	base := Sample{At: t0, Events: true, State: "exact", Received: 100, Applied: 100, BlocksStored: 400, Routed: 50}
	at := func(d time.Duration, f func(*Sample)) Sample {
		s := base
		s.At = t0.Add(d)
		f(&s)
		return s
	}
	cases := []struct {
		name   string
		prev   Sample
		cur    Sample
		want   []Reason
		demote bool
	}{
		{"healthy", base, at(Window, func(s *Sample) { s.Received += 10; s.Applied += 10; s.BlocksStored += 40; s.Routed += 5 }), nil, false},
		{"undecodable", base, at(10*time.Second, func(s *Sample) { s.Received += 3; s.DecodeErrors = 3 }), []Reason{Undecodable}, false},
		{"decode errors among applied batches are not undecodable", base,
			at(10*time.Second, func(s *Sample) { s.Received += 4; s.DecodeErrors = 1; s.Applied += 3 }), nil, false},
		{"unchained", base, at(10*time.Second, func(s *Sample) {
			s.Received += 5
			s.Applied += 5
			s.UnknownParent = 30
			s.BlocksStored += 20
		}), []Reason{Unchained}, false},
		{"few unknown parents are not unchained", base, at(10*time.Second, func(s *Sample) {
			s.Received += 5
			s.Applied += 5
			s.UnknownParent = 3
			s.BlocksStored += 20
		}), nil, false},
		{"one quiet request, then no event for QuietWindow", base, at(QuietWindow, func(s *Sample) {
			s.Routed++
			s.QuietRequests = 1
			s.LastQuiet = t0.Add(time.Second)
		}), []Reason{NoEvents}, false},
		{"no events and nothing routed", base, at(Window, func(s *Sample) {}), nil, false},
		// Requests that stored no full block (shorter than a block, or a prefix-cache hit) publish
		// nothing: however many, a silent window is no evidence.
		{"routed requests that published nothing are not no-events", base, at(Window, func(s *Sample) { s.Routed += 5 }), nil, false},
		{"no events needs QuietWindow", base, at(QuietWindow-5*time.Second, func(s *Sample) {
			s.Routed++
			s.QuietRequests = 1
			s.LastQuiet = t0.Add(time.Second)
		}), nil, false},
		{"a quiet request before the last applied batch is not evidence", base, at(Window, func(s *Sample) {
			s.LastQuiet = t0.Add(-10 * time.Second)
			s.LastApplied = t0.Add(-5 * time.Second)
		}), nil, false},
		{"no events without a stream is nothing", Sample{At: t0}, Sample{At: t0.Add(Window), Routed: 3}, nil, false},
		{"stalled: received, none applied", base, at(10*time.Second, func(s *Sample) { s.Received += 7 }), []Reason{Stalled}, false},
		{"one message on its way to the worker is not a stall", base, at(10*time.Second, func(s *Sample) { s.Received++ }), nil, false},
		{"duplicates only are not stalled", base, at(10*time.Second, func(s *Sample) { s.Received += 7; s.Dropped += 7 }), nil, false},
		{"stalled: replaying throughout", func() Sample { s := base; s.State = "replaying"; return s }(),
			at(Window, func(s *Sample) { s.State = "replaying" }), []Reason{Stalled}, false},
		{"tokenizer failing", base, at(10*time.Second, func(s *Sample) {
			s.Received++
			s.Applied++
			s.TokenizerFailures = 2
			s.TokenizerError = "answered 503"
		}), []Reason{TokenizerFailing}, false},
		{"parity mismatch is reported, not demoted", base, at(10*time.Second, func(s *Sample) { s.Received++; s.Applied++; s.ParityMismatch = 1 }),
			[]Reason{HashMismatch}, false},
		{"peer mismatch", base, at(10*time.Second, func(s *Sample) {
			s.Received++
			s.Applied++
			s.PeerMismatches = 1
			s.PeerMismatch = "e1/0"
		}), []Reason{HashMismatch}, false},
		{"re-keying fails: demoted", base, at(10*time.Second, func(s *Sample) { s.Received++; s.Applied++; s.RekeyErrors = 9 }),
			[]Reason{KeysWrong}, true},
		{"predicted vs actual diverge: demoted", base, at(10*time.Second, func(s *Sample) {
			s.Received++
			s.Applied++
			s.ExactPredicted = 4096
			s.ExactActual = 512
		}), []Reason{KeysWrong}, true},
		{"small divergence is not evidence", base, at(10*time.Second, func(s *Sample) {
			s.Received++
			s.Applied++
			s.ExactPredicted = 4096
			s.ExactActual = 3000
		}), nil, false},
		{"too few tokens to judge", base, at(10*time.Second, func(s *Sample) {
			s.Received++
			s.Applied++
			s.ExactPredicted = 512
		}), nil, false},
		{"multimodal and hybrid", base, at(10*time.Second, func(s *Sample) {
			s.Received++
			s.Applied++
			s.MultimodalRouted = 2
			s.SkippedGroups = 4
		}), []Reason{MultimodalUnkeyed, HybridGroupsSkipped}, false},
		{"restarted counters count from zero", base, at(10*time.Second, func(s *Sample) {
			s.Received, s.Applied, s.BlocksStored, s.DecodeErrors = 2, 0, 0, 2
		}), []Reason{Undecodable}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, demote := Evaluate([]Sample{c.prev, c.cur})
			var reasons []Reason
			for _, f := range got {
				reasons = append(reasons, f.Reason)
				if f.Detail == "" {
					t.Errorf("%s without detail", f.Reason)
				}
			}
			if !reflect.DeepEqual(reasons, c.want) || demote != c.demote {
				t.Fatalf("got %v demote=%v, want %v demote=%v (%+v)", reasons, demote, c.want, c.demote, got)
			}
		})
	}
}

// The tracker slides the window over its samples: a fault is reported from the first Update
// that sees it, stays while it is inside the window, and ends (once) when the window has passed.
func TestTrackerWindow(t *testing.T) {
	tr := NewTracker(5 * time.Second)
	s := Sample{Events: true, State: "exact"}
	now := t0
	step := func(f func(*Sample)) []Change {
		now = now.Add(5 * time.Second)
		f(&s)
		return tr.Update(now, map[string]Sample{"e0/0": s})
	}
	flow := func(s *Sample) { s.Received++; s.Applied++; s.BlocksStored += 4 }
	if ch := step(flow); len(ch) != 0 {
		t.Fatalf("first sample: %v", ch)
	}
	step(flow)
	ch := step(func(s *Sample) { flow(s); s.ParityMismatch++ })
	if len(ch) != 1 || ch[0].Reason != HashMismatch || !ch[0].Began {
		t.Fatalf("changes %+v, want hash-mismatch began", ch)
	}
	since := now
	for i := 0; i < 10; i++ { // 50 s: still inside the window
		if ch := step(flow); len(ch) != 0 {
			t.Fatalf("step %d: %v", i, ch)
		}
	}
	got := tr.Get("e0/0")
	if len(got.Degraded) != 1 || !got.Degraded[0].Since.Equal(since) || got.Demoted {
		t.Fatalf("got %+v", got)
	}
	var ended []Change
	for i := 0; i < 4 && len(ended) == 0; i++ {
		ended = step(flow)
	}
	if len(ended) != 1 || ended[0].Began || ended[0].Reason != HashMismatch {
		t.Fatalf("ended %+v", ended)
	}
	if len(tr.Get("e0/0").Degraded) != 0 {
		t.Fatal("still degraded after the window")
	}
	// A replica gone from the samples is forgotten.
	tr.Update(now.Add(time.Second), map[string]Sample{})
	if len(tr.reps) != 0 {
		t.Fatal("replica kept")
	}
}

// A fault counted before the replica's first sample is reported at that sample: counters start
// at zero with the stream.
func TestTrackerFaultBeforeFirstSample(t *testing.T) {
	tr := NewTracker(5 * time.Second)
	ch := tr.Update(t0, map[string]Sample{"e1/0": {Events: true, State: "exact", Received: 4, Applied: 4, BlocksStored: 12, ParityMismatch: 1}})
	if len(ch) != 1 || ch[0].Reason != HashMismatch {
		t.Fatalf("changes %+v", ch)
	}
}

// The samples kept are bounded whatever the update rate.
func TestTrackerBounded(t *testing.T) {
	tr := NewTracker(5 * time.Second)
	for i := 0; i < 1000; i++ {
		tr.Update(t0.Add(time.Duration(i)*time.Millisecond), map[string]Sample{"a/0": {}})
	}
	if n := len(tr.reps["a/0"].samples); n > int(Window/tr.Interval)+4 {
		t.Fatalf("%d samples kept", n)
	}
}

// Every reason fires on its evidence, not on the window: after a healthy minute (whose counters
// would dilute a whole-window trigger) each fault is reported within two sample intervals of
// its first evidence (stalled-replaying: StalledReplaying plus one), and ends when its
// counter-evidence arrives or its evidence leaves the window. The clock is the test's.
func TestEveryReasonFiresOnEvidence(t *testing.T) {
	const interval = 5 * time.Second
	var now time.Time // the sample being taken, for the faults that stamp a time
	flow := func(s *Sample) {
		s.Received++
		s.Applied++
		s.LastApplied = now
		s.BlocksStored += 4
		s.Routed++
		s.QuietRequests = 0
		s.ExactPredicted += 2048
		s.ExactActual += 2048
	}
	cases := []struct {
		reason Reason
		fault  func(*Sample)
		within time.Duration // from the first faulty sample's interval
		demote bool
		// endsAtOnce: the first healthy sample ends it; otherwise it ends once the evidence
		// left the window.
		endsAtOnce bool
	}{
		{Undecodable, func(s *Sample) { s.Received += 2; s.DecodeErrors += 2 }, interval, false, true},
		{Stalled, func(s *Sample) { s.Received += 3 }, interval, false, true},
		{Stalled, func(s *Sample) { s.State = "replaying" }, StalledReplaying + interval, false, true},
		{Unchained, func(s *Sample) { flow(s); s.BlocksStored -= 2; s.UnknownParent += 8 }, 2 * interval, false, false},
		{NoEvents, func(s *Sample) { s.Routed += 2; s.QuietRequests += 2 }, 2 * interval, false, true},
		// Small traffic: one request that must have published, at the first faulty sample's
		// interval, then nothing: QuietWindow from the last healthy sample, which saw the last
		// message.
		{NoEvents, func(s *Sample) {
			if !s.LastQuiet.After(s.LastApplied) {
				s.Routed++
				s.QuietRequests++
				s.LastQuiet = now
			}
		}, QuietWindow, false, true},
		{Inexact, func(s *Sample) { s.State = "inexact"; s.Received++; s.Applied++ }, InexactFor + interval, false, true},
		{TokenizerFailing, func(s *Sample) { flow(s); s.TokenizerFailures++; s.TokenizerError = "connection refused" }, interval, false, false},
		{HashMismatch, func(s *Sample) { flow(s); s.ParityMismatch++ }, interval, false, false},
		{KeysWrong, func(s *Sample) { flow(s); s.RekeyErrors += 10 }, 2 * interval, true, false},
		{KeysWrong, func(s *Sample) { flow(s); s.ExactActual -= 2048 }, 2 * interval, true, false},
		{MultimodalUnkeyed, func(s *Sample) { flow(s); s.MultimodalRouted++ }, interval, false, false},
		{HybridGroupsSkipped, func(s *Sample) { flow(s); s.SkippedGroups++ }, interval, false, false},
		{Partial, func(s *Sample) { flow(s); s.State = "approximate"; s.Partial = true }, interval, false, true},
	}
	covered := map[Reason]bool{}
	for i, c := range cases {
		covered[c.reason] = true
		t.Run(fmt.Sprintf("%d-%s", i, c.reason), func(t *testing.T) {
			tr := NewTracker(interval)
			s := Sample{Events: true, State: "exact"}
			now = t0
			step := func(f func(*Sample)) []Change {
				now = now.Add(interval)
				f(&s)
				return tr.Update(now, map[string]Sample{"e0/0": s})
			}
			for range int(Window/interval) + 2 {
				if ch := step(flow); len(ch) != 0 {
					t.Fatalf("healthy: %+v", ch)
				}
			}
			start := now
			var began time.Duration
			for began == 0 {
				ch := step(c.fault)
				for _, x := range ch {
					if x.Reason != c.reason || !x.Began {
						t.Fatalf("unexpected change %+v", x)
					}
					began = now.Sub(start)
				}
				if now.Sub(start) > Window {
					t.Fatalf("%s not reported a minute into the fault", c.reason)
				}
			}
			if began > c.within {
				t.Fatalf("%s reported %v into the fault, want within %v", c.reason, began, c.within)
			}
			if got := tr.Get("e0/0"); got.Demoted != c.demote {
				t.Fatalf("demoted %v, want %v", got.Demoted, c.demote)
			}
			s.State = "exact"
			healStart := now
			var ended time.Duration
			for ended == 0 {
				for _, x := range step(flow) {
					if x.Reason == c.reason && !x.Began {
						ended = now.Sub(healStart)
					}
				}
				if now.Sub(healStart) > Window+2*interval {
					t.Fatalf("%s still in force %v after the fault ended", c.reason, now.Sub(healStart))
				}
			}
			if c.endsAtOnce && ended != interval {
				t.Fatalf("%s ended %v after the fault, want at the first healthy sample", c.reason, ended)
			}
			if tr.Get("e0/0").Demoted {
				t.Fatal("still demoted")
			}
		})
	}
	for _, r := range Reasons {
		if !covered[r] {
			t.Errorf("reason %s has no case", r)
		}
	}
}

// no-events needs evidence: quiet requests served while a message arrived in the same interval,
// or fewer than QuietRequests of them, are not enough; for small traffic, one of them followed
// by QuietWindow without a message is, and requests that published nothing never are.
func TestNoEventsEvidence(t *testing.T) {
	at := func(sec int, f func(*Sample)) Sample {
		s := Sample{At: t0.Add(time.Duration(sec) * time.Second), Events: true, State: "exact", Received: 10, Applied: 10}
		f(&s)
		return s
	}
	for _, c := range []struct {
		name string
		hist []Sample
		want bool
	}{
		{"three quiet requests, nothing received", []Sample{at(0, func(*Sample) {}), at(5, func(s *Sample) { s.QuietRequests = 3 })}, true},
		{"two are not enough", []Sample{at(0, func(*Sample) {}), at(5, func(s *Sample) { s.QuietRequests = 2 })}, false},
		{"a message since", []Sample{at(0, func(*Sample) {}), at(5, func(s *Sample) { s.QuietRequests = 3 }),
			at(10, func(s *Sample) { s.QuietRequests = 3; s.Received++; s.Applied++ })}, false},
		{"quiet requests before the last message do not count", []Sample{at(0, func(*Sample) {}),
			at(5, func(s *Sample) { s.QuietRequests = 3; s.Received++; s.Applied++ }),
			at(10, func(s *Sample) { s.QuietRequests = 4; s.Received++; s.Applied++ })}, false},
		{"the count restarted after a message: all new", []Sample{at(0, func(s *Sample) { s.QuietRequests = 7 }),
			at(5, func(s *Sample) { s.QuietRequests = 7; s.Received++ }), at(10, func(s *Sample) { s.QuietRequests = 3; s.Received++ })}, true},
		{"small traffic: one quiet request, then QuietWindow silent", []Sample{at(0, func(*Sample) {}),
			at(45, func(s *Sample) { s.Routed, s.QuietRequests, s.LastQuiet = 1, 1, t0.Add(time.Second) })}, true},
		// The request came before the sample that saw the last message: still evidence, the
		// silence counting from that sample.
		{"small traffic: the quiet request just before the last message's sample", []Sample{
			at(0, func(s *Sample) { s.LastApplied = t0 }),
			at(5, func(s *Sample) {
				s.Received++
				s.Applied++
				s.LastApplied = t0.Add(time.Second)
				s.LastQuiet = t0.Add(4 * time.Second)
			}),
			at(50, func(s *Sample) {
				s.Received++
				s.Applied++
				s.LastApplied, s.LastQuiet, s.QuietRequests, s.Routed = t0.Add(time.Second), t0.Add(4*time.Second), 1, 1
			})}, true},
		{"small traffic: routed only, silent whole window", []Sample{at(0, func(*Sample) {}), at(60, func(s *Sample) { s.Routed = 1 })}, false},
		{"small traffic: 40 s silent is not enough", []Sample{at(0, func(*Sample) {}),
			at(40, func(s *Sample) { s.Routed, s.QuietRequests, s.LastQuiet = 1, 1, t0.Add(time.Second) })}, false},
		{"no stream configured", []Sample{{At: t0, QuietRequests: 0}, {At: t0.Add(5 * time.Second), QuietRequests: 9}}, false},
	} {
		got, _ := Evaluate(c.hist)
		has := false
		for _, f := range got {
			has = has || f.Reason == NoEvents
		}
		if has != c.want {
			t.Errorf("%s: no-events %v, want %v (%+v)", c.name, has, c.want, got)
		}
	}
}
