package replay

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/kvroute/kvroute/sim/fleet"
)

// Request is one request to replay, in trace units (lengths in trace tokens, 512 per block).
type Request struct {
	At           time.Duration // offset from the start of the replay, already compressed by the speed
	HashIDs      []uint64
	InputLength  int
	OutputLength int
	// Model is the LoRA adapter to ask for ("" = the base model); CacheSalt isolates a tenant's
	// cache (vLLM's cache_salt); Tenant names the tenant in reports.
	Model     string
	CacheSalt string
	Tenant    string
}

// ScaleUp grows the fleet mid-run: at At the engines file goes from From to To entries, the new
// ones with warmup-until = now + Warmup.
type ScaleUp struct {
	At       time.Duration
	From, To int
	Warmup   time.Duration
}

// Workload is what one run replays.
type Workload struct {
	Name     string
	Requests []Request
	ScaleUp  *ScaleUp
	// Tenants lists the LoRA adapters the engines must serve (the tenants regime).
	Adapters []string
	// Warm are requests each run sends before Requests, through the same routers, and does not
	// measure: a fleet that has served traffic before (its engines' caches and the routers'
	// index and windows hold it), as a production fleet has, where a replay from cold engines
	// measures a cold start. They go out at their own At (from the warm phase's start); the
	// measured replay starts once every one has completed. The routers' own counters
	// (RunResult.Accuracy) include them; the outcomes, percentiles and CPU figures do not.
	Warm []Request
}

// WarmSlice is the n requests of a trace before offset, timestamps compressed by speed from the
// first of them: the traffic a fleet served before TraceSlice(t, offset, ...), for Workload.Warm.
func WarmSlice(t *fleet.Trace, offset, n int, speed float64) ([]Request, error) {
	switch {
	case n <= 0:
		return nil, nil
	case speed <= 0:
		return nil, fmt.Errorf("speed %v must be > 0", speed)
	case n > offset || offset > len(t.Requests):
		return nil, fmt.Errorf("%d warm-up requests need an offset of at least %d (it is %d, in a trace of %d)", n, n, offset, len(t.Requests))
	}
	reqs := t.Requests[offset-n : offset]
	out := make([]Request, 0, n)
	t0 := reqs[0].TimestampMs
	for _, q := range reqs {
		at := time.Duration(float64(q.TimestampMs-t0) / speed * float64(time.Millisecond))
		out = append(out, Request{At: at, HashIDs: q.HashIDs, InputLength: q.InputLength, OutputLength: q.OutputLength})
	}
	return out, nil
}

// Span is the arrival time of the last request.
func (w *Workload) Span() time.Duration {
	if len(w.Requests) == 0 {
		return 0
	}
	return w.Requests[len(w.Requests)-1].At
}

// TraceSlice selects requests [offset, offset+max) of a trace (max <= 0: all), compresses their
// timestamps by speed relative to the first one, and drops those arriving after duration
// (duration <= 0: no bound).
func TraceSlice(t *fleet.Trace, offset, maxRequests int, speed float64, duration time.Duration) (Workload, error) {
	if speed <= 0 {
		return Workload{}, fmt.Errorf("speed %v must be > 0", speed)
	}
	if offset < 0 || offset >= len(t.Requests) {
		return Workload{}, fmt.Errorf("offset %d outside the trace's %d requests", offset, len(t.Requests))
	}
	reqs := t.Requests[offset:]
	if maxRequests > 0 && len(reqs) > maxRequests {
		reqs = reqs[:maxRequests]
	}
	w := Workload{Name: t.Name}
	t0 := reqs[0].TimestampMs
	for _, q := range reqs {
		at := time.Duration(float64(q.TimestampMs-t0) / speed * float64(time.Millisecond))
		if duration > 0 && at > duration {
			break
		}
		w.Requests = append(w.Requests, Request{At: at, HashIDs: q.HashIDs, InputLength: q.InputLength, OutputLength: q.OutputLength})
	}
	return w, nil
}

// Trace is the workload as a fleet-model trace (arrival offsets as millisecond timestamps), so
// the fleet model can run the generated regimes. The fleet model has one model and no salts, so
// a request's LoRA adapter and cache salt are folded into its block ids: each (adapter, salt)
// gets its own copy of every id it uses, as the engine keys those blocks apart (the tenants
// regime shares no block across tenants here either).
func (w *Workload) Trace() *fleet.Trace {
	var top uint64
	for _, r := range w.Requests {
		for _, id := range r.HashIDs {
			top = max(top, id)
		}
	}
	type scoped struct {
		model, salt string
		id          uint64
	}
	own := map[scoped]uint64{}
	reqs := make([]fleet.Request, len(w.Requests))
	for i, r := range w.Requests {
		ids := r.HashIDs
		if r.Model != "" || r.CacheSalt != "" {
			ids = make([]uint64, len(r.HashIDs))
			for j, id := range r.HashIDs {
				k := scoped{r.Model, r.CacheSalt, id}
				n, ok := own[k]
				if !ok {
					top++
					n = top
					own[k] = n
				}
				ids[j] = n
			}
		}
		reqs[i] = fleet.Request{TimestampMs: r.At.Milliseconds(), InputLength: r.InputLength,
			OutputLength: r.OutputLength, HashIDs: ids}
		// A scale-up's fleet size over time, as a capture records it.
		if w.ScaleUp != nil {
			reqs[i].Replicas = w.ScaleUp.From
			if r.At >= w.ScaleUp.At {
				reqs[i].Replicas = w.ScaleUp.To
			}
		}
	}
	return fleet.NewTrace(w.Name, reqs)
}

// Jittered returns a copy of the workload for one seed: each arrival moves by a uniform offset in
// [0, jitter), which reorders requests that arrive closer together than that (the trace's own
// order is kept where it is further apart). Seed 0 with jitter 0 is the workload itself.
func (w Workload) Jittered(seed uint64, jitter time.Duration) Workload {
	out := w
	out.Requests = append([]Request(nil), w.Requests...)
	if jitter <= 0 {
		return out
	}
	rng := rand.New(rand.NewPCG(seed, 0x6a17))
	for i := range out.Requests {
		out.Requests[i].At += time.Duration(rng.Int64N(int64(jitter)))
	}
	sort.SliceStable(out.Requests, func(i, j int) bool { return out.Requests[i].At < out.Requests[j].At })
	return out
}
