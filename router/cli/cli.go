// Package cli is kvrouter's command line: flags over the --config file, the request observers,
// serving until the context ends (the router itself is router/app, served over HTTP by
// router/server; see docs/router.md). cmd/kvrouter runs it with the production policies;
// kvbench's hidden `router` subcommand runs the same code with its benchmark policies added.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/kvroute/kvroute/internal/version"
	"github.com/kvroute/kvroute/router/app"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/engine"
	"github.com/kvroute/kvroute/router/score"
	"github.com/kvroute/kvroute/router/tracing"
)

// Options are what the binary running the router decides.
type Options struct {
	// Policies are the policies --policy and --shadow-policy may name (score.Production() when
	// nil).
	Policies *score.Registry
	// Ready, when set, receives the bound API and admin addresses (tests listen on port 0); the
	// API's is "off" when the router is an endpoint picker only.
	Ready func(api, admin string)
	// ExtProcReady, when set, receives the endpoint picker's bound address.
	ExtProcReady func(addr string)
}

type engineFlags []string

func (e *engineFlags) String() string     { return strings.Join(*e, " ") }
func (e *engineFlags) Set(v string) error { *e = append(*e, v); return nil }

// settings is everything the flags and the file decide.
type settings struct {
	cfg        config.Config
	source     discovery.Source
	eventsBind string
	model      string
	fullReport bool
	hostTopic  bool
	// engineKey is the engine API key read from where engineAuth says (never from a flag's
	// value: that would show in ps).
	engineKey string
	logger    *slog.Logger
	// accessSample logs one routed request in N with its breakdown (0: off).
	accessSample int
}

