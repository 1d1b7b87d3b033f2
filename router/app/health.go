package app

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/router/degraded"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/tokens"
)

// unkeyedMultimodal is the unkeyed reason of a request carrying media (tokens.Multimodal): the
// engine keys its image blocks with the media's identity, which the router does not compute yet,
// so such a request is routed by load, without keys, until it does.
const unkeyedMultimodal = "multimodal"

// defaultHealthInterval is how often the router samples every replica's counters for the
// degraded reasons (Options.HealthInterval).
const defaultHealthInterval = 5 * time.Second

// repHealth is what the router counts for a replica's degraded reasons besides the stream's own
// counters, and what the last evaluation decided.
type repHealth struct {
	routed, mmRouted, tokFail atomic.Uint64
	tokErr                    atomic.Pointer[string]
	// exactPred, exactActual: cached tokens predicted and reported for exact-mode decisions.
	exactPred, exactActual atomic.Uint64

	demoted  atomic.Bool
	degraded atomic.Pointer[[]degraded.Status]

	// Only the health loop touches these.
	last     kvevents.Stats
	haveLast bool
	// dropsLogged: the kinds of drop already logged for the stream (kvevents.FirstDrops).
	dropsLogged map[string]bool
}

// noteTokenizeFailure counts a failed render against the engine that was asked, when the
// failure is the engine's (server error, connection, auth), never the client's.
func (s *Router) noteTokenizeFailure(e *engine, err error) {
	if e == nil || len(e.reps) == 0 || !tokens.EngineFault(err) {
		return
	}
	h := &e.reps[0].h // render calls go to the engine; rank 0 carries them
	h.tokFail.Add(1)
	msg := err.Error()
	if len(msg) > 200 {
		msg = msg[:200]
	}
	h.tokErr.Store(&msg)
}

// healthLoop samples every replica each interval.
func (s *Router) healthLoop(ctx context.Context) {
	t := time.NewTicker(s.o.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.healthTick(s.now())
		}
	}
}

// healthTick samples every replica's counters, updates the degraded reasons (logging each
// change once), logs every stream state change once with what moved, and demotes or restores
// replicas for approximate scoring.
func (s *Router) healthTick(now time.Time) {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	reps := s.reps()
	samples := make(map[string]degraded.Sample, len(reps))
	byName := make(map[string]*replica, len(reps))
	byID := make(map[index.ReplicaID]string, len(reps))
	for _, r := range reps {
		byID[r.id] = r.name
	}
	for _, r := range reps {
		byName[r.name] = r
		h := &r.h
		smp := degraded.Sample{Events: r.stream, Routed: h.routed.Load(), MultimodalRouted: h.mmRouted.Load(),
			TokenizerFailures: h.tokFail.Load(), ExactPredicted: h.exactPred.Load(), ExactActual: h.exactActual.Load(),
			QuietRequests: uint64(max(r.quiet.Load(), 0))}
		if p := h.tokErr.Load(); p != nil {
			smp.TokenizerError = *p
		}
		if s.peers != nil {
			if n, peer, ok := s.peers.Mismatches(r.id); ok {
				smp.PeerMismatches, smp.PeerMismatch = n, byID[peer]
			}
		}
		if r.stream && s.sub != nil {
			if st, ok := s.sub.Stats(r.eng.name, r.rank); ok {
				smp.State = st.State.String()
				smp.Received, smp.Applied, smp.DecodeErrors, smp.Panics = st.Received, st.Applied, st.DecodeErrors, st.Panics
				smp.Dropped = st.Duplicates + st.TopicMismatches + st.MalformedFrames
				smp.BlocksStored, smp.UnknownParent, smp.RekeyErrors = st.BlocksStored, st.UnknownParent, st.RekeyErrors
				smp.SkippedGroups, smp.ParityMismatch = st.SkippedGroups, st.ParityMismatches
				s.logStateChange(r, st)
			}
		}
		samples[r.name] = smp
	}
	for _, c := range s.tracker.Update(now, samples) {
		if c.Began {
			s.log.Warn("replica degraded", "replica", c.Replica, "reason", string(c.Reason), "detail", c.Detail)
		} else {
			s.log.Info("replica no longer degraded", "replica", c.Replica, "reason", string(c.Reason))
		}
	}
	for name, r := range byName {
		got := s.tracker.Get(name)
		if was := r.h.demoted.Swap(got.Demoted); was != got.Demoted {
			if got.Demoted {
				s.log.Warn("replica demoted to approximate scoring: evidence its keys are wrong", "replica", name)
			} else {
				s.log.Info("replica scored from its exact index again", "replica", name)
			}
		}
		d := got.Degraded
		r.h.degraded.Store(&d)
	}
}

// logStateChange logs a stream's state change once, with the counters that moved since the
// last sample (the reason the stream gives no other way).
func (s *Router) logStateChange(r *replica, st kvevents.Stats) {
	h := &r.h
	prev, had := h.last, h.haveLast
	h.last, h.haveLast = st, true
	// Also the first of each kind of drop on the stream: a WARN each, the counters carry the rest.
	if h.dropsLogged == nil {
		h.dropsLogged = map[string]bool{}
	}
	// A stream's counters start at zero, so the first sample's are all new.
	for _, c := range kvevents.FirstDrops(prev, st, h.dropsLogged) {
		s.log.Warn("KV events dropped: "+c.Help+" Further ones are counted, not logged.", "replica", r.name, "counter", c.Key,
			"count", c.Value, "metric", "kvroute_router_"+c.Metric)
	}
	if !had || prev.State == st.State {
		return
	}
	var moved []string
	pc := prev.Counters()
	for i, c := range st.Counters() {
		switch c.Key {
		case "received", "applied", "events", "blocks_stored", "blocks_removed", "parity_checked", "replayed_batches":
			continue // traffic, not a reason
		}
		if c.Value > pc[i].Value {
			moved = append(moved, fmt.Sprintf("%s+%d", c.Key, c.Value-pc[i].Value))
		}
	}
	why := strings.Join(moved, ",")
	if why == "" {
		why = "no counter moved"
	}
	lvl := s.log.Warn
	if st.State == kvevents.Exact {
		lvl = s.log.Info
	}
	lvl("event stream state changed", "replica", r.name, "from", prev.State.String(), "to", st.State.String(), "why", why)
}

// degradedOf returns the replica's reasons in force (nil when none or not evaluated yet).
func (r *replica) degradedOf() []degraded.Status {
	if p := r.h.degraded.Load(); p != nil {
		return *p
	}
	return nil
}

// Degraded returns every replica with a reason in force, by replica name ("engine/rank").
func (s *Router) Degraded() map[string][]degraded.Status {
	out := map[string][]degraded.Status{}
	for _, r := range s.reps() {
		if d := r.degradedOf(); len(d) > 0 {
			out[r.name] = d
		}
	}
	return out
}

// degradedNames is the reason names in force on a replica, for /metrics.
func degradedNames(d []degraded.Status) []string {
	out := make([]string, len(d))
	for i, st := range d {
		out[i] = string(st.Reason)
	}
	return out
}

func reasonNames() []string {
	out := make([]string, len(degraded.Reasons))
	for i, r := range degraded.Reasons {
		out[i] = string(r)
	}
	return out
}
