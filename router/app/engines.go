package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/router/discovery"
	fleetmetrics "github.com/kvroute/kvroute/router/fleet"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/proxy"
)

// engine is one discovered engine and its replicas (one per DP rank).
type engine struct {
	// dp is the latest discovery entry; Ready and WarmupUntil change in place.
	dp     atomic.Pointer[discovery.Engine]
	name   string
	model  string          // served base model, for the topic and LoRA detection
	adapts map[string]bool // served LoRA adapter names
	// modelsRead: /v1/models answered when the engine was added. When it did not (the engine
	// was down, or refused the router's key), model and adapts are guesses, and with no
	// model the expected topic (<prefix>@<host>@<model>) matches nothing the engine sends:
	// the first successful probe reads the models again and rebuilds the engine (relearn).
	modelsRead bool
	health     *proxy.Health
	reps       []*replica
	// probeDown: the last /health probe failed; the streams were told (Subscriber.Down).
	probeDown atomic.Bool
	// gone is set when the engine left the table: requests still in flight on it stop
	// touching its (deleted) metric series.
	gone atomic.Bool
}

// replica is one (engine, DP rank): one index replica, maybe one event stream, and the load
// and accuracy this router tracks for it. Load is local to this router (see docs/router.md).
type replica struct {
	eng    *engine
	rank   int
	id     index.ReplicaID
	name   string // "engine/rank", the policy's stable candidate ID
	stream bool   // an event stream feeds it

	ld      *load.Replica // the load this router has routed there (the ledger's)
	retries atomic.Uint64 // attempts given up here before the first token

	responses, withUsage, noUsage      atomic.Uint64
	promptTok, predictedTok, actualTok atomic.Uint64
	absErrTok                          atomic.Uint64

	// engineFigures is the rank's latest figures from the engine's /metrics (router/fleet's
	// reader pushes them; nil until a page was read).
	engineFigures atomic.Pointer[fleetmetrics.Rank]

	quiet atomic.Int64 // requests served in a row with no event applied for staleAfter
	h     repHealth    // degraded reasons (health.go)
}

// engineTable is the router's view of the fleet, swapped under mu.
type engineTable struct {
	mu      sync.RWMutex
	engines map[string]*engine
	reps    []*replica // every replica, engine then rank order
}

func (t *engineTable) snapshot() ([]*replica, map[string]*engine) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.reps, t.engines
}

// apply reconciles the table with a discovery snapshot: new engines get their replicas and
// streams, removed ones lose them, a changed incarnation is a restart of every stream.
func (s *Router) apply(ctx context.Context, snap []discovery.Engine) {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	_, old := s.table.snapshot()
	info := s.prefetchModels(ctx, snap, old)
	next := map[string]*engine{}
	for _, d := range snap {
		e, ok := old[d.Name]
		switch {
		case ok && sameWiring(*e.dp.Load(), d):
			if prev := e.dp.Load().Incarnation; prev != d.Incarnation && prev != "" {
				for _, r := range e.reps {
					if r.stream {
						if err := s.sub.Restarted(d.Name, r.rank); err != nil {
							s.log.Warn("restart not applied", "engine", d.Name, "rank", r.rank, "err", err)
						}
					}
				}
				s.log.Info("engine restarted", "engine", d.Name, "incarnation", d.Incarnation)
			}
			d := d
			e.dp.Store(&d)
			next[d.Name] = e
		default:
			if ok {
				s.dropEngine(e)
			}
			ne, err := s.addEngine(d, info[d.Name])
			if err != nil {
				s.log.Error("engine not added", "engine", d.Name, "err", err)
				continue
			}
			next[d.Name] = ne
			s.log.Info("engine added", "engine", d.Name, "url", d.URL, "ranks", d.Ranks(), "streams", countStreams(ne))
		}
	}
	for name, e := range old {
		if _, ok := next[name]; !ok {
			s.dropEngine(e)
			s.log.Info("engine removed", "engine", name)
		}
	}
	var reps []*replica
	for _, d := range snap {
		if e, ok := next[d.Name]; ok {
			reps = append(reps, e.reps...)
		}
	}
	s.table.mu.Lock()
	s.table.engines, s.table.reps = next, reps
	s.table.mu.Unlock()
	s.scraper.SetTargets(scrapeTargets(next))
	s.probeNew(ctx, next)
}

func countStreams(e *engine) int {
	n := 0
	for _, r := range e.reps {
		if r.stream {
			n++
		}
	}
	return n
}

