// Package app assembles kvrouter: router/fleet keeps the engines (membership, health, each
// replica's view), kvevents feeds the exact index, tokens turns requests into token ids,
// router/route and the load ledger decide, and proxy forwards. It serves the OpenAI API through
// router/server and the admin endpoints (/metrics, /debug/engines, /debug/route).
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/router/admission"
	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	enginekind "github.com/kvroute/kvroute/router/engine"
	"github.com/kvroute/kvroute/router/fleet"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/metrics"
	"github.com/kvroute/kvroute/router/peers"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/router/server"
	"github.com/kvroute/kvroute/router/tokens"
)

// Options configure a Server. Config is required (start from config.Default()); the rest
// have defaults.
type Options struct {
	Config config.Config
	// Source supplies the engines; nil means the static engines of Config.
	Source discovery.Source
	// EventsBind, when set, binds one SUB socket there and identifies engines by topic.
	EventsBind string
	// Model is the served model name (for topics and LoRA detection); "" reads each engine's
	// /v1/models.
	Model string
	// TopicHostOnly: engines publish with topic <prefix>@<host>@<model> (Kubernetes pods, as the
	// operator configures them) instead of <prefix>@<host>:<port>@<model>.
	TopicHostOnly bool
	// FullReport injects vllm_xargs.kv_cache_report_mode = "full" into every request.
	FullReport bool
	// EngineAPIKey is the router's credential for engines started with --api-key: sent on
	// every call to an engine, replacing a client's Authorization (proxy.Options.EngineAPIKey).
	EngineAPIKey string
	// Now is the clock for warm-up credit and side-index TTLs (time.Now); tests move it.
	Now func() time.Time
	// ProbeInterval between active /health probes (2s); ProbeTimeout per probe (1s).
	ProbeInterval, ProbeTimeout time.Duration
	// IdleTimeout, when set, replaces Config.Limits.IdleTimeout.
	IdleTimeout time.Duration
	// PredictedTTL is the predicted side index's TTL (index.DefaultPredictedTTL).
	PredictedTTL time.Duration
	// TokenizeTimeout bounds one tokenization (2s).
	TokenizeTimeout time.Duration
	// ScrapeInterval between reads of every engine's /metrics (fleetmetrics.DefaultInterval).
	ScrapeInterval time.Duration
	// HealthInterval between samples of every replica's counters for its degraded reasons (5s).
	HealthInterval time.Duration
	// MaxAttempts bounds the engines tried for one request (3).
	MaxAttempts int
	// DisaggMinUncached is conditional disaggregation's threshold: on a fleet with prefill and
	// decode replicas, a request whose decode pick would leave fewer uncached prompt tokens
	// than this goes whole to the decode replica instead of being split
	// (0: Config.Disaggregation.MinUncachedTokens, else DefaultDisaggMinUncached; < 0 splits
	// every request).
	DisaggMinUncached int
	// DiscoveryWait is how long a request that arrives before the first engine snapshot waits
	// for it before a 503 "no engine discovered yet" (10s).
	DiscoveryWait time.Duration
	// Observers are told of every routed request's lifecycle (load.Observer).
	Observers []load.Observer
	// Policy, when set, replaces the policy Config.Policy names (tests, experiments).
	Policy score.Policy
	// Policies are the policies Config.Policy and Config.ShadowPolicy may name
	// (score.Production() when nil; kvbench's router adds its benchmark policies).
	Policies *score.Registry
	// AccessLogSample, when N > 0, logs one routed request in N at INFO with its decision's
	// breakdown (what /debug/route shows); 0 logs none.
	AccessLogSample int
	// Tracer, when set, gets a span per generation request (parented on the client's
	// traceparent) with tokenize, decide and forward spans under it; the engine gets the
	// forward span as its parent. Nil: no spans, and the client's trace headers pass as they came.
	Tracer trace.Tracer
	// Seed seeds the policy's random choices.
	Seed   int64
	Logger *slog.Logger
}

