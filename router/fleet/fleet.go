package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/degraded"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/engine"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/metrics"
	"github.com/kvroute/kvroute/router/peersnap"
	"github.com/kvroute/kvroute/router/proxy"
)

// The fleet's calls to an engine that an engine may refuse with 401/403 (Options.AuthFailure).
const (
	CallModels = "models"
	CallHealth = "health"
)

// Options configure a Fleet. Config, Client, Index, Ledger and Metrics are required.
type Options struct {
	Config config.Config
	// Client makes every call to an engine (the router's, with its credentials).
	Client *http.Client
	// Sub receives the engines' event streams (nil: events off); Bound: it identifies engines
	// by topic on one bound socket (--events-bind).
	Sub   *kvevents.Subscriber
	Bound bool
	// Peers is parity across replicas (nil without events).
	Peers   *kvevents.PeerTable
	Index   *index.Index
	Ledger  *load.Ledger
	Metrics *metrics.Metrics
	// Model is the served model name ("" reads each engine's /v1/models); TopicHostOnly: topics
	// carry the host only (Kubernetes pods).
	Model         string
	TopicHostOnly bool
	// ProbeInterval and ProbeTimeout of the active /health probes; HealthInterval between
	// samples for the degraded reasons; ScrapeInterval between reads of every /metrics.
	ProbeInterval, ProbeTimeout, HealthInterval, ScrapeInterval time.Duration
	Now                                                         func() time.Time
	Logger                                                      *slog.Logger
	// AuthFailure is told of an engine refusing a call with 401/403 (CallModels, CallHealth).
	AuthFailure func(call, engine string, err error)
	// LogLimited logs a recurring fallback at most once a minute per key.
	LogLimited func(key, msg string, args ...any)
	// SeedStream, when set, hands a new stream a peer router's snapshot of it (nil: replay the
	// engine's ring from seq 0); SeedApprox loads a new replica without events from the
	// snapshot's approximate index. Several router replicas (router/app's peers) set them.
	SeedStream func(engine string, rank int, incarnation string) *peersnap.Stream
	SeedApprox func(rep *Replica)
}

// Fleet owns the router's engines: membership from discovery, per-engine health and probes,
// per-replica degraded reasons (decided by router/degraded), the engines' /metrics figures, and
// one immutable View per replica that every decision reads with one atomic load.
type Fleet struct {
	o       Options
	log     *slog.Logger
	scraper *Reader
	tracker *degraded.Tracker

	// syncMu serialises membership changes (Apply, relearn); mu guards the table's swap.
	syncMu  sync.Mutex
	mu      sync.RWMutex
	engines map[string]*Engine
	reps    []*Replica // every replica, engine then rank order
	// kind is the fleet's engine kind; refused: engines of another kind, by name, with why.
	kind    engine.Kind
	refused map[string]string

	// healthMu serialises HealthTick.
	healthMu sync.Mutex
}

// Kind is the fleet's engine kind (config engineKind, vLLM by default).
func (f *Fleet) Kind() engine.Kind { return f.kind }

// Refused returns the engines discovery listed but the fleet refused, by name, with why.
func (f *Fleet) Refused() map[string]string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return maps.Clone(f.refused)
}

// refuseMixed drops the engines of another kind than the fleet's (discovery.MixedKinds says why
// a fleet runs one kind), logging each once and keeping them for Refused and the debug page.
func (f *Fleet) refuseMixed(snap []discovery.Engine) []discovery.Engine {
	out := snap[:0:0]
	refused := map[string]string{}
	for _, d := range snap {
		err := discovery.MixedKinds(f.kind, []discovery.Engine{d})
		if err == nil {
			out = append(out, d)
			continue
		}
		refused[d.Name] = err.Error()
		f.mu.RLock()
		_, told := f.refused[d.Name]
		f.mu.RUnlock()
		if !told {
			f.log.Error("engine refused", "engine", d.Name, "err", err)
		}
	}
	f.mu.Lock()
	f.refused = refused
	f.mu.Unlock()
	f.o.Metrics.EnginesRefused.Set(float64(len(refused)))
	return out
}