func sameWiring(a, b discovery.Engine) bool {
	return a.URL == b.URL && fmt.Sprint(a.Events) == fmt.Sprint(b.Events) && fmt.Sprint(a.Replay) == fmt.Sprint(b.Replay) &&
		a.Ranks() == b.Ranks()
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
func (s *Router) prefetchModels(ctx context.Context, snap []discovery.Engine, old map[string]*engine) map[string]modelInfo {
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
			base, adapters, err := s.models(ctx, d.URL)
			blocks := s.gpuBlocks(ctx, d.URL)
			mu.Lock()
			out[d.Name] = modelInfo{base, adapters, err, blocks}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func (s *Router) addEngine(d discovery.Engine, mi modelInfo) (*engine, error) {
	e := &engine{name: d.Name, health: &proxy.Health{}, adapts: map[string]bool{}}
	e.dp.Store(&d)
	e.model = s.o.Model
	if mi.err == nil {
		e.modelsRead = true
		if e.model == "" {
			e.model = mi.base
		}
		for _, a := range mi.adapters {
			e.adapts[a] = true
		}
	} else {
		if isAuthErr(mi.err) {
			s.engineAuthFailure(callModels, d.Name, mi.err)
		}
		s.log.Warn("engine models not read; topic and LoRA detection use --model until a probe succeeds and they are read again",
			"engine", d.Name, "err", mi.err)
	}
	if !s.bound && len(d.Events) == 0 && len(d.Replay) > 0 {
		s.log.Warn("engine lists replay endpoints without event endpoints, which only bound mode (--events-bind) uses; scored approximately",
			"engine", d.Name)
	}
	for r := 0; r < d.Ranks(); r++ {
		rep := &replica{eng: e, rank: r, name: fmt.Sprintf("%s/%d", d.Name, r)}
		ep := ""
		if r < len(d.Events) {
			ep = d.Events[r]
		}
		if s.o.Config.Events.Enabled && s.sub != nil && (ep != "" || s.bound) {
			sc := kvevents.StreamConfig{Engine: d.Name, Rank: r, Endpoint: ep, Topic: s.topic(d, e.model)}
			if mi.gpuBlocks > 0 {
				sc.MaxBlocks = kvevents.MaxBlocksFor(mi.gpuBlocks)
			}
			if s.o.Config.Events.Replay && r < len(d.Replay) {
				sc.ReplayEndpoint = d.Replay[r]
			}
			if s.bound {
				sc.Endpoint = ""
			}
			sc.Seed = s.seedFor(d.Name, r, d.Incarnation)
			if err := s.sub.Add(sc); err != nil {
				s.log.Warn("event stream not added; replica scored approximately", "engine", d.Name, "rank", r, "err", err)
			} else {
				rep.stream = true
			}
		}
		if !rep.stream {
			if _, err := s.ix.AddReplica(d.Name, r); err != nil {
				s.dropEngine(e)
				return nil, err
			}
		}
		id, ok := s.ix.Replica(d.Name, r)
		if !ok {
			s.dropEngine(e)
			return nil, fmt.Errorf("replica %s missing from the index", rep.name)
		}
		rep.id = id
		rep.ld = s.ledger.NewReplica(id, rep.name)
		if !rep.stream {
			s.seedApprox(rep)
		}
		e.reps = append(e.reps, rep)
	}
	return e, nil
}

// dropEngine removes an engine's replicas: their streams or index entries, side-index
// predictions, the policy's per-replica state (balance windows, learned keys) and the engine's
// metric series.
func (s *Router) dropEngine(e *engine) {
	e.gone.Store(true)
	for _, r := range e.reps {
		var err error
		if r.stream {
			err = s.sub.Remove(e.name, r.rank)
		} else {
			err = s.ix.RemoveReplica(r.id)
		}
		if err != nil {
			// Its index entries stay behind; they name a replica no decision scores.
			s.log.Error("replica's index entries not removed", "replica", r.name, "err", err)
		}
		if r.ld != nil {
			s.ledger.Remove(r.ld)
		}
		if s.peers != nil {
			s.peers.Forget(r.id)
		}
	}
	s.met.ForgetEngine(e.name)
}

// topic is the engine's KV-event topic: <prefix>@<host>@<model>. Pods publish with their IP
// only (the operator's $(POD_IP), Options.TopicHostOnly); static engines, often several on one
// host, with host:port of their HTTP address (vllm-sim's default, llm-d's convention).
func (s *Router) topic(d discovery.Engine, model string) string {
	u, err := url.Parse(d.URL)
	host := d.URL
	if err == nil {
		host = u.Host
		if s.o.TopicHostOnly {
			host = u.Hostname()
		}
	}
	return s.o.Config.Events.TopicPrefix + "@" + host + "@" + model
}

// models reads GET /v1/models: the base model and the LoRA adapters (entries with a parent).
func (s *Router) models(ctx context.Context, base string) (string, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", nil, err
	}
	resp, err := s.px.Client().Do(req)
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
func (s *Router) probeNew(ctx context.Context, es map[string]*engine) {
	for _, e := range es {
		if !e.health.State(s.now()).Probed {
			s.probe(ctx, e)
		}
	}
}

// probe asks the engine's /health and records the answer; it reports whether it was up. A
// success does not end a passive failure's backoff by itself: Health.ProbedAt lets the engine
// back only for a probe that started after the failure.
func (s *Router) probe(ctx context.Context, e *engine) bool {
	start := s.now()
	err := proxy.Probe(ctx, s.px.Client(), e.dp.Load().URL, s.o.ProbeTimeout)
	was := e.health.Healthy(s.now())
	e.health.ProbedAt(start, err)
	if ctx.Err() == nil && e.probeDown.CompareAndSwap(err == nil, err != nil) {
		s.tellStreams(e, err != nil)
	}
	if err == nil {
		return true
	}
	if isAuthErr(err) {
		// vLLM leaves /health open; an engine (or a proxy in front of it) that guards it is
		// refusing the router's credentials all the same.
		s.engineAuthFailure(callHealth, e.name, err)
	}
	if was {
		s.log.Warn("engine unhealthy", "engine", e.name, "err", err)
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
func (s *Router) relearn(ctx context.Context, e *engine) {
	base, adapters, err := s.models(ctx, e.dp.Load().URL)
	if err != nil {
		if isAuthErr(err) {
			s.engineAuthFailure(callModels, e.name, err)
		}
		s.log.Debug("engine models still not read", "engine", e.name, "err", err)
		return
	}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	reps, engines := s.table.snapshot()
	if engines[e.name] != e {
		return // removed or replaced meanwhile
	}
	d := *e.dp.Load()
	s.dropEngine(e)
	ne, err := s.addEngine(d, modelInfo{base: base, adapters: adapters})
	next := make(map[string]*engine, len(engines))
	for name, other := range engines {
		if name != e.name {
			next[name] = other
		}
	}
	var nreps []*replica
	for _, r := range reps {
		switch {
		case r.eng != e:
			nreps = append(nreps, r)
		case r.rank == 0 && ne != nil:
			nreps = append(nreps, ne.reps...)
		}
	}
	if err != nil {
		s.log.Error("engine not re-added after reading its models", "engine", e.name, "err", err)
	} else {
		ne.health = e.health // keep what probes and forwards learned
		next[e.name] = ne
		s.log.Info("engine models read; streams re-added", "engine", e.name, "model", ne.model, "adapters", len(adapters),
			"streams", countStreams(ne))
	}
	s.table.mu.Lock()
	s.table.engines, s.table.reps = next, nreps
	s.table.mu.Unlock()
	s.scraper.SetTargets(scrapeTargets(next))
}

// tellStreams passes a probe's change of mind to the engine's streams: down, the old process's
// blocks stop counting as exact at once; up, the stream checks whether the engine is still the
// process it was (see kvevents.Subscriber.Up).
func (s *Router) tellStreams(e *engine, down bool) {
	for _, r := range e.reps {
		if !r.stream {
			continue
		}
		var err error
		if down {
			err = s.sub.Down(e.name, r.rank)
		} else {
			err = s.sub.Up(e.name, r.rank)
		}
		if err != nil {
			s.log.Debug("stream not told of the engine's health", "engine", e.name, "rank", r.rank, "down", down, "err", err)
		}
	}
}

// gpuBlocks reads num_gpu_blocks from the engine's vllm:cache_config_info (GET /metrics, by
// the fleet's reader); 0 when it cannot. It bounds the replica's index entries
// (kvevents.MaxBlocksFor).
func (s *Router) gpuBlocks(ctx context.Context, base string) int {
	smp, err := s.scraper.Read(ctx, base)
	if err != nil {
		return 0
	}
	return smp.GPUBlocks
}

// parseGPUBlocks finds num_gpu_blocks in a Prometheus text exposition (fleetmetrics.Parse).
func parseGPUBlocks(r io.Reader) int {
	page, err := io.ReadAll(io.LimitReader(r, 8<<20))
	if err != nil {
		return 0
	}
	smp, _ := fleetmetrics.Parse(page)
	return smp.GPUBlocks
}

// engineSample takes an engine's /metrics figures (router/fleet) into its replicas, where
// every decision reads them without a lock.
func (s *Router) engineSample(name string, smp *fleetmetrics.Sample) {
	_, es := s.table.snapshot()
	e, ok := es[name]
	if !ok {
		return
	}
	for _, r := range e.reps {
		if fig, ok := smp.Rank(r.rank); ok {
			r.engineFigures.Store(&fig)
		}
	}
}

// engineScrapeFailed counts an engine /metrics page not read (logged once a minute per engine).
func (s *Router) engineScrapeFailed(name string, err error) {
	_, es := s.table.snapshot()
	e, ok := es[name]
	if !ok || e.gone.Load() {
		return
	}
	s.met.EngineScrapes.WithLabelValues(name).Inc()
	s.logLimited("scrape:"+name, "engine /metrics not read; its queue and KV-use signals keep their last values, counted in kvroute_router_engine_metrics_failures_total",
		"engine", name, "err", err)
}

// scrapeTargets is every engine of the table, for the fleet's /metrics reader.
func scrapeTargets(es map[string]*engine) []fleetmetrics.Target {
	out := make([]fleetmetrics.Target, 0, len(es))
	for name, e := range es {
		out = append(out, fleetmetrics.Target{Name: name, URL: e.dp.Load().URL})
	}
	return out
}

// probeLoop polls every engine's /health.
func (s *Router) probeLoop(ctx context.Context) {
	t := time.NewTicker(s.o.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, es := s.table.snapshot()
		var wg sync.WaitGroup
		for _, e := range es {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if s.probe(ctx, e) && !e.modelsRead {
					s.relearn(ctx, e)
				}
			}()
		}
		wg.Wait()
	}
}
