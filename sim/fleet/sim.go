package fleet

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/route"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/sim/policies"
)

// Config is the fleet and service model. Zero values take DefaultConfig's.
type Config struct {
	// Replicas is the fleet's size; for a trace whose requests say how many replicas the router
	// had (a capture's "replicas"), its largest size: request i is routed over the first
	// min(replicas, Replicas) of them, replicas join the router's candidates when the count grows
	// and leave when it shrinks (the last ones first).
	Replicas          int
	CapacityBlocks    int     // whole fleet; each replica holds CapacityBlocks/Replicas
	Speed             float64 // arrival times are timestamp / Speed
	PrefillTokensPerS float64 // for uncached prompt tokens only
	DecodeMsPerToken  float64 // per output token
	MaxNumSeqs        int     // running requests per replica; the rest queue
	// Engine is the replicas' service model: "step" (the default: vLLM v1's scheduler steps,
	// prefill chunks and decodes batched under MaxBatchedTokens, step.go) or "serial" (the
	// earlier model: one prompt prefilled at a time, decodes at a flat rate beside it).
	Engine           string
	MaxBatchedTokens int // step: token budget per scheduler step (vLLM's max_num_batched_tokens)
	Seed             int64
	WindowSeconds    float64 // imbalance windows
	// KV overrides the kv policy's defaults (for tuning experiments only; nil = the router's).
	KV *score.KVParams
	// Autoscale, when set, sizes the fleet as the operator's HPA would (autoscale.go), up to
	// Replicas; the trace's replica counts are ignored.
	Autoscale *Autoscale
}

// DefaultConfig is the benchmark's configuration (docs/benchmarks.md).
var DefaultConfig = Config{Replicas: 8, CapacityBlocks: 4800, Speed: 1, PrefillTokensPerS: 20000,
	DecodeMsPerToken: 20, MaxNumSeqs: 32, Seed: 1, WindowSeconds: 60, Engine: EngineStep, MaxBatchedTokens: 8192}

// The service models Config.Engine names.
const (
	EngineStep   = "step"
	EngineSerial = "serial"
)

func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig
	if c.Replicas == 0 {
		c.Replicas = d.Replicas
	}
	if c.CapacityBlocks == 0 {
		c.CapacityBlocks = d.CapacityBlocks
	}
	if c.Speed == 0 {
		c.Speed = d.Speed
	}
	if c.PrefillTokensPerS == 0 {
		c.PrefillTokensPerS = d.PrefillTokensPerS
	}
	if c.DecodeMsPerToken == 0 {
		c.DecodeMsPerToken = d.DecodeMsPerToken
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = d.MaxNumSeqs
	}
	if c.WindowSeconds == 0 {
		c.WindowSeconds = d.WindowSeconds
	}
	if c.Engine == "" {
		c.Engine = d.Engine
	}
	if c.MaxBatchedTokens == 0 {
		c.MaxBatchedTokens = d.MaxBatchedTokens
	}
	switch {
	case c.Replicas < 1:
		return c, fmt.Errorf("fleet: replicas must be >= 1, got %d", c.Replicas)
	case c.CapacityBlocks < c.Replicas:
		return c, fmt.Errorf("fleet: capacity-blocks %d is below one block per replica (%d replicas)", c.CapacityBlocks, c.Replicas)
	case c.Speed < 0 || c.PrefillTokensPerS < 0 || c.DecodeMsPerToken < 0 || c.MaxNumSeqs < 0 || c.WindowSeconds < 0 || c.MaxBatchedTokens < 0:
		return c, fmt.Errorf("fleet: speed, rates, max-num-seqs, max-batched-tokens and window must be positive")
	case c.Engine != EngineStep && c.Engine != EngineSerial:
		return c, fmt.Errorf("fleet: engine must be %q or %q, got %q", EngineStep, EngineSerial, c.Engine)
	}
	return c, nil
}