// Router is one kvrouter. Start with Run; handlers are usable as soon as New returns.
type Router struct {
	o      Options
	log    *slog.Logger
	now    func() time.Time
	policy string
	// started is when New ran (the balance windows cover no more than that).
	started time.Time

	ix    *index.Index
	sub   *kvevents.Subscriber
	bound bool
	tok   *tokens.Tokenizer
	px    *proxy.Proxy
	met   *metrics.Metrics
	http  *server.Server
	// fleet owns the engines: membership, health, probes, degraded reasons, /metrics figures,
	// and each replica's view the decision reads.
	fleet *fleet.Fleet
	// ledger holds every routed request until it ends, the load it puts on its replica, the
	// predicted and approximate side indexes, and the policy.
	ledger *load.Ledger

	rr atomic.Uint64 // tokenization engine rotation

	tokenizeDegraded atomic.Uint64
	// routedCount numbers routed requests for the sampled access log.
	routedCount atomic.Uint64
	// decisions holds finished decisions for reuse (newDecision, release): a warm decision
	// allocates nothing.
	decisions sync.Pool
	closeOnce sync.Once
	// authLogged holds the calls whose engine 401/403 was logged: a misconfigured key
	// fails every call, so it is logged once per call kind and counted every time.
	authLogged sync.Map
	// quietLogs rate-limits logs of per-request fallbacks (logLimited): key -> *atomic.Int64,
	// the unix nanoseconds of the last line.
	quietLogs sync.Map
	// exactHook replaces the stream-state lookup in benchmarks (no streams there).
	exactHook func(*replica) bool
	readyOnce chan struct{}
	// draining is set on shutdown (Drain): /readyz answers 503 from then on, so the Service
	// stops sending new connections while the requests in flight finish.
	draining atomic.Bool
	// hold keeps generation requests while no replica is ready (router/admission; admit).
	hold *admission.Hold
	// debugRouteSlots bounds /debug/route calls in flight (debugRouteConcurrency).
	debugRouteSlots chan struct{}
	// peers is parity across replicas (nil without events; the fleet forgets removed replicas).
	peers *kvevents.PeerTable
	// peer is this router's part among several router replicas (peers.go; nil when alone).
	peer *peers.Group
	// debugSections are router-wide parts of GET /debug/engines that live outside the server
	// (the trace capture's counts), by key; set before serving (AddDebugSection).
	debugSections map[string]func() any
	// respOwners maps stored Responses answers to the engine holding them (responses.go).
	respOwners *responseOwners
}