func parse(args []string, stderr io.Writer, policies *score.Registry) (*settings, error) {
	if policies == nil {
		policies = score.Production()
	}
	fs := flag.NewFlagSet("kvrouter", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "YAML configuration file (router/config schema); flags override it")
	listen := fs.String("listen", "", "API address host:port (default :8000); off: no API, the endpoint picker only (needs --ext-proc-listen)")
	admin := fs.String("admin-listen", "", "metrics and debug address (default 127.0.0.1:9090)")
	extProc := fs.String("ext-proc-listen", "", "also serve the Gateway API Inference Extension's endpoint picker protocol (Envoy ext_proc over gRPC, with the liveness/readiness health services) at host:port, e.g. :9002")
	extProcTLS := fs.Bool("ext-proc-tls", false, "endpoint picker: serve TLS (a self-signed certificate made at start unless --ext-proc-cert-dir), as gateways dial the Inference Extension's own picker")
	extProcCertDir := fs.String("ext-proc-cert-dir", "", "endpoint picker: serve TLS with tls.crt and tls.key from this directory (a mounted Secret), read again when they change")
	conformance := fs.Bool("ext-proc-conformance-hooks", false, "endpoint picker: honour the Inference Extension conformance suite's test-epp-endpoint-selection header (conformance runs only)")
	pool := fs.String("inference-pool", "", "InferencePool discovery: the pool (in --namespace) whose selector's pods on its target ports are the engines")
	var engines engineFlags
	fs.Var(&engines, "engine", "static engine NAME=http://HOST:PORT;events=tcp://..,..;replay=tcp://..,..;snapshot=tcp://..,..;warmup-until=RFC3339;block-size=N;kind=vllm|sglang|trtllm;role=prefill|decode (repeatable; all but NAME=URL optional)")
	enginesFile := fs.String("engines-file", "", "file of --engine entries, one a line, re-read when it changes")
	engineKind := fs.String("engine-kind", "", "engines' family: vllm, sglang or trtllm (default vllm; the config's engineKind); an engine of another kind is refused")
	eventsBind := fs.String("events-bind", "", "bound mode: bind tcp://HOST:PORT for engines that dial in, told apart by topic (overrides events.bind)")
	namespace := fs.String("namespace", "", "Kubernetes discovery: namespace of the engine pods")
	selector := fs.String("selector", "", "Kubernetes discovery: label selector of the engine pods")
	enginePort := fs.Int("engine-port", 0, "Kubernetes discovery: engines' HTTP port (0: the container port named http)")
	policy := fs.String("policy", "", "scoring policy: "+strings.Join(policies.Names(), "|")+" (default kv)")
	blockSize := fs.Int("block-size", -1, "engines' KV block size (0: learn from discovery, the first valid event, or else an engine's /metrics; -1: the config's, default 0); until known, requests route by load")
	model := fs.String("model", "", "served model name (default: read from each engine's /v1/models)")
	fullReport := fs.Bool("kv-cache-report-full", false, `inject vllm_xargs.kv_cache_report_mode="full" into forwarded requests`)
	noEvents := fs.Bool("no-events", false, "do not subscribe to KV events (score every engine approximately)")
	keyEnv := fs.String("engine-api-key-env", "", "environment variable holding the engines' API key (vLLM --api-key); sent on every engine call, replacing a client's Authorization")
	keyFile := fs.String("engine-api-key-file", "", "file holding the engines' API key (alternative to --engine-api-key-env)")
	captureDir := fs.String("capture-dir", "", "write the traffic as a Mooncake trace into this directory (enables capture; docs/should-you-route.md)")
	captureBytes := fs.Int64("capture-max-bytes", 0, "capture: bytes per file (default 64 MiB)")
	captureFiles := fs.Int("capture-files", 0, "capture: files kept (default 4)")
	shadowPol := fs.String("shadow-policy", "", "re-decide every request with this policy without acting on it; kvroute_router_shadow_* metrics (docs/should-you-route.md)")
	auditOn := fs.Bool("audit", false, "audit sampled prompts for a varying span at their start (/debug/audit; docs/should-you-route.md)")
	holdWaiting := fs.Int("hold-max-waiting", -1, "requests held at once while the model has no ready replica (0: answer 503 at once; -1: the config's, default 128)")
	renderURL := fs.String("render-url", "", "a GPU-less render server of the model (vllm launch render), asked before the engines; a failure falls back to the engine, counted")
	respOwners := fs.Int("response-owners", 0, "stored Responses ids whose engine the router remembers, least recently used dropped first (0: the config's responses.maxOwners, default 100000)")
	respOwnerTTL := fs.Duration("response-owner-ttl", 0, "how long a stored Responses id's engine is remembered (0: the config's responses.ownerTTL, default 24h)")
	holdWait := fs.Duration("hold-max-wait", 0, "how long a held request waits for a ready replica before its 503 with Retry-After (0: the config's, default 30s)")
	disaggMin := fs.Int("disagg-min-uncached-tokens", 0, "prefill/decode fleets: a request whose decode pick leaves fewer uncached prompt tokens than this goes whole to that decode replica instead of being split; -1 splits every request (0: the config's disaggregation.minUncachedTokens, default 1000)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	accessSample := fs.Int("access-log-sample", 0, "log one routed request in N with its decision's breakdown (as /debug/route shows it); 0: off")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = usage(fs, stderr)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *showVersion {
		return nil, errVersion
	}
	if *accessSample < 0 {
		return nil, fmt.Errorf("--access-log-sample must be 0 (off) or N > 0, got %d", *accessSample)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	ho := &slog.HandlerOptions{Level: level}
	var logger *slog.Logger
	switch *logFormat {
	case "json":
		logger = slog.New(slog.NewJSONHandler(stderr, ho))
	case "text":
		logger = slog.New(slog.NewTextHandler(stderr, ho))
	default:
		return nil, fmt.Errorf("--log-format must be text or json, got %q", *logFormat)
	}

	cfg := config.Default()
	if *cfgPath != "" {
		c, err := config.Load(*cfgPath)
		if err != nil {
			return nil, err
		}
		cfg = c
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	if *admin != "" {
		cfg.AdminListen = *admin
	}
	if *extProc != "" {
		if cfg.ExtProc == nil {
			cfg.ExtProc = &config.ExtProc{}
		}
		cfg.ExtProc.Listen = *extProc
	}
	if *extProcTLS || *extProcCertDir != "" {
		if cfg.ExtProc == nil {
			return nil, errors.New("--ext-proc-tls and --ext-proc-cert-dir need --ext-proc-listen")
		}
		cfg.ExtProc.TLS = &config.ExtProcTLS{CertDir: *extProcCertDir}
	}
	if *conformance {
		if cfg.ExtProc == nil {
			return nil, errors.New("--ext-proc-conformance-hooks needs --ext-proc-listen")
		}
		cfg.ExtProc.ConformanceHooks = true
	}
	if *policy != "" {
		cfg.Policy = *policy
	}
	if *blockSize >= 0 {
		cfg.BlockSize = *blockSize
	}
	if *engineKind != "" {
		if _, err := engine.Parse(*engineKind); err != nil {
			return nil, fmt.Errorf("--engine-kind: %w", err)
		}
		cfg.EngineKind = *engineKind
	}
	if *noEvents {
		cfg.Events.Enabled = false
	}
	switch {
	case *pool != "":
		if *selector != "" || *enginePort != 0 {
			return nil, errors.New("--inference-pool takes the selector and ports from the pool: drop --selector and --engine-port")
		}
		cfg.Discovery = &config.Discovery{InferencePool: &config.InferencePoolDiscovery{Namespace: *namespace, Name: *pool}}
	case *namespace != "" || *selector != "":
		cfg.Discovery = &config.Discovery{Kubernetes: config.DefaultKubernetesDiscovery(*namespace, *selector, *enginePort)}
	}
	if *eventsBind != "" {
		cfg.Events.Bind = *eventsBind
	}
	if *keyEnv != "" || *keyFile != "" {
		cfg.EngineAuth = &config.EngineAuth{APIKeyEnv: *keyEnv, APIKeyFile: *keyFile}
	}
	if *captureDir != "" || *captureBytes != 0 || *captureFiles != 0 {
		if cfg.Capture == nil {
			cfg.Capture = &config.Capture{}
		}
		cfg.Capture.Enabled = true
		if *captureDir != "" {
			cfg.Capture.Dir = *captureDir
		}
		if *captureBytes != 0 {
			cfg.Capture.MaxBytes = *captureBytes
		}
		if *captureFiles != 0 {
			cfg.Capture.Files = *captureFiles
		}
	}
	if *shadowPol != "" {
		cfg.ShadowPolicy = *shadowPol
	}
	if *disaggMin != 0 {
		cfg.Disaggregation = &config.Disaggregation{MinUncachedTokens: *disaggMin}
	}
	if *holdWaiting >= 0 {
		cfg.Hold.MaxWaiting = *holdWaiting
	}
	if *holdWait > 0 {
		cfg.Hold.MaxWait = metav1.Duration{Duration: *holdWait}
	}
	if *renderURL != "" {
		cfg.RenderURL = *renderURL
	}
	if *respOwners != 0 || *respOwnerTTL != 0 {
		if cfg.Responses == nil {
			cfg.Responses = &config.Responses{}
		}
		if *respOwners != 0 {
			cfg.Responses.MaxOwners = *respOwners
		}
		if *respOwnerTTL != 0 {
			cfg.Responses.OwnerTTL = metav1.Duration{Duration: *respOwnerTTL}
		}
	}
	if *auditOn {
		if cfg.Audit == nil {
			cfg.Audit = &config.Audit{}
		}
		cfg.Audit.Enabled = true
	}
	if err := cfg.ValidatePolicies(policies.Names()); err != nil {
		return nil, err
	}
	if *model == "" {
		*model = cfg.ServedModelName
	}
	st := &settings{cfg: cfg, eventsBind: cfg.Events.Bind, model: *model, fullReport: *fullReport || cfg.KVCacheReportMode == "full", logger: logger,
		accessSample: *accessSample}
	if cfg.EngineAuth != nil {
		key, err := cfg.EngineAuth.Key()
		if err != nil {
			return nil, err
		}
		st.engineKey = key
	}

	sources := 0
	for _, set := range []bool{len(engines) > 0, *enginesFile != "", cfg.Discovery != nil} {
		if set {
			sources++
		}
	}
	if sources > 1 {
		return nil, errors.New("give one engine source: --engine, --engines-file, --namespace/--selector or --namespace/--inference-pool (or the config's discovery)")
	}
	switch {
	case len(engines) > 0:
		var es []discovery.Engine
		for _, e := range engines {
			en, err := discovery.ParseEngineFlag(e)
			if err != nil {
				return nil, fmt.Errorf("--engine: %w", err)
			}
			if len(en.Events) == 0 && (len(en.Replay) > 0 || len(en.Snapshot) > 0) && st.eventsBind == "" {
				return nil, fmt.Errorf("--engine %s: replay= or snapshot= without events= is bound mode's shape and needs --events-bind", en.Name)
			}
			es = append(es, en)
		}
		if err := discovery.CheckSnapshot(es); err != nil {
			return nil, fmt.Errorf("--engine: %w", err)
		}
		kind, _ := engine.Parse(cfg.EngineKind) // checked with the config
		if err := discovery.MixedKinds(kind, es); err != nil {
			return nil, fmt.Errorf("--engine: %w", err)
		}
		st.source = discovery.NewStatic(es)
	case *enginesFile != "":
		st.source = discovery.NewFile(*enginesFile, 0, discovery.WithLogger(logger))
	case cfg.Discovery != nil && cfg.Discovery.Kubernetes != nil:
		k := cfg.Discovery.Kubernetes
		if k.Namespace == "" || k.Selector == "" {
			return nil, errors.New("kubernetes discovery needs both --namespace and --selector")
		}
		rc, err := ctrl.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
		ko := discovery.KubernetesOptionsFromConfig(k)
		ko.Logger = logger
		st.hostTopic = true
		if st.source, err = discovery.NewKubernetes(rc, ko); err != nil {
			return nil, err
		}
	case cfg.Discovery != nil && cfg.Discovery.InferencePool != nil:
		ip := cfg.Discovery.InferencePool
		if ip.Namespace == "" || ip.Name == "" {
			return nil, errors.New("InferencePool discovery needs both --namespace and --inference-pool")
		}
		rc, err := ctrl.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("InferencePool discovery: %w", err)
		}
		st.hostTopic = true
		if st.source, err = discovery.NewInferencePool(rc, discovery.InferencePoolOptions{Namespace: ip.Namespace, Name: ip.Name,
			Pods: discovery.KubernetesOptions{Logger: logger}}); err != nil {
			return nil, err
		}
	default:
		if len(cfg.Engines) == 0 && st.eventsBind == "" {
			return nil, errors.New("no engines: give --engine, --engines-file, --namespace/--selector, --namespace/--inference-pool or a config with engines")
		}
	}
	return st, nil
}

// setSnapshotURL tells the router where its peers fetch its snapshot (with several routers).
func setSnapshotURL(st *settings, srv *app.Router, admin net.Addr) {
	pc := st.cfg.Peers
	if pc == nil {
		return
	}
	u := pc.SnapshotURL
	if u == "" {
		u = snapshotURL(admin)
	}
	if u == "" {
		st.logger.Warn("peers: no snapshot URL (admin address is a wildcard and POD_IP is unset); peers cannot start from this router's index")
	}
	srv.SetSnapshotURL(u)
}

// listeningAttrs are the "kvrouter listening" line's fields.
func listeningAttrs(st *settings, srv *app.Router, api string, admin net.Addr, ep *extProcServer, traces bool) []any {
	attrs := []any{"api", api, "admin", admin.String(), "policy", st.cfg.Policy,
		"engine_api_key", st.engineKey != "", "otlp_traces", traces}
	if ep != nil {
		attrs = append(attrs, "ext_proc", ep.addr())
	}
	if c := srv.PeerClusterAddr(); c != "" {
		// The route address the embedded NATS server bound: a peers.clusterListen port 0 is
		// chosen by the kernel, and tools that start several routers (kvbench replay --routers)
		// read it here to name it in the next router's routes.
		attrs = append(attrs, "peer_cluster", c)
	}
	return attrs
}

// Run starts the router and blocks until ctx ends; it returns the process's exit code (2 for a
// bad command line or configuration, 1 for a failure to start or serve).
func Run(ctx context.Context, args []string, stderr io.Writer, o Options) int {
	if o.Policies == nil {
		o.Policies = score.Production()
	}
	st, err := parse(args, stderr, o.Policies)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if errors.Is(err, errVersion) {
			version.Print(versionOut, "kvrouter")
			return 0
		}
		fmt.Fprintln(stderr, "kvrouter:", err)
		return 2
	}
	obs, err := newObservers(st)
	if err != nil {
		fmt.Fprintln(stderr, "kvrouter:", err)
		return 1
	}
	defer obs.close()
	tracer, stopTracing, err := startTracing(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "kvrouter:", err)
		return 1
	}
	defer stopTracing()
	srv, err := app.New(app.Options{Config: st.cfg, Policies: o.Policies, Source: st.source, EventsBind: st.eventsBind, Model: st.model,
		FullReport: st.fullReport, TopicHostOnly: st.hostTopic, EngineAPIKey: st.engineKey, Logger: st.logger,
		AccessLogSample: st.accessSample, Observers: obs.list, Tracer: tracer})
	if err != nil {
		fmt.Fprintln(stderr, "kvrouter:", err)
		return 1
	}
	if err := obs.attach(srv, st); err != nil {
		srv.Close()
		fmt.Fprintln(stderr, "kvrouter:", err)
		return 1
	}
	apiLn, err := listenAPI(st.cfg.Listen)
	if err != nil {
		srv.Close()
		fmt.Fprintln(stderr, "kvrouter: --listen:", err)
		return 1
	}
	closeAPI := func() {
		if apiLn != nil {
			apiLn.Close()
		}
	}
	adminLn, err := net.Listen("tcp", st.cfg.AdminListen)
	if err != nil {
		closeAPI()
		srv.Close()
		fmt.Fprintln(stderr, "kvrouter: --admin-listen:", err)
		return 1
	}
	setSnapshotURL(st, srv, adminLn.Addr())
	var ep *extProcServer
	if x := st.cfg.ExtProc; x != nil {
		if ep, err = startExtProc(x, srv, st.logger, st.cfg.Limits); err != nil {
			closeAPI()
			adminLn.Close()
			srv.Close()
			fmt.Fprintln(stderr, "kvrouter: --ext-proc-listen:", err)
			return 1
		}
	}
	// No WriteTimeout: it would cut long streams. limits.headerReadTimeout and
	// limits.bodyReadTimeout guard against slow clients holding connections.
	draining := new(atomic.Bool)
	api := &http.Server{Handler: closeWhenDraining(srv.APIHandler(), draining)}
	srv.ConfigureHTTP(api)
	adm := &http.Server{Handler: obs.admin(srv.AdminHandler()), ReadHeaderTimeout: 10 * time.Second}
	// The router's own loops (events, probes, peers, the reporter) run on their own context:
	// they go on while the requests in flight drain after SIGTERM, and stop after them.
	stop := ctx
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 4)
	go func() { errc <- srv.Run(ctx) }()
	if ep != nil {
		go func() { errc <- ep.serve(ctx, srv) }()
	}
	if apiLn != nil {
		go func() { errc <- api.Serve(apiLn) }()
	}
	go func() { errc <- adm.Serve(adminLn) }()
	if st.cfg.Report != nil {
		startReporter(ctx, st, srv)
	}
	apiAddr := addrOf(apiLn)
	st.logger.Info("kvrouter listening", listeningAttrs(st, srv, apiAddr, adminLn.Addr(), ep, tracer != nil)...)
	if o.Ready != nil {
		o.Ready(apiAddr, adminLn.Addr().String())
	}
	if ep != nil && o.ExtProcReady != nil {
		o.ExtProcReady(ep.addr())
	}
	code := 0
	select {
	case <-stop.Done():
		draining.Store(true)
		code = drain(st, srv, api, ep, errc)
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			st.logger.Error("kvrouter stopped", "err", err)
			code = 1
		}
		sctx, scancel := context.WithTimeout(context.Background(), st.cfg.Shutdown.Timeout.Duration)
		if ep != nil {
			ep.stop(sctx)
		}
		_ = api.Shutdown(sctx)
		scancel()
	}
	cancel()
	actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer acancel()
	_ = adm.Shutdown(actx)
	srv.Close()
	return code
}