// Result is one policy's figures over a run, plus the series the report plots.
type Result struct {
	Policy        string  `json:"policy"`
	HitRateBlocks float64 `json:"hit_rate_blocks"`
	HitRateTokens float64 `json:"hit_rate_tokens"`
	Imbalance     float64 `json:"imbalance"`
	ImbalanceP95  float64 `json:"imbalance_p95"`
	TTFTP50       float64 `json:"ttft_p50_s"`
	TTFTP90       float64 `json:"ttft_p90_s"`
	// Scale is the autoscaler's record (Config.Autoscale runs only).
	Scale *ScaleResult `json:"scale,omitempty"`

	// TTFTs are every request's modelled TTFT in seconds, sorted.
	TTFTs []float64 `json:"-"`
	// WindowLoad[w][r] is the uncached prefill tokens replica r did for requests arriving in
	// window w; WindowRatio[w] is max/mean over replicas (windows with no work are left out).
	WindowLoad  [][]float64 `json:"-"`
	WindowRatio []float64   `json:"-"`
}

// replica is one modelled engine. The router's picture of it (prefill and decode tokens routed
// there, requests in flight, the predicted blocks of requests not started yet) is the live
// router's ledger (router/load), driven at virtual time; the rest is the engine's.
type replica struct {
	id    string
	ld    *load.Replica
	cache *blockCache
	// serial engine
	queue       []int // request indices, FIFO
	running     int
	prefillFree float64
	// step engine (step.go)
	waiting, seqs []*stepReq // vLLM's waiting queue and running list
	step          []*stepReq // the step in flight
	busy          bool       // a step is in flight
	kicked        bool       // an arrival woke it: a step starts after this instant's arrivals
	reserved      int        // blocks the running requests will pin as their prompts are computed
}

// queued is the requests routed here that the engine has not started.
func (r *replica) queued() int { return len(r.queue) + len(r.waiting) }

type evKind uint8

const (
	evPrefillDone evKind = iota
	evComplete
	evStepDone
)

type event struct {
	t    float64
	seq  int64
	kind evKind
	req  int
	rep  int
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type sim struct {
	cfg     Config
	tr      *Trace
	reps    []*replica
	events  eventHeap
	seq     int64
	perRep  int
	arrival []float64
	ttft    []float64
	// ledger is the live router's request ledger at virtual time (clock, in seconds); ids is
	// each request's entry.
	ledger  *load.Ledger
	clock   float64
	ids     []load.ID
	members int // replicas the router routes to now: reps[:members]
	// step engine: replicas woken at kickAt, their steps not started yet (step.go)
	kicks  []int
	kickAt float64
	// as sizes the fleet when Config.Autoscale is set (autoscale.go).
	as *autoscaler
	// accounting
	hitBlocks, totBlocks int
	hitTokens, totTokens int
	uncachedByRep        []float64
	window               map[int][]float64
}

// Run routes the trace through a fresh instance of the named policy and returns its figures.
func Run(tr *Trace, cfg Config, policy string) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	pol, err := policies.Registry().New(policy, score.Options{Seed: cfg.Seed, KV: cfg.KV})
	if err != nil {
		return nil, err
	}
	return run(tr, cfg, policy, pol)
}