// Engine is one discovered engine and its replicas (one per DP rank).
type Engine struct {
	// dp is the latest discovery entry.
	dp    atomic.Pointer[discovery.Engine]
	Name  string
	Model string // served base model, for the topic and LoRA detection
	// Adapters are the served LoRA adapter names.
	Adapters map[string]bool
	// modelsRead: /v1/models answered when the engine was added. When it did not (the engine
	// was down, or refused the router's key), Model and Adapters are guesses, and with no
	// model the expected topic (<prefix>@<host>@<model>) matches nothing the engine sends:
	// the first successful probe reads the models again and rebuilds the engine (relearn).
	modelsRead bool
	Health     *proxy.Health
	Reps       []*Replica
	// probeDown: the last /health probe failed; the streams were told (Subscriber.Down).
	probeDown atomic.Bool
	// gone is set when the engine left the fleet: requests still in flight on it stop
	// touching its (deleted) metric series.
	gone atomic.Bool
}

// Discovery is the engine's latest discovery entry.
func (e *Engine) Discovery() *discovery.Engine { return e.dp.Load() }

// Gone reports whether the engine left the fleet.
func (e *Engine) Gone() bool { return e.gone.Load() }

// Replica is one (engine, DP rank): one index replica, maybe one event stream, its View, and
// the counters the request path adds to.
type Replica struct {
	Eng  *Engine
	Rank int
	ID   index.ReplicaID
	Name string // "engine/rank", the policy's stable candidate ID
	// Stream: an event stream feeds it.
	Stream bool
	// Load is the ledger's counters for it.
	Load *load.Replica
	// C is what the request path counts there (the degraded reasons read part of it).
	C Counters

	view  atomic.Pointer[View]
	h     repHealth  // health loop state (health.go)
	trail stateTrail // states the stream passed through since the last health sample
}

// Counters are a replica's request-path counters.
type Counters struct {
	// Routed and MultimodalRouted: requests routed there; TokenizeFailures: renders the engine
	// failed (rank 0 carries them).
	Routed, MultimodalRouted, TokenizeFailures atomic.Uint64
	// ExactPredicted, ExactActual: cached tokens predicted and reported for exact-mode decisions.
	ExactPredicted, ExactActual atomic.Uint64
	// Retries: attempts given up there before the first token.
	Retries atomic.Uint64
	// Accuracy: answers, with and without usage, and the prompt, predicted and actual cached
	// tokens of those with usage.
	Responses, WithUsage, NoUsage                       atomic.Uint64
	PromptTokens, PredictedTokens, ActualTokens, AbsErr atomic.Uint64

	tokErr atomic.Pointer[string]
}

// View is what the fleet knows of a replica at one moment. It is never changed once published:
// every change builds a new one and swaps it in, so a decision reads all of it with one atomic
// load and no lock.
type View struct {
	// Ready, WarmupUntil and DiscoveryBlockSize are discovery's.
	Ready              bool
	WarmupUntil        time.Time
	DiscoveryBlockSize int
	// StreamState is the event stream's state (kvevents pushes it); meaningless without Stream.
	StreamState kvevents.StreamState
	// LearnedBlockSize is the block size the stream learned from a validated event (0: none).
	LearnedBlockSize int
	// MetricsBlockSize is block_size from the engine's vllm:cache_config_info, kept only for a
	// replica without an event stream, where nothing else can teach it (0: none).
	MetricsBlockSize int
	// Demoted: evidence says its keys are wrong, so it is scored approximately.
	Demoted bool
	// Degraded is every reason in force (nil when none or not evaluated yet).
	Degraded []degraded.Status
	// Figures are the rank's figures from the engine's /metrics; HaveFigures: a page was read.
	Figures     Rank
	HaveFigures bool
	// Exact: a whole event stream feeds it and it is not demoted, so its exact index alone is
	// trusted; otherwise the approximate index is read too.
	Exact bool
}

// View is the replica's current view.
func (r *Replica) View() *View { return r.view.Load() }

// update publishes a new view: a copy of the current one changed by f.
func (r *Replica) update(f func(v *View)) {
	for {
		old := r.view.Load()
		nv := *old
		f(&nv)
		nv.Exact = r.Stream && nv.StreamState == kvevents.Exact && !nv.Demoted
		if r.view.CompareAndSwap(old, &nv) {
			return
		}
	}
}

// NoteTokenizeFailure counts an engine-side render failure (rank 0 carries them).
func (r *Replica) NoteTokenizeFailure(msg string) {
	r.C.TokenizeFailures.Add(1)
	if len(msg) > 200 {
		msg = msg[:200]
	}
	r.C.tokErr.Store(&msg)
}

