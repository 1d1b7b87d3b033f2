package fleet

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvroute/kvroute/router/backlog"
	"github.com/kvroute/kvroute/router/index"
)

// Autoscale drives the fleet's size the way the operator's HPA does, instead of the trace's
// replica counts: every SyncSeconds it reads a signal, computes the HPA's desired replica
// count, and the replicas it adds become routable ProvisionSeconds later (a pod scheduled, the
// image pulled, the weights loaded). Config.Replicas is the maximum.
//
// The signals are those the operator renders (controllers/render autoscaling.go): the
// routers' backlog (kvroute_router_backlog_seconds, computed by router/backlog from this
// model's ledger exactly as kvrouter computes it; absent, read 0, until the drain rate is
// measured) as an External AverageValue metric, and vLLM's num_requests_waiting summed over
// the ready replicas as a Pods AverageValue metric. With both targets set the HPA takes the
// larger recommendation, as it does with several metrics.
type Autoscale struct {
	// BacklogTarget is spec.autoscaling.targetBacklogPerReplica in seconds (0: not a metric).
	BacklogTarget float64
	// QueueTarget is targetQueuePerReplica, waiting requests per replica (0: not a metric).
	QueueTarget float64
	// MinReplicas is the start and the floor.
	MinReplicas int
	// SyncSeconds is the HPA's sync period (15, kube-controller-manager's default).
	SyncSeconds float64
	// ProvisionSeconds is from the scale-up decision to the replica taking requests.
	ProvisionSeconds float64
	// ScaleDown lets the HPA scale down (its default behavior: to the highest recommendation
	// of the last 300 s, all at once). Off, the run measures the scale-up alone.
	ScaleDown bool
}

// The HPA's defaults (k8s.io/kubernetes pkg/controller/podautoscaler: a 0.1 tolerance; the
// default behavior scales up by max(100 %, 4 pods) per 15 s and down to the highest
// recommendation of the last 300 s).
const (
	hpaTolerance          = 0.1
	hpaScaleDownWindowSec = 300
)

// ScaleEvent is one change of the fleet's size.
type ScaleEvent struct {
	At      float64 `json:"at_s"`
	Desired int     `json:"desired"` // the HPA's replicas (ready and provisioning)
	Ready   int     `json:"ready"`
}

// ScaleResult is what an autoscaled run adds to a Result.
type ScaleResult struct {
	Events []ScaleEvent `json:"events"`
	// ReplicaSeconds is the replicas held over the trace's span, provisioning ones included (a
	// pod holds its GPU while it loads).
	ReplicaSeconds float64 `json:"replica_seconds"`
	// ArrivalS and TTFTS are every request's arrival and TTFT in seconds, in trace order.
	ArrivalS []float64 `json:"-"`
	TTFTS    []float64 `json:"-"`
}

type autoscaler struct {
	cfg      Autoscale
	max      int
	desired  int       // the HPA's replicas
	pending  []float64 // ready times of the replicas provisioning, ascending
	nextTick float64
	recs     []ScaleEvent // recommendations of the last hpaScaleDownWindowSec (Desired, At)
	out      ScaleResult
	lastT    float64
}

func newAutoscaler(a Autoscale, maxReplicas int) (*autoscaler, error) {
	if a.MinReplicas < 1 || a.MinReplicas > maxReplicas {
		return nil, fmt.Errorf("fleet: autoscale min replicas %d must be between 1 and %d", a.MinReplicas, maxReplicas)
	}
	if a.BacklogTarget <= 0 && a.QueueTarget <= 0 {
		return nil, fmt.Errorf("fleet: autoscale needs a backlog or a queue target")
	}
	if a.SyncSeconds <= 0 {
		a.SyncSeconds = 15
	}
	return &autoscaler{cfg: a, max: maxReplicas, desired: a.MinReplicas, nextTick: a.SyncSeconds}, nil
}

// autoscaleUntil runs the autoscaler's syncs and the replicas' arrivals up to time t, in time
// order, advancing the engines to each.
func (s *sim) autoscaleUntil(t float64) {
	as := s.as
	for {
		next, ready := as.nextTick, false
		if len(as.pending) > 0 && as.pending[0] <= next {
			next, ready = as.pending[0], true
		}
		if next > t {
			return
		}
		s.flushKicks(next)
		s.advance(next)
		s.clock = next
		as.account(next)
		if ready {
			as.pending = as.pending[1:]
			s.resize(s.members + 1)
		} else {
			s.hpaSync(next)
			as.nextTick += as.cfg.SyncSeconds
		}
		as.out.Events = append(as.out.Events, ScaleEvent{At: next, Desired: as.desired, Ready: s.members})
	}
}

