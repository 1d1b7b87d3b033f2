package degraded

import (
	"sort"
	"time"
)

// Status is one reason in force on a replica.
type Status struct {
	Reason Reason    `json:"reason"`
	Since  time.Time `json:"since"`
	Detail string    `json:"detail"`
}

// Change is a reason that began or ended on a replica at an Update.
type Change struct {
	Replica string
	Reason  Reason
	Began   bool // false: ended
	Detail  string
}

// Replica is what Tracker holds for one replica.
type Replica struct {
	Degraded []Status
	Demoted  bool
}

type history struct {
	samples []Sample // oldest first, bounded
	cur     map[Reason]Status
	demoted bool
}

// Tracker keeps each replica's recent samples and the reasons in force. Not safe for concurrent
// use; the router calls it from one loop.
type Tracker struct {
	// Interval is the expected time between Updates; it bounds the samples kept per replica.
	Interval time.Duration
	reps     map[string]*history
}

// NewTracker returns a tracker for Updates about every interval.
func NewTracker(interval time.Duration) *Tracker {
	if interval <= 0 {
		interval = 5 * time.Second
	}
	return &Tracker{Interval: interval, reps: map[string]*history{}}
}

// Update records one sample per replica (keyed by replica name, at now), evaluates each against
// the oldest sample inside the window, and returns the reasons that began or ended. Replicas
// absent from samples are forgotten.
func (t *Tracker) Update(now time.Time, samples map[string]Sample) []Change {
	var changes []Change
	names := make([]string, 0, len(samples))
	for n := range samples {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		s := samples[name]
		s.At = now
		h := t.reps[name]
		if h == nil {
			// A replica's counters start at zero with its stream, so a zero sample is its true
			// baseline: a fault counted before the first Update is still seen.
			h = &history{cur: map[Reason]Status{}, samples: []Sample{{At: now, Events: s.Events, State: s.State}}}
			t.reps[name] = h
		}
		h.samples = append(h.samples, s)
		// Keep the newest sample at least Window old (the window's base) and everything after it.
		base := 0
		for i := range h.samples {
			if now.Sub(h.samples[i].At) >= Window {
				base = i
			}
		}
		h.samples = h.samples[base:]
		if max := int(Window/t.Interval) + 4; len(h.samples) > max { // a stalled clock or a burst of Updates
			h.samples = h.samples[len(h.samples)-max:]
		}
		var found []Finding
		if len(h.samples) > 1 {
			found, h.demoted = Evaluate(h.samples)
		}
		seen := map[Reason]bool{}
		for _, f := range found {
			seen[f.Reason] = true
			st, ok := h.cur[f.Reason]
			if !ok {
				st = Status{Reason: f.Reason, Since: now}
				changes = append(changes, Change{Replica: name, Reason: f.Reason, Began: true, Detail: f.Detail})
			}
			st.Detail = f.Detail
			h.cur[f.Reason] = st
		}
		for r, st := range h.cur {
			if !seen[r] {
				delete(h.cur, r)
				changes = append(changes, Change{Replica: name, Reason: r, Detail: st.Detail})
			}
		}
	}
	for name := range t.reps {
		if _, ok := samples[name]; !ok {
			delete(t.reps, name)
		}
	}
	return changes
}

// Get returns the replica's reasons in force (in Reasons order) and whether it is demoted.
func (t *Tracker) Get(name string) Replica {
	h := t.reps[name]
	if h == nil {
		return Replica{}
	}
	out := Replica{Demoted: h.demoted}
	for _, r := range Reasons {
		if st, ok := h.cur[r]; ok {
			out.Degraded = append(out.Degraded, st)
		}
	}
	return out
}