// New returns a fleet with no engines; Apply fills it, Run keeps it current.
func New(o Options) *Fleet {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = 2 * time.Second
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = time.Second
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = DefaultHealthInterval
	}
	if o.AuthFailure == nil {
		o.AuthFailure = func(string, string, error) {}
	}
	if o.LogLimited == nil {
		o.LogLimited = func(_, msg string, args ...any) { o.Logger.Warn(msg, args...) }
	}
	kind, _ := engine.Parse(o.Config.EngineKind) // validated with the config; vLLM when unset
	f := &Fleet{o: o, log: o.Logger, tracker: degraded.NewTracker(o.HealthInterval), engines: map[string]*Engine{}, kind: kind}
	f.scraper = NewReader(ReaderOptions{Client: o.Client, Kind: kind, Interval: o.ScrapeInterval, Timeout: 2 * time.Second,
		OnSample: f.engineSample, OnError: f.engineScrapeFailed})
	return f
}

// Run probes, samples health and reads /metrics until ctx ends.
func (f *Fleet) Run(ctx context.Context) {
	go f.probeLoop(ctx)
	go f.healthLoop(ctx)
	f.scraper.Run(ctx)
}

// Snapshot is every replica (engine then rank order) and the engines by name; neither is
// changed after it is returned.
func (f *Fleet) Snapshot() ([]*Replica, map[string]*Engine) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.reps, f.engines
}

// Replicas is every replica, engine then rank order.
func (f *Fleet) Replicas() []*Replica { r, _ := f.Snapshot(); return r }

func (f *Fleet) swap(engines map[string]*Engine, reps []*Replica) {
	f.mu.Lock()
	f.engines, f.reps = engines, reps
	f.mu.Unlock()
	f.scraper.SetTargets(scrapeTargets(engines))
}

// Apply reconciles the fleet with a discovery snapshot: new engines get their replicas and
// streams, removed ones lose everything about them (Remove), a changed incarnation is a restart
// of every stream.
func (f *Fleet) Apply(ctx context.Context, snap []discovery.Engine) {
	f.syncMu.Lock()
	defer f.syncMu.Unlock()
	_, old := f.Snapshot()
	snap = f.refuseMixed(snap)
	info := f.prefetchModels(ctx, snap, old)
	next := map[string]*Engine{}
	for _, d := range snap {
		e, ok := old[d.Name]
		switch {
		case ok && sameWiring(*e.dp.Load(), d):
			if prev := e.dp.Load().Incarnation; prev != d.Incarnation && prev != "" {
				for _, r := range e.Reps {
					if r.Stream {
						if err := f.o.Sub.Restarted(d.Name, r.Rank); err != nil {
							f.log.Warn("restart not applied", "engine", d.Name, "rank", r.Rank, "err", err)
						}
					}
				}
				f.log.Info("engine restarted", "engine", d.Name, "incarnation", d.Incarnation)
			}
			d := d
			e.dp.Store(&d)
			for _, r := range e.Reps {
				r.update(func(v *View) { v.Ready, v.WarmupUntil, v.DiscoveryBlockSize = d.Ready, d.WarmupUntil, d.BlockSize })
			}
			next[d.Name] = e
		default:
			if ok {
				f.remove(e)
			}
			ne, err := f.addEngine(d, info[d.Name])
			if err != nil {
				f.log.Error("engine not added", "engine", d.Name, "err", err)
				continue
			}
			next[d.Name] = ne
			f.log.Info("engine added", "engine", d.Name, "url", d.URL, "ranks", d.Ranks(), "streams", countStreams(ne))
		}
	}
	for name, e := range old {
		if _, ok := next[name]; !ok {
			f.remove(e)
			f.log.Info("engine removed", "engine", name)
		}
	}
	var reps []*Replica
	for _, d := range snap {
		if e, ok := next[d.Name]; ok {
			reps = append(reps, e.Reps...)
		}
	}
	f.swap(next, reps)
	f.probeNew(ctx, next)
}

func countStreams(e *Engine) int {
	n := 0
	for _, r := range e.Reps {
		if r.Stream {
			n++
		}
	}
	return n
}