// run is Run with the policy instance (a test's recording one), cfg already defaulted.
func run(tr *Trace, cfg Config, policy string, pol score.Policy) (*Result, error) {
	s := &sim{cfg: cfg, tr: tr, perRep: cfg.CapacityBlocks / cfg.Replicas,
		arrival: make([]float64, len(tr.Requests)), ids: make([]load.ID, len(tr.Requests)),
		ttft: make([]float64, len(tr.Requests)), uncachedByRep: make([]float64, cfg.Replicas),
		window: map[int][]float64{}}
	s.ledger = load.New(load.Options{Policy: pol, Now: s.now})
	if a := cfg.Autoscale; a != nil {
		var err error
		if s.as, err = newAutoscaler(*a, cfg.Replicas); err != nil {
			return nil, err
		}
	}
	for i := 0; i < cfg.Replicas; i++ {
		s.reps = append(s.reps, &replica{id: "r" + strconv.Itoa(i), cache: newBlockCache(s.perRep)})
	}
	if s.as != nil {
		s.resize(s.as.cfg.MinReplicas)
	}
	// Candidates are built as kvrouter builds them (router/route over the ledger), from the
	// modelled caches in place of the exact index.
	var d route.Decision
	views := make([]route.Replica, cfg.Replicas)
	for r, rep := range s.reps {
		views[r] = route.Replica{Name: rep.id, ID: index.ReplicaID(r), Ready: true, Healthy: true}
	}
	view := &modelView{s: s}
	var keys []blockkey.Key
	for i := range tr.Requests {
		q := &tr.Requests[i]
		now := float64(q.TimestampMs) / 1000 / cfg.Speed
		s.arrival[i] = now
		if s.as != nil {
			s.autoscaleUntil(now)
		}
		s.flushKicks(now)
		s.advance(now)
		s.clock = now
		n := cfg.Replicas
		switch {
		case s.as != nil:
			n = s.members
		case q.Replicas > 0:
			n = min(q.Replicas, cfg.Replicas)
		}
		s.resize(n)
		// A fresh slice per request: the ledger keeps the keys of each request it holds.
		keys = make([]blockkey.Key, 0, len(q.HashIDs))
		for _, h := range q.HashIDs {
			keys = append(keys, blockkey.Key(h))
		}
		for r, rep := range s.reps[:n] {
			views[r].Queue = rep.queued()
			views[r].KVUtil = float64(rep.cache.pinned) / float64(s.perRep)
		}
		view.q, view.n = q, n
		in := route.Input{Keys: keys, Length: q.InputLength, BlockSize: TraceBlockTokens,
			Session: strconv.FormatUint(q.Session, 10), NowNs: int64(now * 1e9)}
		if err := d.Decide(in, views[:n], view, modelLedger{view}); err != nil {
			return nil, fmt.Errorf("fleet: request %d: %w", i, err)
		}
		// One goroutine: the ledger's generation has not moved since d read it, so its re-read
		// under the lock reads nothing and the model's inputs stand.
		id, rc, err := s.ledger.Decide(&d, views[:n], func(r int) load.Routing {
			if r < 0 || r >= n {
				return load.Routing{Replica: &load.Replica{}}
			}
			return load.Routing{Replica: s.reps[r].ld, Keys: keys, Uncached: d.Uncached(r), Cached: d.Cached[r],
				Held: q.InputLength + q.OutputLength}
		})
		if err != nil {
			return nil, fmt.Errorf("fleet: %s on request %d: %w", policy, i, err)
		}
		if rc.Chosen < 0 || rc.Chosen >= n {
			return nil, fmt.Errorf("fleet: %s picked %d of %d replicas", policy, rc.Chosen, n)
		}
		s.ids[i] = id
		s.route(i, rc.Chosen)
	}
	s.flushKicks(math.Inf(1))
	s.advance(math.Inf(1))
	res := s.result(policy)
	if s.as != nil {
		if len(s.arrival) > 0 {
			s.as.account(s.arrival[len(s.arrival)-1])
		}
		res.Scale = &s.as.out
		res.Scale.ArrivalS, res.Scale.TTFTS = s.arrival, s.ttft
	}
	return res, nil
}

// modelView is the decision's view of the model (route.IndexView and route.LedgerView) for
// request q over the first n replicas: the modelled caches stand in for the exact index (every
// block on GPU), the ledger for the rest. A replica's predicted blocks are the ledger's (routed,
// not started) counted from its cached prefix on, then what it has cached after them.
type modelView struct {
	s     *sim
	q     *Request
	n     int
	exact []uint32
}

func (v *modelView) Slots() int { return v.s.cfg.Replicas }

func (v *modelView) Match(_ []blockkey.Key, out []index.Match) []index.Match {
	out = slices.Grow(out[:0], v.n)[:v.n]
	v.exact = v.exact[:0]
	for r, rep := range v.s.reps[:v.n] {
		e := uint32(rep.cache.prefix(v.q.HashIDs))
		out[r] = index.Match{Blocks: e, GPU: e}
		v.exact = append(v.exact, e)
	}
	return out
}

// modelLedger is the LedgerView half of modelView.
type modelLedger struct{ v *modelView }

