package app

import (
	"context"
	"io"
	"time"

	"github.com/kvroute/kvroute/router/degraded"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/fleet"
	"github.com/kvroute/kvroute/router/tokens"
)

// The fleet's engines and replicas (router/fleet owns them; the request path holds them).
type (
	engine  = fleet.Engine
	replica = fleet.Replica
)

// unkeyedMultimodal is the unkeyed reason of a request carrying media (tokens.Multimodal): the
// engine keys its image blocks with the media's identity, which the router does not compute yet,
// so such a request is routed by load, without keys, until it does.
const unkeyedMultimodal = "multimodal"

// Where the fleet's block size came from (fleet.BlockSize).
const (
	blockSizeFromConfig    = fleet.BlockSizeFromConfig
	blockSizeFromDiscovery = fleet.BlockSizeFromDiscovery
	blockSizeFromEvents    = fleet.BlockSizeFromEvents
	blockSizeFromMetrics   = fleet.BlockSizeFromMetrics
	blockSizeUnknown       = fleet.BlockSizeUnknown
)

// apply hands a discovery snapshot to the fleet.
func (s *Router) apply(ctx context.Context, snap []discovery.Engine) { s.fleet.Apply(ctx, snap) }

func (s *Router) reps() []*replica { return s.fleet.Replicas() }

// healthTick runs one sample of the degraded reasons (fleet.HealthTick).
func (s *Router) healthTick(now time.Time) { s.fleet.HealthTick(now) }

// blockSize is the fleet's block size over reps' views and where it came from.
func (s *Router) blockSize(reps []*replica) (int, string) {
	vs := make([]*fleet.View, len(reps))
	for i, r := range reps {
		vs[i] = r.View()
	}
	return fleet.BlockSize(s.o.Config.BlockSize, vs)
}

// exactStream reports whether the replica is scored from its exact index alone (its view).
func (s *Router) exactStream(r *replica) bool {
	if s.exactHook != nil {
		return s.exactHook(r)
	}
	return r.View().Exact
}

func (s *Router) warmupCredit(until, now time.Time) float64 {
	return fleet.WarmupCredit(s.o.Config.Warmup, until, now)
}

// noteTokenizeFailure counts a failed render against the engine that was asked, when the
// failure is the engine's (server error, connection, auth), never the client's.
func (s *Router) noteTokenizeFailure(e *engine, err error) {
	if e == nil || len(e.Reps) == 0 || !tokens.EngineFault(err) {
		return
	}
	e.Reps[0].NoteTokenizeFailure(err.Error()) // render calls go to the engine; rank 0 carries them
}

// Degraded returns every replica with a reason in force, by replica name ("engine/rank").
func (s *Router) Degraded() map[string][]degraded.Status { return s.fleet.Degraded() }

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

// parseGPUBlocks finds num_gpu_blocks in a Prometheus text exposition (fleet.Parse).
func parseGPUBlocks(r io.Reader) int {
	page, err := io.ReadAll(io.LimitReader(r, 8<<20))
	if err != nil {
		return 0
	}
	smp, _ := fleet.Parse(page)
	return smp.GPUBlocks
}

// gpuBlocks reads an engine's num_gpu_blocks through the fleet's /metrics reader.
func (s *Router) gpuBlocks(ctx context.Context, base string) int { return s.fleet.GPUBlocks(ctx, base) }