// setDefaults fills in what the caller left zero.
func (o *Options) setDefaults() {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = 2 * time.Second
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = time.Second
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 3
	}
	if d := o.Config.Disaggregation; o.DisaggMinUncached == 0 && d != nil {
		o.DisaggMinUncached = d.MinUncachedTokens
	}
	if o.DisaggMinUncached == 0 {
		o.DisaggMinUncached = DefaultDisaggMinUncached
	}
	if o.DiscoveryWait <= 0 {
		o.DiscoveryWait = 10 * time.Second
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = fleet.DefaultHealthInterval
	}
	if o.Model == "" {
		o.Model = o.Config.ServedModelName
	}
	if o.Config.KVCacheReportMode == "full" {
		o.FullReport = true
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// New builds a server; it connects nothing until Run.
func New(o Options) (*Router, error) {
	if o.Policies == nil {
		o.Policies = score.Production()
	}
	if err := o.Config.ValidatePolicies(o.Policies.Names()); err != nil {
		return nil, err
	}
	o.setDefaults()
	name := o.Config.Policy
	if name == "least-loaded" {
		name = "load"
	}
	kv := kvParams(o.Config.Scoring)
	pol := o.Policy
	if pol == nil {
		var err error
		if pol, err = o.Policies.New(name, score.Options{Seed: o.Seed, KV: &kv}); err != nil {
			return nil, err
		}
	} else {
		name = pol.Name()
	}
	s := &Router{o: o, log: o.Logger, now: o.Now, policy: name, started: o.Now(), readyOnce: make(chan struct{}),
		debugRouteSlots: make(chan struct{}, debugRouteConcurrency)}
	s.ix = index.New(index.Options{Now: o.Now})
	observers := o.Observers
	var peerPrefill func(string) int64
	if pc := o.Config.Peers; pc != nil {
		var err error
		if s.peer, err = peers.New(peers.Options{Config: pc, Now: o.Now, Logger: s.log}); err != nil {
			return nil, fmt.Errorf("peers: %w", err)
		}
		// Publishes the ledger's transitions once Start below has joined the group.
		observers = append(append([]load.Observer{}, observers...), s.peer.Observer())
		peerPrefill = s.peer.Prefill
	}
	lo := load.Options{Now: o.Now, Policy: pol, PredictedTTL: o.PredictedTTL, Observers: observers,
		RecordTTL: recordTTL(o.Config.Limits.RequestTimeout.Duration), PeerPrefill: peerPrefill}
	s.ledger = load.New(lo)
	lim := o.Config.Limits
	idle := lim.IdleTimeout.Duration
	if o.IdleTimeout > 0 {
		idle = o.IdleTimeout
	}
	s.px = proxy.New(proxy.Options{ConnectTimeout: lim.ConnectTimeout.Duration, FirstTokenTimeout: lim.FirstTokenTimeout.Duration,
		IdleTimeout: idle, EngineAPIKey: o.EngineAPIKey})
	kind, _ := enginekind.Parse(o.Config.EngineKind) // validated with the config
	s.tok = tokens.New(tokens.Options{Client: s.px.Client(), Timeout: o.TokenizeTimeout, Kind: kind, RenderURL: o.Config.RenderURL})
	if o.Config.Events.Enabled {
		s.peers = kvevents.NewPeerTable()
		// Without full report mode every BlockStored is a physical copy (vLLM's contract); with
		// it, a parent-nil store may be a re-announcement no removal balances.
		ing := kvevents.IngestOptions{BlockSize: o.Config.BlockSize, Peers: s.peers, CopyPerStore: !o.FullReport}
		// Parity recomputes each sampled event's block 0 at the event's own block size, so it
		// runs whether the router's block size is configured or learned.
		if algo, aerr := blockkey.ParseAlgo(o.Config.Hash.Algo); aerr == nil {
			ing.Parity = &kvevents.Parity{Algo: algo, Seed: o.Config.Hash.Seed}
		}
		var err error
		s.sub, err = kvevents.New(kvevents.Options{Index: s.ix, RcvHWM: o.Config.Events.HWM, Ingest: ing, Logger: s.log, Now: o.Now})
		if err != nil {
			return nil, err
		}
		if o.EventsBind != "" {
			if _, err := s.sub.Bind(o.EventsBind); err != nil {
				_ = s.sub.Close()
				return nil, fmt.Errorf("--events-bind: %w", err)
			}
			s.bound = true
		}
	}
	state := metrics.NewStateCollector(s.streamMetrics, func() float64 { return float64(s.ix.Keys()) },
		func() (float64, float64) {
			st := s.ledger.Stats()
			return float64(st.Predicted), float64(st.Approximate)
		},
		s.unroutableEvents, streamCounterSpecs())
	state.DegradedReasons = reasonNames()
	state.SideEvicted = func() (float64, float64) {
		st := s.ledger.Stats()
		return float64(st.PredictedEvicted), float64(st.ApproximateEvicted)
	}
	s.met = metrics.New(state)
	owners, ownerTTL := o.Config.ResponseOwnerBounds()
	s.respOwners = newResponseOwners(owners, ownerTTL, s.met.ResponseOwnerEvicted.Inc)
	s.met.Registry.MustRegister(s.ledger.Collectors()...)
	s.met.Registry.MustRegister(indexAndRenderCollectors(s)...)
	s.met.Registry.MustRegister(newBacklogCollector(s))
	s.hold = admission.New(admission.Options{MaxWaiting: o.Config.Hold.MaxWaiting, MaxWait: o.Config.Hold.MaxWait.Duration}, o.Model)
	s.met.Registry.MustRegister(s.hold.Collectors()...)
	for _, c := range authCalls {
		s.met.EngineAuth.WithLabelValues(c) // present at 0, so an alert can use rate() from the start
	}
	s.fleet = fleet.New(fleet.Options{Config: o.Config, Client: s.px.Client(), Sub: s.sub, Bound: s.bound, Peers: s.peers,
		Index: s.ix, Ledger: s.ledger, Metrics: s.met, Model: o.Model, TopicHostOnly: o.TopicHostOnly,
		ProbeInterval: o.ProbeInterval, ProbeTimeout: o.ProbeTimeout, HealthInterval: o.HealthInterval, ScrapeInterval: o.ScrapeInterval,
		Now: o.Now, Logger: s.log, AuthFailure: s.engineAuthFailure, LogLimited: s.logLimited,
		SeedStream: s.peer.SeedStream, SeedApprox: s.peer.SeedApprox})
	if s.peer != nil {
		if err := s.peer.Start(s.peerDeps(), s.met.Registry); err != nil {
			if s.sub != nil {
				_ = s.sub.Close()
			}
			return nil, fmt.Errorf("peers: %w", err)
		}
	}
	lim = o.Config.Limits
	s.http = server.New(s, server.Options{MaxBodyBytes: lim.MaxBodyBytes, BodyReadTimeout: lim.BodyReadTimeout.Duration,
		HeaderReadTimeout: lim.HeaderReadTimeout.Duration, RequestTimeout: lim.RequestTimeout.Duration, DiscoveryWait: o.DiscoveryWait})
	return s, nil
}

// The router's calls to an engine, as counted in engine_auth_failures_total.
const (
	callTokenize = "tokenize"
	callModels   = fleet.CallModels
	callHealth   = fleet.CallHealth
	callGenerate = "generate"
)

var authCalls = []string{callTokenize, callModels, callHealth, callGenerate}

// fallbackLogEvery is how often a per-request fallback (tokenization failed, an attempt
// retried elsewhere, a request routed without keys) is logged for the same reason; every one is
// counted on /metrics in between.
const fallbackLogEvery = time.Minute

// logLimited logs msg at WARN the first time key is seen and then at most once per
// fallbackLogEvery, so an outage that fails every request is one line a minute, not one a
// request.
func (s *Router) logLimited(key, msg string, args ...any) {
	now := s.now().UnixNano()
	v, _ := s.quietLogs.LoadOrStore(key, new(atomic.Int64))
	last := v.(*atomic.Int64)
	prev := last.Load()
	if prev != 0 && now-prev < int64(fallbackLogEvery) || !last.CompareAndSwap(prev, now) {
		return
	}
	s.log.Warn(msg, append(args, "logged_at_most_every", fallbackLogEvery)...)
}

// engineAuthFailure records an engine refusing one of the router's calls with 401/403. It is
// the router's misconfiguration, never the client's: counted every time, logged once per call
// kind with what to fix.
func (s *Router) engineAuthFailure(call, engine string, err error) {
	s.met.EngineAuth.WithLabelValues(call).Inc()
	if _, seen := s.authLogged.LoadOrStore(call, true); seen {
		return
	}
	fix := "the engines require an API key and the router has none: set engineAuth.apiKeyEnv or apiKeyFile (--engine-api-key-env, --engine-api-key-file), or spec.engine.apiKeySecretRef"
	if s.o.EngineAPIKey != "" {
		fix = "the engines refused the router's engine API key: it differs from theirs (vLLM --api-key / VLLM_API_KEY)"
	}
	s.log.Error("engine refused the router's credentials; logged once, counted in kvroute_router_engine_auth_failures_total",
		"call", call, "engine", engine, "err", err, "fix", fix)
}

// Run follows the engine source and probes engines until ctx ends; it then closes the
// subscriber. The first snapshot is applied before Run reports readiness through Synced.
func (s *Router) Run(ctx context.Context) error {
	src := s.o.Source
	if src == nil {
		es, err := discovery.FromConfig(s.o.Config.Engines)
		if err != nil {
			return err
		}
		src = discovery.NewStatic(es)
	}
	if s.peer != nil {
		s.peer.Bootstrap(ctx) // a ready peer's snapshot, before the first engines are added
	}
	go s.expireLoop(ctx)
	go s.fleet.Run(ctx)
	go s.hold.Run(ctx, s.anyHealthy, holdCheckInterval)
	err := src.Run(ctx, func(snap []discovery.Engine) {
		s.apply(ctx, snap)
		select {
		case <-s.readyOnce:
		default:
			close(s.readyOnce)
		}
	})
	s.Close()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Synced is closed once the first engine snapshot is applied.
func (s *Router) Synced() <-chan struct{} { return s.readyOnce }

// Close stops the event subscriber (Run does it when its context ends).
func (s *Router) Close() {
	s.closeOnce.Do(func() {
		s.peer.Close()
		if s.sub != nil {
			_ = s.sub.Close()
		}
	})
}

func (s *Router) expireLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, rc := range s.ledger.Expire() {
				s.logLimited("ledger-expired", "a routed request's end was never reported; the ledger ended it after the request timeout, counted in kvroute_router_ledger_records_expired_total",
					"replica", rc.Replica.Name, "routed_at", rc.At)
			}
		}
	}
}