func (m modelLedger) Load(id index.ReplicaID) route.ReplicaLoad { return m.v.s.ledger.Load(id) }

func (m modelLedger) Window(id string, nowNs int64) score.Window {
	return m.v.s.ledger.Window(id, nowNs)
}

func (m modelLedger) Calibration(id string) score.Calibration { return m.v.s.ledger.Calibration(id) }

func (m modelLedger) Generation() uint64 { return m.v.s.ledger.Generation() }

// Match is the ledger's side-index match, the predicted blocks extended over the cache.
func (m modelLedger) Match(keys []blockkey.Key, slots int, _ bool, pred, appr []uint32) ([]uint32, []uint32) {
	v := m.v
	pred, _ = v.s.ledger.Match(keys, slots, false, pred, nil)
	ids := v.q.HashIDs
	for r, rep := range v.s.reps[:min(v.n, len(pred), len(v.exact))] {
		p := max(int(v.exact[r]), int(pred[r]))
		for p < len(ids) && rep.cache.contains(ids[p]) {
			p++
		}
		pred[r] = uint32(p)
	}
	return pred, appr
}

// resize makes the first n replicas the router's candidates. A replica joining starts in the
// ledger as kvrouter's does when an engine becomes routable (its windows and the policy's state
// from nothing); one that was in the fleet before restarts with an empty cache if nothing runs
// there (a new pod). A replica leaving is removed from the ledger; what it runs finishes.
func (s *sim) resize(n int) {
	for ; s.members < n; s.members++ {
		rep := s.reps[s.members]
		if rep.ld != nil && rep.queued()+rep.running+len(rep.seqs) == 0 && !rep.busy {
			rep.cache = newBlockCache(s.perRep)
		}
		rep.ld = s.ledger.NewReplica(index.ReplicaID(s.members), rep.id)
		// The side indexes evict the replica's guesses as its modelled cache evicts blocks.
		s.ledger.SetCapacity(rep.ld, s.perRep)
	}
	for ; s.members > n; s.members-- {
		s.ledger.Remove(s.reps[s.members-1].ld)
	}
}

// now is the ledger's clock: the virtual time in seconds from the Unix epoch.
func (s *sim) now() time.Time { return time.Unix(0, 0).Add(time.Duration(s.clock * 1e9)) }

func (s *sim) push(e event) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.events, e)
}

// advance processes every event up to time t.
func (s *sim) advance(t float64) {
	for len(s.events) > 0 && s.events[0].t <= t {
		e := heap.Pop(&s.events).(event)
		s.clock = e.t
		rep := s.reps[e.rep]
		switch e.kind {
		case evStepDone:
			s.stepDone(e.rep, e.t)
		case evPrefillDone:
			if err := s.ledger.FirstToken(s.ids[e.req]); err != nil {
				panic(fmt.Sprintf("fleet: request %d: %v", e.req, err)) // every request is routed once
			}
		case evComplete:
			rep.running--
			s.finished(e.rep, e.req)
			s.startQueued(e.rep, e.t)
		}
	}
}

// finished ends request i on replica r: its load leaves the ledger and its blocks are unpinned.
func (s *sim) finished(r, i int) {
	if _, err := s.ledger.Done(s.ids[i], nil); err != nil {
		panic(fmt.Sprintf("fleet: request %d: %v", i, err))
	}
	// Free the tail first so eviction keeps the shared head longest (as vLLM does).
	ids := s.tr.Requests[i].HashIDs
	for j := len(ids) - 1; j >= 0; j-- {
		s.reps[r].cache.unpin(ids[j])
	}
}

// route queues request i on replica r (the ledger has recorded it).
func (s *sim) route(i, r int) {
	if s.cfg.Engine == EngineStep {
		s.stepArrive(i, r, s.arrival[i])
		return
	}
	rep := s.reps[r]
	rep.queue = append(rep.queue, i)
	s.startQueued(r, s.arrival[i])
}