// account adds the replicas held since the last call.
func (as *autoscaler) account(t float64) {
	as.out.ReplicaSeconds += float64(as.desired) * (t - as.lastT)
	as.lastT = t
}

// hpaSync is one HPA sync at time t.
func (s *sim) hpaSync(t float64) {
	as := s.as
	cur := as.desired
	rec := 0
	if as.cfg.BacklogTarget > 0 {
		ms := make([]backlog.Member, s.members)
		for r := range s.members {
			ms[r] = backlog.Member{ID: index.ReplicaID(r), Name: s.reps[r].id, Ready: true}
		}
		f := backlog.FromLedger(s.ledger, ms, time.Duration(t*1e9), s.now())
		v := 0.0 // absent until measured: the adapter's rule reads 0
		if f.Measured {
			v = f.Seconds
		}
		rec = max(rec, hpaReplicas(v, as.cfg.BacklogTarget, cur))
	}
	if as.cfg.QueueTarget > 0 {
		waiting := 0
		for _, rep := range s.reps[:s.members] {
			waiting += rep.queued()
		}
		rec = max(rec, hpaReplicas(float64(waiting), as.cfg.QueueTarget, cur))
	}
	rec = min(max(rec, as.cfg.MinReplicas), as.max)
	// Scale down only to the highest recommendation of the window; up at most max(2x, +4).
	as.recs = append(as.recs, ScaleEvent{At: t, Desired: rec})
	for len(as.recs) > 0 && as.recs[0].At < t-hpaScaleDownWindowSec {
		as.recs = as.recs[1:]
	}
	want := rec
	if !as.cfg.ScaleDown {
		want = max(want, cur)
	}
	if want < cur {
		for _, r := range as.recs {
			want = max(want, r.Desired)
		}
		want = min(want, cur)
	}
	want = min(want, max(2*cur, cur+4))
	switch {
	case want > cur:
		for range want - cur {
			as.pending = append(as.pending, t+as.cfg.ProvisionSeconds)
		}
	case want < cur:
		// The newest pods go first: the provisioning ones, then the last ready ones.
		drop := cur - want
		k := min(drop, len(as.pending))
		as.pending = as.pending[:len(as.pending)-k]
		if drop -= k; drop > 0 {
			s.resize(s.members - drop)
		}
	}
	as.desired = want
}

// hpaReplicas is the HPA's recommendation for an AverageValue metric whose total is v, with
// target per replica and cur replicas: unchanged within the tolerance, else ceil(v / target).
func hpaReplicas(v, target float64, cur int) int {
	ratio := v / (target * float64(cur))
	if math.Abs(ratio-1) <= hpaTolerance {
		return cur
	}
	return int(math.Ceil(v / target))
}

// Ramp is a load step for autoscaling runs: Poisson arrivals at From replicas' worth for
// BeforeS seconds, then To replicas' worth for AfterS. Each request's 2,048-token prompt is one
// of Groups shared prefixes (half the prompt) and a suffix of its own; it asks for 128 output
// tokens.
type Ramp struct {
	PerReplicaRate  float64 // requests per second one replica serves (RampPerReplicaRate)
	From, To        int
	BeforeS, AfterS float64
	// RiseS > 0 raises the rate linearly from From's to To's over RiseS seconds from BeforeS
	// instead of in one step.
	RiseS  float64
	Groups int
	// PromptBlocks is the prompt's length in 512-token blocks (4: 2,048 tokens), half of it
	// the group's shared prefix.
	PromptBlocks int
	Seed         int64
}

// RampWorkloads are Ramp's request shapes, each with the rate one replica of DefaultConfig
// serves at about 80 % of its capacity (measured with the fleet model on two replicas: at the
// next step up, 8 and 2 req/s, TTFT p50 passes 14 s and 100 s): "chat" 2,048-token prompts,
// decode-bound at 32 sequences; "long" 16,384-token prompts, prefill-bound.
var RampWorkloads = map[string]Ramp{
	"chat": {PromptBlocks: 4, PerReplicaRate: 6},
	"long": {PromptBlocks: 32, PerReplicaRate: 1.4},
}

