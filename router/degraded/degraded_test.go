package degraded

import (
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
		{"no events for a whole window while routed", base, at(Window, func(s *Sample) { s.Routed += 1 }), []Reason{NoEvents}, false},
		{"no events and nothing routed", base, at(Window, func(s *Sample) {}), nil, false},
		{"no events needs a whole window", base, at(Window/2, func(s *Sample) { s.Routed += 1 }), nil, false},
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
			got, demote := Evaluate(c.prev, c.cur)
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
