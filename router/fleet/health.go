package fleet

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/router/degraded"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
)

// DefaultHealthInterval is how often the fleet samples every replica's counters for the
// degraded reasons (Options.HealthInterval).
const DefaultHealthInterval = 5 * time.Second

// repHealth is what only the health loop touches.
type repHealth struct {
	last     kvevents.Stats
	haveLast bool
	// dropsLogged: the kinds of drop already logged for the stream (kvevents.FirstDrops).
	dropsLogged map[string]bool
}

// stateTrail records the states a stream passes through between two health samples, pushed by
// the stream's OnChange (its worker goroutine), so a change that heals before the next sample
// (a gap repaired by replay, a restart caught up) is still logged, once, at that sample. It keeps
// the first trailMax states and counts the rest: one log line per replica per sample at most,
// whatever a flapping stream does.
type stateTrail struct {
	mu     sync.Mutex
	states []kvevents.StreamState
	more   int
	latest kvevents.StreamState // valid once anything was pushed
	pushed bool
}

const trailMax = 8

func (t *stateTrail) push(s kvevents.StreamState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pushed && t.latest == s {
		return
	}
	t.latest, t.pushed = s, true
	if len(t.states) < trailMax {
		t.states = append(t.states, s)
	} else {
		t.more++
	}
}

// drain returns the states since the last drain, oldest first, and how many more there were;
// the next trail starts from the latest state.
func (t *stateTrail) drain() ([]kvevents.StreamState, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	states, more := t.states, t.more
	t.states, t.more = nil, 0
	if t.pushed {
		t.states = append(t.states, t.latest)
	}
	return states, more
}

// trailPath renders a trail as "exact>replaying>exact" (and "+N more" past trailMax).
func trailPath(states []kvevents.StreamState, more int) string {
	parts := make([]string, len(states))
	for i, s := range states {
		parts[i] = s.String()
	}
	p := strings.Join(parts, ">")
	if more > 0 {
		p += fmt.Sprintf(" +%d more", more)
	}
	return p
}

// healthLoop samples every replica each interval.
func (f *Fleet) healthLoop(ctx context.Context) {
	t := time.NewTicker(f.o.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.HealthTick(f.o.Now())
		}
	}
}

// HealthTick samples every replica's counters, updates the degraded reasons (logging each
// change once), logs every stream state change once with what moved, and demotes or restores
// replicas for approximate scoring (pushed into their views).
func (f *Fleet) HealthTick(now time.Time) {
	f.healthMu.Lock()
	defer f.healthMu.Unlock()
	reps := f.Replicas()
	samples := make(map[string]degraded.Sample, len(reps))
	byName := make(map[string]*Replica, len(reps))
	byID := make(map[index.ReplicaID]string, len(reps))
	for _, r := range reps {
		byID[r.ID] = r.Name
	}
	for _, r := range reps {
		byName[r.Name] = r
		c := &r.C
		smp := degraded.Sample{Events: r.Stream, Routed: c.Routed.Load(), MultimodalRouted: c.MultimodalRouted.Load(),
			TokenizerFailures: c.TokenizeFailures.Load(), ExactPredicted: c.ExactPredicted.Load(), ExactActual: c.ExactActual.Load()}
		if p := c.tokErr.Load(); p != nil {
			smp.TokenizerError = *p
		}
		if f.o.Peers != nil {
			if n, peer, ok := f.o.Peers.Mismatches(r.ID); ok {
				smp.PeerMismatches, smp.PeerMismatch = n, byID[peer]
			}
		}
		if r.Stream && f.o.Sub != nil {
			if st, ok := f.o.Sub.Stats(r.Eng.Name, r.Rank); ok {
				smp.State, smp.Partial, smp.LastApplied = st.State.String(), st.Partial, st.LastApplied
				smp.QuietRequests, smp.LastQuiet = st.QuietRequests, st.LastQuiet
				smp.Received, smp.Applied, smp.DecodeErrors, smp.Panics = st.Received, st.Applied, st.DecodeErrors, st.Panics
				smp.Dropped = st.Duplicates + st.TopicMismatches + st.MalformedFrames
				smp.BlocksStored, smp.UnknownParent, smp.RekeyErrors = st.BlocksStored, st.UnknownParent, st.RekeyErrors
				smp.SkippedGroups, smp.ParityMismatch = st.SkippedGroups, st.ParityMismatches
				f.logStateChange(r, st)
			}
		}
		samples[r.Name] = smp
	}
	for _, c := range f.tracker.Update(now, samples) {
		if c.Began {
			f.log.Warn("replica degraded", "replica", c.Replica, "reason", string(c.Reason), "detail", c.Detail)
		} else {
			f.log.Info("replica no longer degraded", "replica", c.Replica, "reason", string(c.Reason))
		}
	}
	for name, r := range byName {
		got := f.tracker.Get(name)
		was := r.View().Demoted
		r.update(func(v *View) { v.Demoted, v.Degraded = got.Demoted, got.Degraded })
		if was != got.Demoted {
			if got.Demoted {
				f.log.Warn("replica demoted to approximate scoring: evidence its keys are wrong", "replica", name)
			} else {
				f.log.Info("replica scored from its exact index again", "replica", name)
			}
		}
	}
}