// worth is the load at time t in replicas' worth.
func (r Ramp) worth(t float64) float64 {
	switch {
	case t < r.BeforeS:
		return float64(r.From)
	case t < r.BeforeS+r.RiseS:
		return float64(r.From) + float64(r.To-r.From)*(t-r.BeforeS)/r.RiseS
	}
	return float64(r.To)
}

// RampTrace builds r's trace.
func RampTrace(r Ramp) *Trace {
	rng := rand.New(rand.NewPCG(uint64(r.Seed), 49))
	groups := max(r.Groups, 1)
	blocks := r.PromptBlocks
	if blocks < 2 {
		blocks = 4
	}
	var reqs []Request
	next := uint64(1 << 32)
	t := 0.0
	for {
		rate := r.PerReplicaRate * r.worth(t)
		t += rng.ExpFloat64() / rate
		if t >= r.BeforeS+r.AfterS {
			break
		}
		g := uint64(rng.IntN(groups))
		ids := make([]uint64, 0, blocks)
		for j := range blocks / 2 {
			ids = append(ids, g*uint64(blocks)+uint64(j)+1)
		}
		for len(ids) < blocks {
			ids = append(ids, next)
			next++
		}
		reqs = append(reqs, Request{TimestampMs: int64(t * 1000), InputLength: blocks * TraceBlockTokens, OutputLength: 128, HashIDs: ids})
	}
	return NewTrace(fmt.Sprintf("ramp-%dto%d", r.From, r.To), reqs)
}

// ScaleRow is one autoscaling configuration's figures on a ramp (kvbench autoscale).
type ScaleRow struct {
	Signal string `json:"signal"`
	// FirstUpS is from the load step to the first scale-up decision; ReadyS to the ready
	// replicas reaching the ramp's To (-1: never within the run).
	FirstUpS float64 `json:"first_scale_up_s"`
	ReadyS   float64 `json:"scaled_s"`
	Peak     int     `json:"peak_replicas"`
	// TTFTs of the requests arriving in the ScalingWindowS after the step.
	TTFTP50 float64 `json:"ttft_p50_s"`
	TTFTP90 float64 `json:"ttft_p90_s"`
	// AfterP90 is the TTFT p90 of the requests arriving after the scaling window, End the
	// replicas at the end of the run.
	AfterP90 float64 `json:"ttft_p90_after_s"`
	End      int     `json:"replicas_at_end"`
	// ReplicaSeconds over the whole trace, provisioning included.
	ReplicaSeconds float64 `json:"replica_seconds"`
}

// ScalingWindowS is the span after a ramp's rise whose requests count as "while scaling"
// (with the rise itself).
const ScalingWindowS = 300

// ScaleFigures reads a ScaleRow off an autoscaled run of r's trace.
func ScaleFigures(signal string, r Ramp, res *Result) ScaleRow {
	row := ScaleRow{Signal: signal, FirstUpS: -1, ReadyS: -1}
	sc := res.Scale
	prev := r.From
	for _, e := range sc.Events {
		row.Peak = max(row.Peak, e.Desired)
		if e.At >= r.BeforeS && e.Desired > prev && row.FirstUpS < 0 {
			row.FirstUpS = e.At - r.BeforeS
		}
		if e.At >= r.BeforeS && e.Ready >= r.To && row.ReadyS < 0 {
			row.ReadyS = e.At - r.BeforeS
		}
		prev = e.Desired
	}
	var ttft, after []float64
	for i, a := range sc.ArrivalS {
		switch {
		case a >= r.BeforeS+r.RiseS+ScalingWindowS:
			after = append(after, sc.TTFTS[i])
		case a >= r.BeforeS:
			ttft = append(ttft, sc.TTFTS[i])
		}
	}
	slices.Sort(ttft)
	slices.Sort(after)
	row.TTFTP50, row.TTFTP90 = percentile(ttft, 0.5), percentile(ttft, 0.9)
	row.AfterP90 = percentile(after, 0.9)
	if n := len(sc.Events); n > 0 {
		row.End = sc.Events[n-1].Desired
	}
	row.ReplicaSeconds = sc.ReplicaSeconds
	return row
}