// startQueued starts queued requests in order while a sequence slot and KV room are free. A
// request always starts on an idle replica, however large.
func (s *sim) startQueued(r int, now float64) {
	rep := s.reps[r]
	for len(rep.queue) > 0 && rep.running < s.cfg.MaxNumSeqs {
		i := rep.queue[0]
		q := &s.tr.Requests[i]
		if rep.running > 0 && rep.cache.pinned+rep.cache.unpinnedNeeded(q.HashIDs) > s.perRep {
			return
		}
		rep.queue = rep.queue[1:]
		s.start(i, r, now)
	}
}

func (s *sim) start(i, r int, now float64) {
	q := &s.tr.Requests[i]
	rep := s.reps[r]
	hits := rep.cache.prefix(q.HashIDs)
	for _, h := range q.HashIDs {
		rep.cache.pin(h)
	}
	rep.running++
	unc := s.admitted(i, r, hits)
	// The last prompt token is always computed, even on a full hit.
	work := float64(max(unc, 1)) / s.cfg.PrefillTokensPerS
	begin := math.Max(now, rep.prefillFree)
	done := begin + work
	rep.prefillFree = done
	s.ttft[i] = done - s.arrival[i]
	s.push(event{t: done, kind: evPrefillDone, req: i, rep: r})
	s.push(event{t: done + float64(q.OutputLength)*s.cfg.DecodeMsPerToken/1000, kind: evComplete, req: i, rep: r})
}

// admitted counts request i started on replica r with hits leading blocks cached, and returns
// its uncached prompt tokens. Its blocks are the engine's now: out of the predicted side index.
func (s *sim) admitted(i, r, hits int) int {
	q := &s.tr.Requests[i]
	s.ledger.Unpredict(s.ids[i])
	unc := uncachedTokens(q, hits)
	s.hitBlocks += hits
	s.totBlocks += len(q.HashIDs)
	s.hitTokens += q.InputLength - unc
	s.totTokens += q.InputLength
	s.uncachedByRep[r] += float64(unc)
	w := int(s.arrival[i] / s.cfg.WindowSeconds)
	if s.window[w] == nil {
		s.window[w] = make([]float64, s.cfg.Replicas)
	}
	s.window[w][r] += float64(unc)
	return unc
}

func (s *sim) result(policy string) *Result {
	res := &Result{Policy: policy,
		HitRateBlocks: ratio(s.hitBlocks, s.totBlocks), HitRateTokens: ratio(s.hitTokens, s.totTokens),
		Imbalance: maxOverMean(s.uncachedByRep)}
	res.TTFTs = append([]float64(nil), s.ttft...)
	sort.Float64s(res.TTFTs)
	res.TTFTP50 = percentile(res.TTFTs, 0.50)
	res.TTFTP90 = percentile(res.TTFTs, 0.90)
	ws := make([]int, 0, len(s.window))
	for w := range s.window {
		ws = append(ws, w)
	}
	sort.Ints(ws)
	if len(ws) > 0 {
		res.WindowLoad = make([][]float64, ws[len(ws)-1]+1)
	}
	// Only windows wholly inside the trace's span count: a trailing window of a few seconds
	// holds a handful of requests and says nothing about balance.
	last := s.arrival[len(s.arrival)-1]
	for _, w := range ws {
		res.WindowLoad[w] = s.window[w]
		if float64(w+1)*s.cfg.WindowSeconds > last && len(ws) > 1 {
			continue
		}
		if r := maxOverMean(s.window[w]); r > 0 {
			res.WindowRatio = append(res.WindowRatio, r)
		}
	}
	sorted := append([]float64(nil), res.WindowRatio...)
	sort.Float64s(sorted)
	res.ImbalanceP95 = percentile(sorted, 0.95)
	return res
}

// maxOverMean is max/mean of xs; 0 when there is no work at all.
func maxOverMean(xs []float64) float64 {
	sum, mx := 0.0, 0.0
	for _, x := range xs {
		sum += x
		mx = math.Max(mx, x)
	}
	if sum == 0 {
		return 0
	}
	return mx / (sum / float64(len(xs)))
}

// percentile is the nearest-rank percentile of sorted xs.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p*float64(len(sorted)))) - 1
	k = min(max(k, 0), len(sorted)-1)
	return sorted[k]
}
