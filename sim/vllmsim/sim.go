package vllmsim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Sim is one simulated vLLM server (all its DP ranks behind one HTTP port).
type Sim struct {
	cfg    Config
	hasher *blockHasher
	reg    *prometheus.Registry
	// kindReg is the /metrics page of an SGLang or TensorRT-LLM sim (kinds.go).
	kindReg *prometheus.Registry
	metrics *simMetrics
	ranks   []*rank
	topic   string

	ln      net.Listener
	srv     *http.Server
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started atomic.Bool
	closed  sync.Once

	failMu  sync.Mutex
	failRNG *rand.Rand
	nextID  atomic.Uint64
	sleep   sleepState
	created int64
	// stored holds Responses answers stored in this simulator's memory, as vLLM's server does.
	stored responseStore

	engineID string         // the connector's engine id
	sideSrvs []*http.Server // side channels, one per rank
	xfer     transferStats
}

// New checks the configuration and builds the simulator; Start opens its sockets.
func New(cfg Config) (*Sim, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h, err := newBlockHasher(cfg.HashAlgo, cfg.HashSeed)
	if err != nil {
		return nil, err
	}
	s := &Sim{cfg: cfg, hasher: h, reg: prometheus.NewRegistry(), created: time.Now().Unix(),
		failRNG: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x766c6c6d2d73696d))}
	s.metrics = newSimMetrics(&s.cfg, s.reg, &s.sleep)
	s.kindReg = prometheus.NewRegistry()
	s.kindReg.MustRegister(kindMetrics{s.metrics})
	for i := range cfg.DataParallelSize {
		rk := newRank(i, &s.cfg, h, s.metrics.ranks[i])
		rk.xfer = &s.xfer
		s.ranks = append(s.ranks, rk)
	}
	if kt := cfg.KVTransfer; kt != nil {
		s.engineID = kt.EngineID
		if s.engineID == "" {
			s.engineID = newEngineID(rand.Uint64())
		}
		registerTransferMetrics(s.reg, &s.xfer)
	}
	return s, nil
}

// Start binds the HTTP listener and the event sockets and starts every rank; it returns once
// the sim is serving. Everything stops when ctx ends or on Close.
func (s *Sim) Start(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("vllmsim: already started")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(s.cfg.Host, strconv.Itoa(s.cfg.Port)))
	if err != nil {
		return fmt.Errorf("vllmsim: listen: %w", err)
	}
	s.ln = ln
	port := ln.Addr().(*net.TCPAddr).Port
	s.topic = DefaultTopic(s.cfg.Host, port, s.cfg.Model)
	if s.cfg.KVEventsTopic != nil {
		s.topic = *s.cfg.KVEventsTopic
	}
	if s.cfg.eventsEnabled() {
		for _, rk := range s.ranks {
			p, err := newPublisher(&s.cfg, rk.idx, s.topic)
			if err != nil {
				s.closePublishers()
				_ = ln.Close()
				return err
			}
			rk.pub = p
		}
	}
	ctx, s.cancel = context.WithCancel(ctx)
	if err := s.startSideChannels(ctx); err != nil {
		s.cancel()
		s.closePublishers()
		_ = ln.Close()
		return err
	}
	for _, rk := range s.ranks {
		if rk.pub != nil {
			rk.pub.start()
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			rk.run(ctx)
		}()
	}
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(ln)
	}()
	go func() {
		<-ctx.Done()
		_ = s.Close() // stopping because ctx ended: no caller is left to report an error to
	}()
	return nil
}

// Addr is the HTTP address (host:port) once started.
func (s *Sim) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// URL is http://Addr.
func (s *Sim) URL() string { return "http://" + s.Addr() }

// Topic is the first frame of every event message.
func (s *Sim) Topic() string { return s.topic }

// EventEndpoints are the PUB endpoints per rank (bound or dialled), empty when events are off.
func (s *Sim) EventEndpoints() []string {
	var out []string
	for _, rk := range s.ranks {
		if rk.pub != nil {
			out = append(out, rk.pub.pubAddr)
		}
	}
	return out
}

// ReplayEndpoints are the bound ROUTER replay endpoints per rank, empty when replay is off.
func (s *Sim) ReplayEndpoints() []string {
	var out []string
	for _, rk := range s.ranks {
		if rk.pub != nil && rk.pub.replay != nil {
			out = append(out, rk.pub.repAddr)
		}
	}
	return out
}

// Config is the effective configuration (defaults filled in).
func (s *Sim) Config() Config { return s.cfg }

// Close stops the HTTP server, the ranks and the event sockets, and waits for them.
func (s *Sim) Close() error {
	s.closed.Do(func() {
		if s.cancel != nil {
			s.cancel()
		}
		if s.srv != nil {
			_ = s.srv.Close()
		}
		for _, srv := range s.sideSrvs {
			_ = srv.Close()
		}
		s.wg.Wait()
		s.closePublishers()
	})
	return nil
}

func (s *Sim) closePublishers() {
	for _, rk := range s.ranks {
		if rk.pub != nil {
			rk.pub.close()
		}
	}
}

// Handler is the sim's HTTP surface, as Start serves it; generation requests need the ranks
// that Start runs, so mount it elsewhere only after Start.
func (s *Sim) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	s.kindRoutes(mux)
	mux.HandleFunc("POST /v1/responses", s.handleResponses)
	mux.HandleFunc("GET /v1/responses/{id}", s.handleStoredResponse)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", s.handleStoredResponse)
	mux.HandleFunc("POST /v1/messages", s.handleMessages)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /debug/cache", s.handleDebugCache)
	mux.HandleFunc("POST /reset_prefix_cache", s.handleReset)
	mux.HandleFunc("POST /sleep", s.handleSleep)
	mux.HandleFunc("POST /wake_up", s.handleWakeUp)
	mux.HandleFunc("GET /is_sleeping", s.handleIsSleeping)
	mux.HandleFunc("POST /debug/restart", s.handleRestart)
	mux.HandleFunc("POST /debug/events", s.handleDebugEvents)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{http.StatusNotFound, "NotFoundError", "no route " + r.Method + " " + r.URL.Path, ""})
	})
	return requireAPIKey(mux, s.cfg.APIKeys, s.cfg.kind())
}

// pickRank honours X-data-parallel-rank, else takes the least loaded rank by vLLM's DP
// coordinator score (waiting*4 + running; ties go to the lowest rank).
func (s *Sim) pickRank(r *http.Request) (*rank, error) {
	pinned, err := pinnedRank(r, len(s.ranks))
	if err != nil {
		return nil, err
	}
	if pinned >= 0 {
		return s.ranks[pinned], nil
	}
	best, bestLoad := s.ranks[0], s.ranks[0].load()
	for _, rk := range s.ranks[1:] {
		if l := rk.load(); l < bestLoad {
			best, bestLoad = rk, l
		}
	}
	return best, nil
}

// shouldFail draws the seeded fail-rate fault.
func (s *Sim) shouldFail() bool {
	if s.cfg.FailRate <= 0 {
		return false
	}
	s.failMu.Lock()
	defer s.failMu.Unlock()
	return s.failRNG.Float64() < s.cfg.FailRate
}
