// Package server assembles kvrouter: discovery feeds the engine table, kvevents feeds the exact
// index, tokens turns requests into token ids, score picks a replica from index overlap and the
// load this router tracks, and proxy forwards. It serves the OpenAI API and the admin endpoints
// (/metrics, /debug/engines, /debug/route).
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/degraded"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/metrics"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/score"
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
	// HealthInterval between samples of every replica's counters for its degraded reasons (5s).
	HealthInterval time.Duration
	// MaxAttempts bounds the engines tried for one request (3).
	MaxAttempts int
	// DiscoveryWait is how long a request that arrives before the first engine snapshot waits
	// for it before a 503 "no engine discovered yet" (10s).
	DiscoveryWait time.Duration
	// Seed seeds the policy's random choices.
	Seed   int64
	Logger *slog.Logger
}

// Server is one kvrouter. Start with Run; handlers are usable as soon as New returns.
type Server struct {
	o      Options
	log    *slog.Logger
	now    func() time.Time
	policy string

	ix        *index.Index
	predicted *index.SideIndex
	approx    *index.SideIndex
	sub       *kvevents.Subscriber
	bound     bool
	tok       *tokens.Tokenizer
	px        *proxy.Proxy
	met       *metrics.Metrics

	polMu sync.Mutex
	pol   score.Policy

	syncMu sync.Mutex
	table  engineTable
	rr     atomic.Uint64 // tokenization engine rotation

	tokenizeDegraded, requestsTotal atomic.Uint64
	closeOnce                       sync.Once
	// authLogged holds the calls whose engine 401/403 was logged: a misconfigured key
	// fails every call, so it is logged once per call kind and counted every time.
	authLogged sync.Map
	// quietLogs rate-limits logs of per-request fallbacks (logLimited): key -> *atomic.Int64,
	// the unix nanoseconds of the last line.
	quietLogs sync.Map
	// exactHook replaces the stream-state lookup in benchmarks (no streams there).
	exactHook func(*replica) bool
	readyOnce chan struct{}
	// debugRouteSlots bounds /debug/route calls in flight (debugRouteConcurrency).
	debugRouteSlots chan struct{}
	// tracker decides each replica's degraded reasons (health.go); healthMu serialises ticks.
	healthMu sync.Mutex
	tracker  *degraded.Tracker
	// peers is parity across replicas (nil without events).
	peers *kvevents.PeerTable
	// peer is this router's part among several router replicas (peers.go; nil when alone).
	peer *peerState
}

// New builds a server; it connects nothing until Run.
func New(o Options) (*Server, error) {
	if err := o.Config.Validate(); err != nil {
		return nil, err
	}
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
	if o.DiscoveryWait <= 0 {
		o.DiscoveryWait = 10 * time.Second
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = defaultHealthInterval
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
	name := o.Config.Policy
	if name == "least-loaded" {
		name = "load"
	}
	kv := kvParams(o.Config.Scoring)
	pol, err := score.New(name, score.Options{Seed: o.Seed, KV: &kv})
	if err != nil {
		return nil, err
	}
	s := &Server{o: o, log: o.Logger, now: o.Now, policy: name, pol: pol, readyOnce: make(chan struct{}),
		debugRouteSlots: make(chan struct{}, debugRouteConcurrency), tracker: degraded.NewTracker(o.HealthInterval)}
	s.ix = index.New(index.Options{Now: o.Now})
	s.predicted = index.NewPredicted(index.SideOptions{TTL: o.PredictedTTL})
	s.approx = index.NewApproximate(index.SideOptions{})
	lim := o.Config.Limits
	idle := lim.IdleTimeout.Duration
	if o.IdleTimeout > 0 {
		idle = o.IdleTimeout
	}
	s.px = proxy.New(proxy.Options{ConnectTimeout: lim.ConnectTimeout.Duration, FirstTokenTimeout: lim.FirstTokenTimeout.Duration,
		IdleTimeout: idle, EngineAPIKey: o.EngineAPIKey})
	s.tok = tokens.New(tokens.Options{Client: s.px.Client(), Timeout: o.TokenizeTimeout})
	if o.Config.Events.Enabled {
		s.peers = kvevents.NewPeerTable()
		ing := kvevents.IngestOptions{BlockSize: o.Config.BlockSize, Peers: s.peers}
		// Parity recomputes each sampled event's block 0 at the event's own block size, so it
		// runs whether the router's block size is configured or learned.
		if algo, aerr := blockkey.ParseAlgo(o.Config.Hash.Algo); aerr == nil {
			ing.Parity = &kvevents.Parity{Algo: algo, Seed: o.Config.Hash.Seed}
		}
		s.sub, err = kvevents.New(kvevents.Options{Index: s.ix, RcvHWM: o.Config.Events.HWM, Ingest: ing, Logger: s.log})
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
	s.table.engines = map[string]*engine{}
	state := metrics.NewStateCollector(s.streamMetrics, func() float64 { return float64(s.ix.Keys()) },
		func() (float64, float64) { return float64(s.predicted.Len()), float64(s.approx.Len()) },
		s.unroutableEvents, streamCounterSpecs())
	state.DegradedReasons = reasonNames()
	s.met = metrics.New(state)
	for _, c := range authCalls {
		s.met.EngineAuth.WithLabelValues(c) // present at 0, so an alert can use rate() from the start
	}
	if pc := o.Config.Peers; pc != nil {
		if err := s.startPeers(pc); err != nil {
			if s.sub != nil {
				_ = s.sub.Close()
			}
			return nil, fmt.Errorf("peers: %w", err)
		}
	}
	return s, nil
}

// The router's calls to an engine, as counted in engine_auth_failures_total.
const (
	callTokenize = "tokenize"
	callModels   = "models"
	callHealth   = "health"
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
func (s *Server) logLimited(key, msg string, args ...any) {
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
func (s *Server) engineAuthFailure(call, engine string, err error) {
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
func (s *Server) Run(ctx context.Context) error {
	src := s.o.Source
	if src == nil {
		es, err := discovery.FromConfig(s.o.Config.Engines)
		if err != nil {
			return err
		}
		src = discovery.NewStatic(es)
	}
	if s.peer != nil {
		s.bootstrap(ctx) // a ready peer's snapshot, before the first engines are added
	}
	go s.probeLoop(ctx)
	go s.expireLoop(ctx)
	go s.healthLoop(ctx)
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
func (s *Server) Synced() <-chan struct{} { return s.readyOnce }

// Close stops the event subscriber (Run does it when its context ends).
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.closePeers()
		if s.sub != nil {
			_ = s.sub.Close()
		}
	})
}

func (s *Server) expireLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			now := s.now()
			s.predicted.Expire(now)
			s.approx.Expire(now)
		}
	}
}