// closeWhenDraining answers with Connection: close once draining is set, so each client's
// pooled connection closes after its next answer and the client reconnects through the
// Service, to a router that stays. Idle connections are not closed at once (the server's
// SetKeepAlivesEnabled(false) would): a client may be sending on one that very moment, and a
// POST lost that way is not retried by the client.
func closeWhenDraining(h http.Handler, draining *atomic.Bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if draining.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// drain is the graceful stop (config shutdown): not ready at once, the API served for
// drainDelay with each connection closed after its next answer, then no new connections and the
// requests in flight waited for up to timeout. The event, probe and peer loops run meanwhile,
// so the requests still routed in the delay see a live index. Returns the exit code.
func drain(st *settings, srv *app.Router, api *http.Server, ep *extProcServer, errc <-chan error) int {
	sd := st.cfg.Shutdown
	srv.Drain()
	t0 := time.Now()
	if sd.DrainDelay.Duration > 0 {
		t := time.NewTimer(sd.DrainDelay.Duration)
		select {
		case <-t.C:
		case err := <-errc:
			t.Stop()
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				st.logger.Error("kvrouter stopped while draining", "err", err)
				return 1
			}
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), sd.Timeout.Duration)
	defer cancel()
	if ep != nil {
		ep.stop(sctx)
	}
	err := api.Shutdown(sctx)
	if err != nil {
		// Past the timeout: the streams still open are cut (each after its first token, or the
		// client sees the connection close).
		st.logger.Warn("shutdown timeout passed with requests in flight; they are cut", "timeout", sd.Timeout.Duration, "err", err)
	}
	st.logger.Info("kvrouter stopped", "drained_in", time.Since(t0).Round(time.Millisecond))
	return 0
}