func sameWiring(a, b discovery.Engine) bool {
	return a.URL == b.URL && a.Topic == b.Topic && fmt.Sprint(a.Events) == fmt.Sprint(b.Events) && fmt.Sprint(a.Replay) == fmt.Sprint(b.Replay) &&
		fmt.Sprint(a.Snapshot) == fmt.Sprint(b.Snapshot) && a.Ranks() == b.Ranks()
}

// modelInfo is what an engine's /v1/models said, and its num_gpu_blocks from /metrics (0:
// not known).
type modelInfo struct {
	base      string
	adapters  []string
	err       error
	gpuBlocks int
}

// prefetchModels reads /v1/models of every engine that will be added, concurrently, so a burst
// of new pods (or an unreachable one) delays the snapshot by one timeout, not one per engine.
func (f *Fleet) prefetchModels(ctx context.Context, snap []discovery.Engine, old map[string]*Engine) map[string]modelInfo {
	out := map[string]modelInfo{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, d := range snap {
		if e, ok := old[d.Name]; ok && sameWiring(*e.dp.Load(), d) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			base, adapters, err := f.models(ctx, d.URL)
			blocks := f.GPUBlocks(ctx, d.URL)
			mu.Lock()
			out[d.Name] = modelInfo{base, adapters, err, blocks}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func (f *Fleet) addEngine(d discovery.Engine, mi modelInfo) (*Engine, error) {
	e := &Engine{Name: d.Name, Health: &proxy.Health{}, Adapters: map[string]bool{}}
	e.dp.Store(&d)
	e.Model = f.o.Model
	if mi.err == nil {
		e.modelsRead = true
		if e.Model == "" {
			e.Model = mi.base
		}
		for _, a := range mi.adapters {
			e.Adapters[a] = true
		}
	} else {
		if isAuthErr(mi.err) {
			f.o.AuthFailure(CallModels, d.Name, mi.err)
		}
		f.log.Warn("engine models not read; topic and LoRA detection use --model until a probe succeeds and they are read again",
			"engine", d.Name, "err", mi.err)
	}
	if !f.o.Bound && len(d.Events) == 0 && (len(d.Replay) > 0 || len(d.Snapshot) > 0) {
		f.log.Warn("engine lists replay or snapshot endpoints without event endpoints, which only bound mode (--events-bind) uses; scored approximately",
			"engine", d.Name)
	}
	ev := f.o.Config.Events
	for r := 0; r < d.Ranks(); r++ {
		rep := &Replica{Eng: e, Rank: r, Name: fmt.Sprintf("%s/%d", d.Name, r)}
		rep.view.Store(&View{Ready: d.Ready, WarmupUntil: d.WarmupUntil, DiscoveryBlockSize: d.BlockSize,
			StreamState: kvevents.Approximate})
		ep := ""
		if r < len(d.Events) {
			ep = d.Events[r]
		}
		if ev.Enabled && f.o.Sub != nil && (ep != "" || f.o.Bound) {
			sc := kvevents.StreamConfig{Engine: d.Name, Rank: r, Endpoint: ep, Topic: f.topic(d, e.Model), Kind: f.kind,
				OnChange: func(st kvevents.StreamState, bs int) {
					rep.update(func(v *View) { v.StreamState, v.LearnedBlockSize = st, bs })
					rep.trail.push(st)
				}}
			if mi.gpuBlocks > 0 {
				sc.MaxBlocks = kvevents.MaxBlocksFor(mi.gpuBlocks)
			}
			if ev.Replay && r < len(d.Replay) {
				sc.ReplayEndpoint = d.Replay[r]
			}
			if r < len(d.Snapshot) {
				sc.SnapshotEndpoint = d.Snapshot[r]
			}
			if f.o.Bound {
				sc.Endpoint = ""
			}
			if f.o.SeedStream != nil {
				sc.Seed = f.o.SeedStream(d.Name, r, d.Incarnation)
			}
			// Stream is set before Add: the stream's first OnChange may come before Add returns.
			rep.Stream = true
			if err := f.o.Sub.Add(sc); err != nil {
				rep.Stream = false
				f.log.Warn("event stream not added; replica scored approximately", "engine", d.Name, "rank", r, "err", err)
			}
		}
		if !rep.Stream {
			if _, err := f.o.Index.AddReplica(d.Name, r); err != nil {
				f.remove(e)
				return nil, err
			}
		}
		id, ok := f.o.Index.Replica(d.Name, r)
		if !ok {
			f.remove(e)
			return nil, fmt.Errorf("replica %s missing from the index", rep.Name)
		}
		rep.ID = id
		rep.Load = f.o.Ledger.NewReplica(id, rep.Name)
		// The side indexes evict a replica's guesses as its engine evicts blocks, before a peer's
		// snapshot is loaded into them: num_gpu_blocks less the null block vLLM reserves
		// (vllm/v1/core/block_pool.py); 0 when not shown, the default.
		f.o.Ledger.SetCapacity(rep.Load, max(mi.gpuBlocks-1, 0))
		if !rep.Stream && f.o.SeedApprox != nil {
			f.o.SeedApprox(rep)
		}
		rep.update(func(*View) {}) // Exact from the state the stream may already have pushed
		e.Reps = append(e.Reps, rep)
	}
	return e, nil
}

// remove takes everything about an engine out of the router, in one place: its streams or index
// slots, its side-index entries and the policy's per-replica state (load.Ledger.Remove), parity,
// and its metric series. Requests still in flight settle on the objects they hold.
func (f *Fleet) remove(e *Engine) {
	e.gone.Store(true)
	for _, r := range e.Reps {
		var err error
		if r.Stream {
			err = f.o.Sub.Remove(e.Name, r.Rank)
		} else {
			err = f.o.Index.RemoveReplica(r.ID)
		}
		if err != nil {
			// Its index entries stay behind; they name a replica no decision scores.
			f.log.Error("replica's index entries not removed", "replica", r.Name, "err", err)
		}
		if r.Load != nil {
			f.o.Ledger.Remove(r.Load)
		}
		if f.o.Peers != nil {
			f.o.Peers.Forget(r.ID)
		}
	}
	f.o.Metrics.ForgetEngine(e.Name)
}

// topic is the engine's KV-event topic: <prefix>@<host>@<model>. Pods publish with their IP
// only (the operator's $(POD_IP), Options.TopicHostOnly); static engines, often several on one
// host, with host:port of their HTTP address (vllm-sim's default, llm-d's convention). A pod
// whose discovery names its topic (TensorRT-LLM's, one config for every pod) publishes that.
func (f *Fleet) topic(d discovery.Engine, model string) string {
	if d.Topic != "" {
		return d.Topic
	}
	u, err := url.Parse(d.URL)
	host := d.URL
	if err == nil {
		host = u.Host
		if f.o.TopicHostOnly {
			host = u.Hostname()
		}
	}
	return f.o.Config.Events.TopicPrefix + "@" + host + "@" + model
}

// models reads GET /v1/models: the base model and the LoRA adapters (entries with a parent).
func (f *Fleet) models(ctx context.Context, base string) (string, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", nil, err
	}
	resp, err := f.o.Client.Do(req)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", nil, &proxy.StatusError{Path: "/v1/models", Status: resp.StatusCode}
	}
	var ml struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ml); err != nil {
		return "", nil, err
	}
	var model string
	var adapters []string
	for _, m := range ml.Data {
		if m.Parent == nil {
			if model == "" {
				model = m.ID
			}
		} else {
			adapters = append(adapters, m.ID)
		}
	}
	return model, adapters, nil
}