// recordTTL is how long the ledger keeps a request whose end was never reported: no request
// outlives the request timeout, and the minute covers the release itself.
func recordTTL(requestTimeout time.Duration) time.Duration {
	if requestTimeout <= 0 {
		return 0
	}
	return requestTimeout + time.Minute
}

// NotReady says why the router cannot take traffic ("" when it can).
func (s *Router) NotReady() string { return s.notReady() }

// Ready reports whether the first engine snapshot is applied and at least one engine is ready
// and healthy, or the router can hold requests until one is (config hold.maxWaiting > 0).
func (s *Router) Ready() bool {
	return s.notReady() == ""
}

// Drain marks the router as shutting down: /readyz (and the picker's gRPC readiness) say
// not ready from now on, while the API still serves (kvrouter keeps its listener open for
// shutdown.drainDelay, then waits for the requests in flight). Logged once.
func (s *Router) Drain() {
	if s.draining.CompareAndSwap(false, true) {
		s.log.Info("shutting down: not ready from now on; requests in flight are served to their end")
	}
}

// ErrDraining is /readyz's reason while the router shuts down.
const ErrDraining = "shutting down"

// notReady says why the router is not ready ("" when it is).
func (s *Router) notReady() string {
	if s.draining.Load() {
		return ErrDraining
	}
	select {
	case <-s.readyOnce:
	default:
		return server.ErrNotDiscovered
	}
	if !s.anyHealthy() && s.hold.Options().MaxWaiting == 0 {
		// With a hold the router stays ready: it takes the requests and holds them while a
		// replica comes up (a model scaled to zero gets its demand through a router only).
		return "no healthy engine"
	}
	return s.peer.NotReady()
}