// listenAPI binds the API listener. With listen off the router is an endpoint picker only: no
// OpenAI API listener (nil), the picker's gRPC and the admin listener still served.
func listenAPI(addr string) (net.Listener, error) {
	if addr == config.ListenOff {
		return nil, nil
	}
	return net.Listen("tcp", addr)
}

// addrOf is a listener's address as the listening line and Options.Ready give it ("off": none).
func addrOf(ln net.Listener) string {
	if ln == nil {
		return config.ListenOff
	}
	return ln.Addr().String()
}

// snapshotURL is where peers fetch this router's snapshot: the admin address, with $POD_IP for a
// wildcard host ("" when neither names this pod).
func snapshotURL(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return ""
	}
	host := tcp.IP.String()
	if tcp.IP.IsUnspecified() {
		host = os.Getenv("POD_IP")
	}
	if host == "" {
		return ""
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(tcp.Port)) + "/peer/snapshot"
}

// startTracing starts OpenTelemetry as the environment asks (off without
// OTEL_EXPORTER_OTLP_ENDPOINT); its stop flushes the last spans, bounded: a collector that is
// gone must not hold the exit.
func startTracing(ctx context.Context) (trace.Tracer, func(), error) {
	tracer, stop, err := tracing.FromEnv(ctx, os.Getenv)
	if err != nil {
		return nil, nil, err
	}
	return tracer, func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stop(c)
	}, nil
}