// probeNew probes engines not probed yet at once, so a dead static engine is known before the
// first request.
func (f *Fleet) probeNew(ctx context.Context, es map[string]*Engine) {
	for _, e := range es {
		if !e.Health.State(f.o.Now()).Probed {
			f.probe(ctx, e)
		}
	}
}

// probe asks the engine's /health and records the answer; it reports whether it was up. A
// success does not end a passive failure's backoff by itself: Health.ProbedAt lets the engine
// back only for a probe that started after the failure.
func (f *Fleet) probe(ctx context.Context, e *Engine) bool {
	start := f.o.Now()
	err := proxy.Probe(ctx, f.o.Client, e.dp.Load().URL, f.o.ProbeTimeout)
	was := e.Health.Healthy(f.o.Now())
	e.Health.ProbedAt(start, err)
	if ctx.Err() == nil && e.probeDown.CompareAndSwap(err == nil, err != nil) {
		f.tellStreams(e, err != nil)
	}
	if err == nil {
		return true
	}
	if isAuthErr(err) {
		// vLLM leaves /health open; an engine (or a proxy in front of it) that guards it is
		// refusing the router's credentials all the same.
		f.o.AuthFailure(CallHealth, e.Name, err)
	}
	if was {
		f.log.Warn("engine unhealthy", "engine", e.Name, "err", err)
	}
	return false
}