// Ready reports whether the first engine snapshot is applied and at least one engine is ready
// and healthy.
func (s *Server) Ready() bool {
	return s.notReady() == ""
}

// notReady says why the router is not ready ("" when it is).
func (s *Server) notReady() string {
	select {
	case <-s.readyOnce:
	default:
		return errNotDiscovered
	}
	if !s.anyHealthy() {
		return "no healthy engine"
	}
	return s.peerNotReady()
}

func (s *Server) anyHealthy() bool {
	reps, _ := s.table.snapshot()
	now := s.now()
	for _, r := range reps {
		if r.eng.dp.Load().Ready && r.eng.health.Healthy(now) {
			return true
		}
	}
	return false
}

// Metrics exposes the collectors (for tests and the admin handler).
func (s *Server) Metrics() *metrics.Metrics { return s.met }

// streamCounterSpecs are the per-stream counters /metrics exports: every one kvevents keeps.
func streamCounterSpecs() []metrics.CounterSpec {
	var out []metrics.CounterSpec
	for _, c := range kvevents.CounterSpecs() {
		out = append(out, metrics.CounterSpec{Metric: c.Metric, Help: c.Help, Gauge: c.Gauge})
	}
	return out
}

// unroutableEvents counts bound-mode messages whose topic named no engine.
func (s *Server) unroutableEvents() float64 {
	if s.sub == nil {
		return 0
	}
	return float64(s.sub.Unroutable())
}

// APIHandler serves the OpenAI API, /healthz and /readyz.
func (s *Server) APIHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, tokens.Completion) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, tokens.Chat) })
	mux.HandleFunc("GET /v1/models", s.serveModels)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := s.notReady(); why != "" {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	allowed := map[string]string{"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/models": "GET, HEAD",
		"/healthz": "GET, HEAD", "/readyz": "GET, HEAD"}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if allow, ok := allowed[r.URL.Path]; ok {
			w.Header().Set("Allow", allow)
			proxy.WriteError(w, http.StatusMethodNotAllowed, proxy.TypeInvalidRequest, "method "+r.Method+" not allowed on "+r.URL.Path)
			return
		}
		proxy.WriteError(w, http.StatusNotFound, proxy.TypeInvalidRequest, "no route "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// ConfigureHTTP sets the API server's connection limits from the configuration:
// limits.headerReadTimeout for a request's line and headers, and an idle keep-alive limit. There
// is no write timeout (it would cut long streams); bodies are bounded by limits.bodyReadTimeout
// in the handlers and by limits.maxBodyBytes.
func (s *Server) ConfigureHTTP(hs *http.Server) {
	hs.ReadHeaderTimeout = s.o.Config.Limits.HeaderReadTimeout.Duration
	hs.IdleTimeout = 120 * time.Second
}

// AdminHandler serves /metrics, /debug/engines and /debug/route.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.met.Handler())
	mux.HandleFunc("GET /debug/engines", s.serveDebugEngines)
	mux.HandleFunc("POST /debug/route", s.serveDebugRoute)
	mux.HandleFunc("GET /peer/snapshot", s.serveSnapshot)
	return mux
}

// kvParams maps the configuration's scoring knobs onto the kv policy's defaults.
func kvParams(sc config.Scoring) score.KVParams {
	kv := score.DefaultKV
	kv.TierWeights = [score.NumTiers]float64{sc.TierWeights.GPU, sc.TierWeights.CPU, sc.TierWeights.Disk}
	kv.Temperature = sc.Temperature
	if sc.ImbalanceBound >= 1 {
		kv.Slack = sc.ImbalanceBound - 1
	}
	// loadWeight scales every load term of the cost against the request's own uncached work.
	kv.QueuedPrefillWeight *= sc.LoadWeight
	kv.DecodeWeight *= sc.LoadWeight
	kv.QueueTokens *= sc.LoadWeight
	return kv
}