func (s *Router) anyHealthy() bool { return s.readyIn(s.reps()) }

// Metrics exposes the collectors (for tests and the admin handler).
func (s *Router) Metrics() *metrics.Metrics { return s.met }

// streamCounterSpecs are the per-stream counters /metrics exports: every one kvevents keeps.
func streamCounterSpecs() []metrics.CounterSpec {
	var out []metrics.CounterSpec
	for _, c := range kvevents.CounterSpecs() {
		out = append(out, metrics.CounterSpec{Metric: c.Metric, Help: c.Help, Gauge: c.Gauge})
	}
	return out
}

// unroutableEvents counts bound-mode messages whose topic named no engine.
func (s *Router) unroutableEvents() float64 {
	if s.sub == nil {
		return 0
	}
	return float64(s.sub.Unroutable())
}

// APIHandler serves the OpenAI API, /healthz and /readyz (router/server).
func (s *Router) APIHandler() http.Handler { return s.http.API() }

// ConfigureHTTP sets the API server's connection limits from the configuration
// (server.Server.Configure).
func (s *Router) ConfigureHTTP(hs *http.Server) { s.http.Configure(hs) }

// AdminHandler serves /metrics, /debug/engines and /debug/route, and GET /peer/snapshot when
// this router is one of several replicas.
func (s *Router) AdminHandler() http.Handler {
	h := s.http.Admin()
	if s.peer == nil {
		return h
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /peer/snapshot", s.serveSnapshot)
	mux.Handle("/", h)
	return mux
}

// MetricsHandler serves /metrics.
func (s *Router) MetricsHandler() http.Handler { return s.met.Handler() }

// Refused counts a request the HTTP surface refused, by reason.
func (s *Router) Refused(reason string) { s.met.Errors.WithLabelValues("", s.policy, reason).Inc() }

// kvParams maps the configuration's scoring knobs onto the kv policy's defaults.
func kvParams(sc config.Scoring) score.KVParams {
	kv := score.DefaultKV
	kv.TierWeights = [score.NumTiers]float64{sc.TierWeights.GPU, sc.TierWeights.CPU, sc.TierWeights.Disk}
	kv.Temperature = sc.Temperature
	if sc.ImbalanceBound >= 1 {
		kv.Slack = sc.ImbalanceBound - 1
	}
	// loadWeight scales every load term of the cost against the request's own uncached work:
	// QueuedPrefillWeight weighs the prefill ahead and the decode load together (router/score/kv.go, load),
	// so DecodeWeight, their exchange rate, stays.
	kv.QueuedPrefillWeight *= sc.LoadWeight
	return kv
}

// indexAndRenderCollectors export the index's session homes and the render server's use, read
// at scrape time from their owners (s nil: the descriptions alone, for IndexAndRenderDescs).
func indexAndRenderCollectors(s *Router) []prometheus.Collector {
	read := func(f func() float64) func() float64 {
		if s == nil {
			return func() float64 { return 0 }
		}
		return f
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kvroute_router", Name: "session_homes",
			Help: "Sessions whose home replica the index learnt from the engines' BlockStored session_id."},
			read(func() float64 { return float64(s.ix.SessionStats().Sessions) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "session_home_evictions_total",
			Help: "Session -> replica entries dropped for the session map's bound (least recently stored first)."},
			read(func() float64 { return float64(s.ix.SessionStats().Evicted) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "render_server_renders_total",
			Help: "Prompts the render server (--render-url) rendered, sparing the serving engines the call."},
			read(func() float64 { return float64(s.tok.Stats().RenderServer) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "render_server_fallbacks_total",
			Help: "Renders the render server (--render-url) failed (down, 5xx, timeout, bad answer), rendered on the engine instead."},
			read(func() float64 { return float64(s.tok.Stats().RenderFallbacks) })),
	}
}

// IndexAndRenderDescs describes the session-home and render-server metrics without a router,
// for the checks that every metric kvrouter can expose is documented (test/ship).
func IndexAndRenderDescs(ch chan<- *prometheus.Desc) {
	for _, c := range indexAndRenderCollectors(nil) {
		c.Describe(ch)
	}
}