func isAuthErr(err error) bool {
	var se *proxy.StatusError
	return errors.As(err, &se) && proxy.IsAuthStatus(se.Status)
}

// relearn reads the models of an engine that did not answer /v1/models when it was added
// (typically an engine down when the router started) and, once it does, rebuilds the engine
// with the real model and adapters: its streams are added again under the right topic (in
// bound mode the topic is the only way its events are told apart, so until then they are
// counted as unroutable) and replayed from the engine's ring. The replicas are new objects:
// load this router had in flight to the old ones is not carried over (they were just
// appearing, so that is little, and in-flight requests settle on the objects they hold).
func (f *Fleet) relearn(ctx context.Context, e *Engine) {
	base, adapters, err := f.models(ctx, e.dp.Load().URL)
	if err != nil {
		if isAuthErr(err) {
			f.o.AuthFailure(CallModels, e.Name, err)
		}
		f.log.Debug("engine models still not read", "engine", e.Name, "err", err)
		return
	}
	f.syncMu.Lock()
	defer f.syncMu.Unlock()
	reps, engines := f.Snapshot()
	if engines[e.Name] != e {
		return // removed or replaced meanwhile
	}
	d := *e.dp.Load()
	f.remove(e)
	ne, err := f.addEngine(d, modelInfo{base: base, adapters: adapters})
	next := make(map[string]*Engine, len(engines))
	for name, other := range engines {
		if name != e.Name {
			next[name] = other
		}
	}
	var nreps []*Replica
	for _, r := range reps {
		switch {
		case r.Eng != e:
			nreps = append(nreps, r)
		case r.Rank == 0 && ne != nil:
			nreps = append(nreps, ne.Reps...)
		}
	}
	if err != nil {
		f.log.Error("engine not re-added after reading its models", "engine", e.Name, "err", err)
	} else {
		ne.Health = e.Health // keep what probes and forwards learned
		next[e.Name] = ne
		f.log.Info("engine models read; streams re-added", "engine", e.Name, "model", ne.Model, "adapters", len(adapters),
			"streams", countStreams(ne))
	}
	f.swap(next, nreps)
}

// tellStreams passes a probe's change of mind to the engine's streams: down, the old process's
// blocks stop counting as exact at once; up, the stream checks whether the engine is still the
// process it was (see kvevents.Subscriber.Up).
func (f *Fleet) tellStreams(e *Engine, down bool) {
	for _, r := range e.Reps {
		if !r.Stream {
			continue
		}
		var err error
		if down {
			err = f.o.Sub.Down(e.Name, r.Rank)
		} else {
			err = f.o.Sub.Up(e.Name, r.Rank)
		}
		if err != nil {
			f.log.Debug("stream not told of the engine's health", "engine", e.Name, "rank", r.Rank, "down", down, "err", err)
		}
	}
}

// GPUBlocks reads num_gpu_blocks from the engine's vllm:cache_config_info (GET /metrics); 0
// when it cannot. It bounds the replica's index entries (kvevents.MaxBlocksFor).
func (f *Fleet) GPUBlocks(ctx context.Context, base string) int {
	smp, err := f.scraper.Read(ctx, base)
	if err != nil {
		return 0
	}
	return smp.GPUBlocks
}

// engineSample takes an engine's /metrics figures into its replicas' views.
func (f *Fleet) engineSample(name string, smp *Sample) {
	_, es := f.Snapshot()
	e, ok := es[name]
	if !ok {
		return
	}
	for _, r := range e.Reps {
		// The page's block size only for a replica no event stream teaches: a stream's validated
		// events are the sizes its keys must match (a hybrid model's groups may differ).
		bs := 0
		if !r.Stream {
			bs = smp.BlockSize
		}
		if bs > 0 && r.View().MetricsBlockSize != bs {
			f.log.Info("block size read from the engine's /metrics; keys use it while no configured, announced or event-learned size exists",
				"engine", name, "rank", r.Rank, "block_size", bs, "metric", f.kind.Profile().Metrics.ConfigInfo)
		}
		if fig, ok := smp.Rank(r.Rank); ok {
			r.update(func(v *View) { v.Figures, v.HaveFigures, v.MetricsBlockSize = fig, true, bs })
		} else if bs > 0 {
			r.update(func(v *View) { v.MetricsBlockSize = bs })
		}
	}
}