// logStateChange logs a stream's state change once, with the counters that moved since the
// last sample (the reason the stream gives no other way).
func (f *Fleet) logStateChange(r *Replica, st kvevents.Stats) {
	h := &r.h
	prev, had := h.last, h.haveLast
	h.last, h.haveLast = st, true
	// Also the first of each kind of drop on the stream: a WARN each, the counters carry the rest.
	if h.dropsLogged == nil {
		h.dropsLogged = map[string]bool{}
	}
	// A stream's counters start at zero, so the first sample's are all new.
	for _, c := range kvevents.FirstDrops(prev, st, h.dropsLogged) {
		f.log.Warn("KV events dropped: "+c.Help+" Further ones are counted, not logged.", "replica", r.Name, "counter", c.Key,
			"count", c.Value, "metric", "kvroute_router_"+c.Metric)
	}
	trail, more := r.trail.drain()
	// The trail shows a change even where the two samples agree: one that healed within the
	// sample (a gap repaired by replay).
	passed := len(trail) > 1 || more > 0
	if !had || (prev.State == st.State && !passed) {
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
	lvl := f.log.Warn
	if st.State == kvevents.Exact {
		lvl = f.log.Info
	}
	args := []any{"replica", r.Name, "from", prev.State.String(), "to", st.State.String(), "why", why}
	if passed {
		args = append(args, "path", trailPath(trail, more))
	}
	lvl("event stream state changed", args...)
}

// Degraded returns every replica with a reason in force, by replica name ("engine/rank").
func (f *Fleet) Degraded() map[string][]degraded.Status {
	out := map[string][]degraded.Status{}
	for _, r := range f.Replicas() {
		if d := r.View().Degraded; len(d) > 0 {
			out[r.Name] = d
		}
	}
	return out
}

// MustStoreBlock reports whether serving a prompt of promptTokens, of which cachedTokens were
// prefix-cache hits, stored at least one new full block, so that an engine publishing events
// must have sent a BlockStored for it. vLLM's hits are whole blocks from the start, capped so
// that the last prompt token is computed (vllm/v1/core/kv_cache_manager.py,
// get_computed_blocks): when the prompt ends on a block boundary, a hit one block short of the
// prompt may have left out a block that is already stored and is only recomputed, so that block
// is not counted. A repeat of a cached prompt, which publishes nothing in incremental mode, is
// therefore never taken for a silent publisher.
func MustStoreBlock(promptTokens, cachedTokens, blockSize int) bool {
	if blockSize <= 0 || promptTokens <= 0 {
		return false
	}
	full, hit := promptTokens/blockSize, max(cachedTokens, 0)/blockSize
	fresh := full - hit
	if promptTokens%blockSize == 0 && hit == full-1 {
		fresh-- // possibly a capped hit's recomputed block
	}
	return fresh >= 1
}

// Served is told of an answer the replica's engine gave for a prompt of promptTokens, of which
// cached were prefix-cache hits (as the engine reported them, or as the router predicted when
// the engine reports none), at blockSize. It passes on to the replica's stream, which owns the
// verdict on a publisher that went quiet, whether the answer must have stored a block.
func (f *Fleet) Served(rep *Replica, promptTokens, cached, blockSize int) {
	if !rep.Stream || f.o.Sub == nil {
		return
	}
	_ = f.o.Sub.Served(rep.Eng.Name, rep.Rank, MustStoreBlock(promptTokens, cached, blockSize))
}

// The fleet is the one writer of an engine's health (Engine.Health): its probes, and what the
// request path reports through the three methods below.

// AttemptFailed records that an engine failed a request (why): before the first token, or an
// answer cut after it. unreachable (a refused connection) takes the engine out of routing at
// once; any other failure counts towards its passive backoff.
func (f *Fleet) AttemptFailed(e *Engine, why string, unreachable bool) {
	if unreachable {
		e.Health.Unreachable(f.o.Now(), why)
		return
	}
	e.Health.Failure(f.o.Now(), why)
}

// AttemptServed records that an engine answered a request cleanly.
func (f *Fleet) AttemptServed(e *Engine) { e.Health.Success() }