// engineScrapeFailed counts an engine /metrics page not read (logged once a minute per engine).
func (f *Fleet) engineScrapeFailed(name string, err error) {
	_, es := f.Snapshot()
	e, ok := es[name]
	if !ok || e.gone.Load() {
		return
	}
	f.o.Metrics.EngineScrapes.WithLabelValues(name).Inc()
	f.o.LogLimited("scrape:"+name, "engine /metrics not read; its queue and KV-use signals keep their last values, counted in kvroute_router_engine_metrics_failures_total",
		"engine", name, "err", err)
}

// scrapeTargets is every engine, for the /metrics reader.
func scrapeTargets(es map[string]*Engine) []Target {
	out := make([]Target, 0, len(es))
	for name, e := range es {
		out = append(out, Target{Name: name, URL: e.dp.Load().URL})
	}
	return out
}

// probeLoop polls every engine's /health, concurrently.
func (f *Fleet) probeLoop(ctx context.Context) {
	t := time.NewTicker(f.o.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, es := f.Snapshot()
		var wg sync.WaitGroup
		for _, e := range es {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if f.probe(ctx, e) && !e.modelsRead {
					f.relearn(ctx, e)
				}
			}()
		}
		wg.Wait()
	}
}

// Where the fleet's block size came from (BlockSize).
const (
	BlockSizeFromConfig    = "config"
	BlockSizeFromDiscovery = "discovery"
	BlockSizeFromEvents    = "events"
	BlockSizeFromMetrics   = "metrics"
	BlockSizeUnknown       = "unknown"
)

// BlockSize is the fleet's block size and where it came from: configured, else announced by
// discovery, else learned from a validated event, else read from the /metrics page of an engine
// without an event stream (vllm:cache_config_info), read from the views given. Until one of them
// says, it is unknown and requests are routed by load without keys: keys at a guessed size would
// never match the engines' blocks, and would fill the predicted index with entries no event
// ever confirms.
func BlockSize(configured int, views []*View) (int, string) {
	var b BlockSizeVote
	for _, v := range views {
		b.Add(v)
	}
	return b.Result(configured)
}

// BlockSizeVote gathers BlockSize's answer one view at a time (the decision reads each view
// once, for this and for the rest).
type BlockSizeVote struct{ discovery, learned, metrics int }

// Add counts one replica's view.
func (b *BlockSizeVote) Add(v *View) {
	if b.discovery == 0 && v.DiscoveryBlockSize > 0 {
		b.discovery = v.DiscoveryBlockSize
	}
	if b.learned == 0 && v.LearnedBlockSize > 0 {
		b.learned = v.LearnedBlockSize
	}
	if b.metrics == 0 && v.MetricsBlockSize > 0 {
		b.metrics = v.MetricsBlockSize
	}
}

// Result is the block size and its source.
func (b *BlockSizeVote) Result(configured int) (int, string) {
	switch {
	case configured > 0:
		return configured, BlockSizeFromConfig
	case b.discovery > 0:
		return b.discovery, BlockSizeFromDiscovery
	case b.learned > 0:
		return b.learned, BlockSizeFromEvents
	case b.metrics > 0:
		return b.metrics, BlockSizeFromMetrics
	}
	return 0, BlockSizeUnknown
}

// BlockSize is the fleet's block size now (the package function over every replica's view).
func (f *Fleet) BlockSize() (int, string) {
	reps := f.Replicas()
	vs := make([]*View, len(reps))
	for i, r := range reps {
		vs[i] = r.View()
	}
	return BlockSize(f.o.Config.BlockSize, vs)
}

// WarmupCredit is the configured credit decaying linearly to 0 at until over the warm-up
// duration.
func WarmupCredit(w config.Warmup, until, now time.Time) float64 {
	if until.IsZero() || !now.Before(until) {
		return 0
	}
	d := w.Duration.Duration
	if d <= 0 {
		return 0
	}
	return w.Credit * min(1, float64(until.Sub(now))/float64(d))
}
