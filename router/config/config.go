// Package config is the kvrouter configuration file's schema. The operator renders it into
// the router's ConfigMap; kvrouter reads it (flags override it). Decoding is strict: an unknown
// or misspelt key is an error, not a silently ignored setting.
package config

import (
	"errors"
	"fmt"
	"github.com/kvroute/kvroute/api/v1alpha1"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/router/score"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/engine"
)

// Config is the whole file.
type Config struct {
	// Listen is the API address (host:port); "off" serves no OpenAI API, only the endpoint
	// picker (extProc, which it then needs) and the admin listener.
	Listen string `json:"listen"`
	// AdminListen serves /metrics and /debug; loopback unless the operator opens it for scraping.
	AdminListen string `json:"adminListen"`
	// ExtProc serves the Gateway API Inference Extension's endpoint picker protocol beside the
	// API (docs/gateways.md, "As an endpoint picker"); nil: off.
	ExtProc *ExtProc `json:"extProc,omitempty"`
	// Policy names the scorer (see the --policy flag).
	Policy string `json:"policy"`
	// BlockSize is the engines' KV block size in tokens; 0 learns it from the events.
	BlockSize int `json:"blockSize"`
	// Hash is how the engines hash blocks (used by the parity check).
	Hash Hash `json:"hash"`
	// EngineKind is the engines' family: vllm (the default), sglang or trtllm. It picks the
	// event layout, the tokenize route, the /metrics names and which vLLM-only checks run;
	// a fleet runs one kind. --engine-kind sets it.
	EngineKind string `json:"engineKind,omitempty"`
	// Engines is a static engine list; empty when Discovery is used.
	Engines []Engine `json:"engines,omitempty"`
	// Discovery finds engines at runtime instead of a static list.
	Discovery *Discovery `json:"discovery,omitempty"`
	Scoring   Scoring    `json:"scoring"`
	Warmup    Warmup     `json:"warmup"`
	Events    Events     `json:"events"`
	Limits    Limits     `json:"limits"`
	// Hold bounds the requests held while the model has no ready replica (router/admission).
	Hold Hold `json:"hold"`
	// Shutdown is what the router does on SIGTERM: readiness goes false at once, the API keeps
	// serving for drainDelay, then stops taking connections and waits for the requests in
	// flight for at most timeout.
	Shutdown Shutdown `json:"shutdown"`
	// Disaggregation tunes the two-step request on a fleet with prefill and decode pools
	// (docs/disaggregation.md).
	Disaggregation *Disaggregation `json:"disaggregation,omitempty"`
	// ServedModelName is the engines' --served-model-name (event topics, LoRA detection); ""
	// reads each engine's /v1/models. --model overrides it.
	ServedModelName string `json:"servedModelName,omitempty"`
	// KVCacheReportMode "full" injects vllm_xargs.kv_cache_report_mode = "full" into every
	// forwarded request, so engines re-announce the blocks a request hit (recency). vLLM honours
	// it from PR #45261 on; older engines ignore it. "" leaves requests alone.
	// --kv-cache-report-full sets it.
	KVCacheReportMode string `json:"kvCacheReportMode,omitempty"`
	// Report, when set, makes the router write the replicas it finds degraded into its
	// KVRoutedModel's status (status.routerReports, one entry per router pod).
	Report *Report `json:"report,omitempty"`
	// EngineAuth, when set, says where the router's engine API key is; nil: engines take no
	// key (a client's Authorization is then forwarded to them as is).
	EngineAuth *EngineAuth `json:"engineAuth,omitempty"`
	// Capture, when enabled, writes the traffic as a Mooncake-format trace (router/capture).
	Capture *Capture `json:"capture,omitempty"`
	// RenderURL is a GPU-less render server of the model (`vllm launch render`) the router
	// renders prompts on before the serving engines; a failed render falls back to the engine,
	// counted. Empty: the engines render.
	RenderURL string `json:"renderURL,omitempty"`
	// Responses bounds what the router remembers of stored Responses answers; absent: the
	// defaults (DefaultResponseOwners, DefaultResponseOwnerTTL).
	Responses *Responses `json:"responses,omitempty"`
	// Audit, when enabled, samples prompts for spans that vary at the start of otherwise
	// repeated prompts (router/audit).
	Audit *Audit `json:"audit,omitempty"`
	// ShadowPolicy, when set, re-decides every request with this policy on the signals the real
	// decision saw, without acting on it (router/shadow): what kv would have hit on today's
	// caches, while production runs another policy.
	ShadowPolicy string `json:"shadowPolicy,omitempty"`
	// Peers, when set, makes this router one of several replicas that share their in-flight
	// load (router/peersync) and start from a peer's index snapshot (docs/router.md, "Several
	// router replicas"). nil: a router on its own.
	Peers *Peers `json:"peers,omitempty"`
}

// Peers configures the router replicas' load sync and start from a peer.
type Peers struct {
	// ID names this router among its peers; "" takes $POD_NAME, else the host name.
	ID string `json:"id,omitempty"`
	// Subject is the NATS subject the routers of one model share ("kvroute.load.<model>" as the
	// operator renders it); routers on one NATS server must use one subject per model.
	Subject string `json:"subject,omitempty"`
	// URL, when set, is an external NATS server (nats://, tls://); otherwise each router embeds
	// one and they cluster through ClusterListen and Routes.
	URL string `json:"url,omitempty"`
	// ClusterListen is the embedded server's route port (host:port; the operator: 0.0.0.0:6222).
	ClusterListen string `json:"clusterListen,omitempty"`
	// Routes are the peers' route addresses (host:port or nats-route://host:port); the router's
	// headless Service name reaches every router pod.
	Routes []string `json:"routes,omitempty"`
	// TLS, when set, is mutual TLS between the embedded servers (or to the external URL).
	TLS *PeerTLS `json:"tls,omitempty"`
	// SnapshotURL is where peers fetch this router's snapshot; "" derives it from adminListen
	// ($POD_IP when the admin address is a wildcard).
	SnapshotURL string `json:"snapshotURL,omitempty"`
	// PeerTimeout is how long a silent peer's load counts (3s).
	PeerTimeout metav1.Duration `json:"peerTimeout,omitempty"`
	// ReadyTimeout bounds how long a router that took a peer's snapshot waits for every stream
	// to be exact or approximate-with-snapshot before /readyz follows the single-router rule
	// (10s), so one dead engine cannot hold readiness.
	ReadyTimeout metav1.Duration `json:"readyTimeout,omitempty"`
	// MaxSnapshotBytes bounds a snapshot taken from a peer (512 MiB).
	MaxSnapshotBytes int64 `json:"maxSnapshotBytes,omitempty"`
}

// PeerTLS are PEM files mounted from a Secret.
type PeerTLS struct {
	CertFile string `json:"certFile"`
	KeyFile  string `json:"keyFile"`
	CAFile   string `json:"caFile"`
}

// Defaults and bounds of the response-owner map (responses.maxOwners, responses.ownerTTL).
const (
	DefaultResponseOwners   = 100_000
	DefaultResponseOwnerTTL = 24 * time.Hour
	// MaxResponseOwners bounds responses.maxOwners: an entry is an id and an engine name,
	// about 200 bytes, so the bound stays near 2 GB.
	MaxResponseOwners = 10_000_000
)

// Responses is the map from stored Responses answers (store: true) to the engine that holds
// them, which pins a follow-up's previous_response_id there. An id past either bound is
// dropped (counted in response_owner_evictions_total) and, when named again, looked up on the
// engines.
type Responses struct {
	// MaxOwners is how many ids are remembered (100,000), least recently used dropped first.
	MaxOwners int `json:"maxOwners,omitempty"`
	// OwnerTTL is how long an id is remembered after it was learnt (24h); vLLM keeps a stored
	// response in its process memory for as long as the process runs.
	OwnerTTL metav1.Duration `json:"ownerTTL,omitempty"`
}

// ResponseOwnerBounds are the response-owner map's size and TTL, defaults filled in.
func (c *Config) ResponseOwnerBounds() (int, time.Duration) {
	n, ttl := DefaultResponseOwners, DefaultResponseOwnerTTL
	if r := c.Responses; r != nil {
		if r.MaxOwners > 0 {
			n = r.MaxOwners
		}
		if r.OwnerTTL.Duration > 0 {
			ttl = r.OwnerTTL.Duration
		}
	}
	return n, ttl
}

// Capture bounds the trace capture: files of at most MaxBytes in Dir, Files of them kept.
type Capture struct {
	Enabled bool   `json:"enabled"`
	Dir     string `json:"dir"`
	// MaxBytes per file (0: 64 MiB); Files kept, the one being written included (0: 4).
	MaxBytes int64 `json:"maxBytes,omitempty"`
	Files    int   `json:"files,omitempty"`
}

// Audit configures the prompt audit.
type Audit struct {
	Enabled bool `json:"enabled"`
	// SampleEvery audits one request in this many (0: 8).
	SampleEvery int `json:"sampleEvery,omitempty"`
	// ShowText lets /debug/audit (admin port only) show the detokenized text of a varying
	// span; off, it shows the span's shape only (e.g. <timestamp>).
	ShowText bool `json:"showText,omitempty"`
}

// MinCaptureBytes is the smallest capture.maxBytes: a file must hold a long prompt's line.
// DefaultCaptureMaxBytes and DefaultCaptureFiles are router/capture's defaults, for the
// operator to size the capture volume with.
const (
	MinCaptureBytes        = 64 << 10
	DefaultCaptureMaxBytes = 64 << 20
	DefaultCaptureFiles    = 4
)

// EngineAuth is where kvrouter reads its credential for engines started with vLLM's
// --api-key (or VLLM_API_KEY). The key itself is never in the file or on the command line
// (where `ps` and the pod spec show it): it comes from an environment variable (the operator
// fills one from spec.engine.apiKeySecretRef) or a file (a mounted Secret). Set exactly one.
type EngineAuth struct {
	// APIKeyEnv names the environment variable that holds the key.
	APIKeyEnv string `json:"apiKeyEnv,omitempty"`
	// APIKeyFile is a file holding the key; surrounding whitespace (a trailing newline) is
	// dropped.
	APIKeyFile string `json:"apiKeyFile,omitempty"`
}

// Key reads the key from where a says. A named source that is unset, empty or unreadable is
// an error: a router that silently ran without its key would fail every engine call.
func (a EngineAuth) Key() (string, error) {
	var key string
	switch {
	case a.APIKeyEnv != "":
		v, ok := os.LookupEnv(a.APIKeyEnv)
		if !ok {
			return "", fmt.Errorf("engineAuth.apiKeyEnv: environment variable %s is not set", a.APIKeyEnv)
		}
		key = strings.TrimSpace(v)
		if key == "" {
			return "", fmt.Errorf("engineAuth.apiKeyEnv: environment variable %s is empty", a.APIKeyEnv)
		}
	case a.APIKeyFile != "":
		b, err := os.ReadFile(a.APIKeyFile)
		if err != nil {
			return "", fmt.Errorf("engineAuth.apiKeyFile: %w", err)
		}
		key = strings.TrimSpace(string(b))
		if key == "" {
			return "", fmt.Errorf("engineAuth.apiKeyFile: %s is empty", a.APIKeyFile)
		}
	default:
		return "", errors.New("engineAuth: set apiKeyEnv or apiKeyFile")
	}
	// A header value cannot hold line breaks; vLLM compares the whole text after "Bearer ".
	if strings.ContainsAny(key, "\r\n") {
		return "", errors.New("engineAuth: the key spans several lines")
	}
	return key, nil
}

// Report names the KVRoutedModel a router reports index health to.
type Report struct {
	Namespace     string `json:"namespace"`
	KVRoutedModel string `json:"kvRoutedModel"`
}

// KVCacheReportModes are the values kvCacheReportMode accepts.
var KVCacheReportModes = []string{"", "full"}

// Hash mirrors vLLM's --prefix-caching-hash-algo and PYTHONHASHSEED.
type Hash struct {
	Algo string `json:"algo"`
	Seed string `json:"seed"`
}

// Engine is one statically configured vLLM replica.
type Engine struct {
	Name string `json:"name"`
	// URL of its HTTP API, e.g. http://10.0.0.5:8000.
	URL string `json:"url"`
	// Events are the PUB endpoints, one per DP rank, rank order.
	Events []string `json:"events,omitempty"`
	// Replay are the replay (ROUTER) endpoints, one per DP rank, or none.
	Replay []string `json:"replay,omitempty"`
	// WarmupUntil gives the replica warm-up credit until then.
	WarmupUntil *metav1.Time `json:"warmupUntil,omitempty"`
	// Kind is the engine's family; empty is the router's engineKind, anything else must equal it.
	Kind string `json:"kind,omitempty"`
}

// ListenOff as Listen runs the router as an endpoint picker only: no OpenAI API listener.
const ListenOff = "off"

// ExtProc is the endpoint picker's gRPC listener (Envoy ext_proc and the gRPC health services).
type ExtProc struct {
	// Listen is the gRPC address (host:port), e.g. :9002.
	Listen string `json:"listen"`
	// ConformanceHooks honours the Inference Extension conformance suite's
	// test-epp-endpoint-selection header and echoes x-conformance-test-served-endpoint. For
	// conformance runs only: a client could steer its own requests.
	ConformanceHooks bool `json:"conformanceHooks,omitempty"`
	// TLS serves the listener over TLS, as gateways dial the Inference Extension's own picker
	// (unset: plaintext gRPC).
	TLS *ExtProcTLS `json:"tls,omitempty"`
}

// ExtProcTLS is the endpoint picker's certificate.
type ExtProcTLS struct {
	// CertDir holds tls.crt and tls.key (a mounted kubernetes.io/tls Secret, e.g. cert-manager's),
	// read again when they change. Empty: a self-signed certificate made at start.
	CertDir string `json:"certDir,omitempty"`
}

// Discovery selects one engine source.
type Discovery struct {
	Kubernetes *KubernetesDiscovery `json:"kubernetes,omitempty"`
	// InferencePool follows a Gateway API Inference Extension pool: its selector's pods on its
	// target ports (one per DP rank when it lists several).
	InferencePool *InferencePoolDiscovery `json:"inferencePool,omitempty"`
}

// InferencePoolDiscovery names an InferencePool (inference.networking.k8s.io/v1).
type InferencePoolDiscovery struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// KubernetesDiscovery watches engine pods and reads the contract from their annotations.
type KubernetesDiscovery struct {
	Namespace string `json:"namespace"`
	// Selector is a label selector in kubectl syntax.
	Selector string `json:"selector"`
	// Port is the engines' HTTP port; 0 takes the engine container's port named "http".
	Port int `json:"port"`
	// Annotation names; the defaults are the serving.kvroute.io/ ones the operator writes.
	EventsPortsAnnotation string `json:"eventsPortsAnnotation"`
	ReplayPortsAnnotation string `json:"replayPortsAnnotation"`
	BlockSizeAnnotation   string `json:"blockSizeAnnotation"`
	WarmupUntilAnnotation string `json:"warmupUntilAnnotation"`
}

// Scoring are the cost model's knobs.
type Scoring struct {
	// LoadWeight scales the load term against uncached prefill work.
	LoadWeight float64 `json:"loadWeight"`
	// ImbalanceBound caps a replica's load relative to the fleet mean (>= 1) before cache
	// affinity is overridden.
	ImbalanceBound float64 `json:"imbalanceBound"`
	// Temperature > 0 picks softly among near-best replicas; 0 is argmin.
	Temperature float64 `json:"temperature"`
	// TierWeights are how much a cached block is worth per tier (0..1).
	TierWeights TierWeights `json:"tierWeights"`
}

// TierWeights weigh a cache hit by where the block lives.
type TierWeights struct {
	GPU  float64 `json:"gpu"`
	CPU  float64 `json:"cpu"`
	Disk float64 `json:"disk"`
}

// Warmup is the credit given to newly Ready replicas.
type Warmup struct {
	Duration metav1.Duration `json:"duration"`
	// Credit is the share (0..1) of a request's prompt blocks credited at Ready.
	Credit float64 `json:"credit"`
}

// Events configures the subscribers.
type Events struct {
	// Enabled false: the engines publish nothing, so every replica is scored approximately.
	Enabled bool `json:"enabled"`
	// TopicPrefix: topics are <prefix>@<host>@<model>.
	TopicPrefix string `json:"topicPrefix"`
	// HWM is the SUB socket's receive high-water mark (0 = unlimited).
	HWM int `json:"hwm"`
	// Replay asks the engines' replay sockets for missed batches.
	Replay bool `json:"replay"`
	// Bind, when set (tcp://HOST:PORT), is bound mode: the router binds one SUB there and the
	// engines dial in (vLLM's kv-events endpoint naming the router), their streams told apart
	// by topic. For engines the router cannot dial, with one router replica. --events-bind
	// overrides it.
	Bind string `json:"bind,omitempty"`
}

// Limits bound what one request may cost the router.
type Limits struct {
	MaxBodyBytes int64 `json:"maxBodyBytes"`
	// ConnectTimeout bounds dialling an engine (5s).
	ConnectTimeout metav1.Duration `json:"connectTimeout"`
	// HeaderReadTimeout bounds reading a client's request line and headers (10s).
	HeaderReadTimeout metav1.Duration `json:"headerReadTimeout"`
	// BodyReadTimeout bounds reading a client's request body, from its headers on (30s).
	BodyReadTimeout metav1.Duration `json:"bodyReadTimeout"`
	// FirstTokenTimeout bounds one attempt's wait for a stream's first token (10m: a long
	// prefill behind a queue is legitimate); past it the attempt is retried elsewhere. This is
	// the failover window: nothing reaches the client before the first token.
	FirstTokenTimeout metav1.Duration `json:"firstTokenTimeout"`
	// FirstByteTimeout is the old name of FirstTokenTimeout, still read: it sets
	// FirstTokenTimeout when that key is left at its default.
	FirstByteTimeout *metav1.Duration `json:"firstByteTimeout,omitempty"`
	// IdleTimeout cuts a stream silent for this long after its first token (5m).
	IdleTimeout metav1.Duration `json:"idleTimeout"`
	// RequestTimeout bounds a whole request, tokenization to the last byte (30m).
	RequestTimeout metav1.Duration `json:"requestTimeout"`
}

// MaxHoldWaiting bounds hold.maxWaiting: each held request is a client connection and its body.
const MaxHoldWaiting = 65536

// Hold is the queue of generation requests that found no ready replica (a model scaled to
// zero, or every replica restarting): they wait, in arrival order, for one to become ready.
type Hold struct {
	// MaxWaiting is how many may wait at once (128); 0 answers 503 at once, as without a hold.
	MaxWaiting int `json:"maxWaiting"`
	// MaxWait is how long one may wait (30s: a replica restarting; a model at zero replicas
	// needs its cold start, minutes: the operator sets 5m then); past it, 503 with Retry-After.
	MaxWait metav1.Duration `json:"maxWait"`
}

// Shutdown is the graceful stop on SIGTERM (a pod deleted, a rolling update).
type Shutdown struct {
	// DrainDelay is how long the router keeps accepting requests after SIGTERM with /readyz
	// answering 503 (0s). In Kubernetes the pod leaves the Service's endpoints only after the
	// endpoint change reaches every node's proxy, a second or more after SIGTERM; a router
	// that closed its listener at once would refuse the connections sent meanwhile. During the
	// delay every answer carries Connection: close, so clients' pooled connections close after
	// their next answer and reconnect through the Service to another router. The operator
	// renders 5s.
	DrainDelay metav1.Duration `json:"drainDelay"`
	// Timeout bounds the wait for the requests in flight once the listener is closed (20s);
	// a stream still running then is cut. DrainDelay + Timeout should stay under the pod's
	// terminationGracePeriodSeconds (30 as the operator renders it).
	Timeout metav1.Duration `json:"timeout"`
}

// Policies are the names policy and shadowPolicy accept: score's one list of production policies
// (least-loaded is an alias of load). kvbench's router offers more (ValidatePolicies).
var Policies = score.ProductionPolicies

// HashAlgos are vLLM's --prefix-caching-hash-algo values.
var HashAlgos = []string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"}

// Default annotation names: the operator's contract on engine pods, named once in the API
// package that the operator writes them from.
const (
	DefaultEventsPortsAnnotation   = v1alpha1.AnnotationKVEvents
	DefaultReplayPortsAnnotation   = v1alpha1.AnnotationKVReplay
	DefaultSnapshotPortsAnnotation = v1alpha1.AnnotationKVSnapshot
	DefaultBlockSizeAnnotation     = v1alpha1.AnnotationBlock
	DefaultWarmupUntilAnnotation   = v1alpha1.AnnotationWarmup
	// TopicAnnotation, when present, is the engine's KV-event topic as published, in place of
	// <prefix>@<pod IP>@<model> (a TensorRT-LLM pod's config is shared by every pod).
	TopicAnnotation = v1alpha1.AnnotationKVTopic
	// DefaultRoleLabel is the engine pod label naming its pool in a disaggregated model
	// (RolePrefill or RoleDecode); absent on an aggregated engine.
	DefaultRoleLabel = v1alpha1.LabelRole
)

// An engine's pool in a disaggregated model (the value of DefaultRoleLabel).
const (
	RolePrefill = v1alpha1.RolePrefill
	RoleDecode  = v1alpha1.RoleDecode
)

// Default returns the configuration used for every key a file leaves out.
func Default() Config {
	return Config{
		Listen:      ":8000",
		AdminListen: "127.0.0.1:9090",
		Policy:      "kv",
		BlockSize:   0,
		Hash:        Hash{Algo: "sha256", Seed: "0"},
		Scoring: Scoring{
			LoadWeight:     1,
			ImbalanceBound: 1.2, // score.DefaultKV.Slack + 1, what the fleet model measures
			Temperature:    0,
			TierWeights:    TierWeights{GPU: 1, CPU: 0.5, Disk: 0.25},
		},
		Warmup: Warmup{Duration: metav1.Duration{Duration: 2 * time.Minute}, Credit: 0.5},
		Events: Events{Enabled: true, TopicPrefix: "kv", HWM: 100000, Replay: true},
		Limits: Limits{
			MaxBodyBytes:      16 << 20,
			ConnectTimeout:    metav1.Duration{Duration: 5 * time.Second},
			HeaderReadTimeout: metav1.Duration{Duration: 10 * time.Second},
			BodyReadTimeout:   metav1.Duration{Duration: 30 * time.Second},
			FirstTokenTimeout: metav1.Duration{Duration: 10 * time.Minute},
			IdleTimeout:       metav1.Duration{Duration: 5 * time.Minute},
			RequestTimeout:    metav1.Duration{Duration: 30 * time.Minute},
		},
		Hold:     Hold{MaxWaiting: 128, MaxWait: metav1.Duration{Duration: 30 * time.Second}},
		Shutdown: Shutdown{Timeout: metav1.Duration{Duration: 20 * time.Second}},
	}
}

// DefaultKubernetesDiscovery fills the annotation names.
func DefaultKubernetesDiscovery(namespace, selector string, port int) *KubernetesDiscovery {
	return &KubernetesDiscovery{
		Namespace: namespace, Selector: selector, Port: port,
		EventsPortsAnnotation: DefaultEventsPortsAnnotation,
		ReplayPortsAnnotation: DefaultReplayPortsAnnotation,
		BlockSizeAnnotation:   DefaultBlockSizeAnnotation,
		WarmupUntilAnnotation: DefaultWarmupUntilAnnotation,
	}
}

// Parse decodes YAML (or JSON) over Default(), strictly, and validates the result.
func Parse(data []byte) (Config, error) {
	c := Default()
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return Config{}, fmt.Errorf("router config: %w", err)
	}
	// sigs.k8s.io/json names the full path of an unknown key (scoring.loadWieght) and
	// matches keys case-sensitively, unlike encoding/json.
	strictErrs, err := sigsjson.UnmarshalStrict(js, &c)
	if err != nil {
		return Config{}, fmt.Errorf("router config: %w", err)
	}
	if len(strictErrs) > 0 {
		return Config{}, fmt.Errorf("router config: %w", errors.Join(strictErrs...))
	}
	if d := c.Discovery; d != nil && d.Kubernetes != nil {
		k := d.Kubernetes
		def := DefaultKubernetesDiscovery(k.Namespace, k.Selector, k.Port)
		fill(&k.EventsPortsAnnotation, def.EventsPortsAnnotation)
		fill(&k.ReplayPortsAnnotation, def.ReplayPortsAnnotation)
		fill(&k.BlockSizeAnnotation, def.BlockSizeAnnotation)
		fill(&k.WarmupUntilAnnotation, def.WarmupUntilAnnotation)
	}
	if fb := c.Limits.FirstByteTimeout; fb != nil {
		if c.Limits.FirstTokenTimeout == Default().Limits.FirstTokenTimeout {
			c.Limits.FirstTokenTimeout = *fb
		}
		c.Limits.FirstByteTimeout = nil
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func fill(s *string, def string) {
	if *s == "" {
		*s = def
	}
}

// Load reads and parses a file.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("router config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Marshal renders the configuration as YAML (what the operator writes into the ConfigMap).
func (c Config) Marshal() ([]byte, error) {
	return yaml.Marshal(c)
}

// Validate reports every problem, each prefixed by the key it concerns; policy and
// shadowPolicy must be production policies (Policies).
func (c Config) Validate() error { return c.ValidatePolicies(Policies) }

// Disaggregation tunes a fleet with prefill and decode replicas.
type Disaggregation struct {
	// MinUncachedTokens is conditional disaggregation's threshold: a request whose decode pick
	// would leave fewer uncached prompt tokens than this goes whole to the decode replica. 0:
	// the router's default (1000; docs/disaggregation.md has the measurement); -1: split every
	// request.
	MinUncachedTokens int `json:"minUncachedTokens,omitempty"`
}

// ValidatePolicies is Validate for a binary that offers the given policies (kvbench's router
// registers the benchmark ones beside the production ones).
func (c Config) ValidatePolicies(policies []string) error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, a...)))
	}
	checkAddr := func(key, addr string) {
		if _, port, err := net.SplitHostPort(addr); err != nil {
			bad(key, "%q is not host:port (%v)", addr, err)
		} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			bad(key, "%q has no valid port", addr)
		}
	}
	if c.Listen == ListenOff {
		if c.ExtProc == nil {
			bad("listen", "\"off\" serves no API: it needs extProc.listen (--ext-proc-listen), or the router serves nothing")
		}
	} else {
		checkAddr("listen", c.Listen)
	}
	if d := c.Disaggregation; d != nil && d.MinUncachedTokens < -1 {
		n := d.MinUncachedTokens
		bad("disaggregation.minUncachedTokens", "%d is below -1 (-1 splits every request, 0 takes the default)", n)
	}
	if !slices.Contains(KVCacheReportModes, c.KVCacheReportMode) {
		bad("kvCacheReportMode", "%q is not \"full\" or empty", c.KVCacheReportMode)
	}
	if c.RenderURL != "" {
		if u, err := url.Parse(c.RenderURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("renderURL", "%q is not an http(s)://host:port URL", c.RenderURL)
		}
	}
	if c.RenderURL != "" {
		if u, err := url.Parse(c.RenderURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("renderURL", "%q is not an http(s)://host:port URL", c.RenderURL)
		}
	}
	if r := c.Responses; r != nil {
		if r.MaxOwners < 0 || r.MaxOwners > MaxResponseOwners {
			bad("responses.maxOwners", "%d must be between 1 and %d (0 or absent: %d)", r.MaxOwners, MaxResponseOwners, DefaultResponseOwners)
		}
		if r.OwnerTTL.Duration < 0 {
			bad("responses.ownerTTL", "%v must be > 0 (0 or absent: %v)", r.OwnerTTL.Duration, DefaultResponseOwnerTTL)
		}
	}
	if cp := c.Capture; cp != nil && cp.Enabled {
		if cp.Dir == "" {
			bad("capture.dir", "required when capture is enabled")
		}
		if cp.MaxBytes != 0 && cp.MaxBytes < MinCaptureBytes {
			bad("capture.maxBytes", "%d is below %d", cp.MaxBytes, MinCaptureBytes)
		}
		if cp.Files < 0 || cp.Files > 1000 {
			bad("capture.files", "%d is out of range 0..1000", cp.Files)
		}
	}
	if c.ShadowPolicy != "" && !slices.Contains(policies, c.ShadowPolicy) {
		bad("shadowPolicy", "%q is not one of %v", c.ShadowPolicy, policies)
	}
	if a := c.Audit; a != nil && (a.SampleEvery < 0 || a.SampleEvery > 1<<20) {
		bad("audit.sampleEvery", "%d is out of range 0..%d", a.SampleEvery, 1<<20)
	}
	if r := c.Report; r != nil && (r.Namespace == "" || r.KVRoutedModel == "") {
		bad("report", "needs both namespace and kvRoutedModel")
	}
	checkAddr("adminListen", c.AdminListen)
	if !slices.Contains(policies, c.Policy) {
		bad("policy", "%q is not one of %v", c.Policy, policies)
	}
	if c.BlockSize < 0 || c.BlockSize > blockkey.MaxBlockSize {
		bad("blockSize", "%d is out of range 0..%d (0 learns it from the events)", c.BlockSize, blockkey.MaxBlockSize)
	}
	if !slices.Contains(HashAlgos, c.Hash.Algo) {
		bad("hash.algo", "%q is not one of %v", c.Hash.Algo, HashAlgos)
	}
	if v, err := strconv.ParseUint(c.Hash.Seed, 10, 32); err != nil || strconv.FormatUint(v, 10) != c.Hash.Seed {
		bad("hash.seed", "%q is not a decimal integer 0..4294967295 (PYTHONHASHSEED)", c.Hash.Seed)
	}
	fleetKind, kerr := engine.Parse(c.EngineKind)
	if kerr != nil {
		bad("engineKind", "%v", kerr)
	} else if c.KVCacheReportMode != "" && !fleetKind.Profile().ReportMode {
		bad("kvCacheReportMode", "%q needs vLLM engines; %s engines have no report modes", c.KVCacheReportMode, fleetKind)
	}
	seen := map[string]bool{}
	for i, e := range c.Engines {
		key := fmt.Sprintf("engines[%d]", i)
		if k, err := engine.Parse(e.Kind); err != nil {
			bad(key+".kind", "%v", err)
		} else if kerr == nil && e.Kind != "" && k != fleetKind {
			bad(key+".kind", "%s differs from engineKind %s: a fleet mixing engine kinds is refused", k, fleetKind)
		}
		if e.Name == "" {
			bad(key+".name", "required")
		} else if seen[e.Name] {
			bad(key+".name", "%q is listed twice", e.Name)
		}
		seen[e.Name] = true
		if u, err := url.Parse(e.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad(key+".url", "%q is not an http(s) URL with a host", e.URL)
		}
		for r, ep := range e.Events {
			checkZMQ(bad, fmt.Sprintf("%s.events[%d]", key, r), ep)
		}
		for r, ep := range e.Replay {
			checkZMQ(bad, fmt.Sprintf("%s.replay[%d]", key, r), ep)
		}
		// Replay alone is bound mode's shape (events.bind): the events arrive on the router's
		// socket, replay is still asked of each engine.
		if len(e.Replay) > 0 && len(e.Events) > 0 && len(e.Replay) != len(e.Events) {
			bad(key+".replay", "has %d endpoints but events has %d: give one per DP rank or none", len(e.Replay), len(e.Events))
		}
	}
	if d := c.Discovery; d != nil {
		if len(c.Engines) > 0 {
			bad("discovery", "set either engines or discovery, not both")
		}
		if d.InferencePool != nil {
			if d.Kubernetes != nil {
				bad("discovery", "set either kubernetes or inferencePool, not both")
			}
			if d.InferencePool.Namespace == "" || d.InferencePool.Name == "" {
				bad("discovery.inferencePool", "namespace and name are both required")
			}
		} else if d.Kubernetes == nil {
			bad("discovery", "names no source (kubernetes or inferencePool)")
		} else {
			k := d.Kubernetes
			if k.Namespace == "" {
				bad("discovery.kubernetes.namespace", "required")
			}
			if k.Selector == "" {
				bad("discovery.kubernetes.selector", "required (an empty selector would match every pod)")
			}
			if k.Port < 0 || k.Port > 65535 {
				bad("discovery.kubernetes.port", "%d is out of range 0..65535 (0: the engine container's port named http)", k.Port)
			}
		}
	}
	if x := c.ExtProc; x != nil && x.Listen == "" {
		bad("extProc.listen", "required (host:port of the endpoint picker's gRPC listener, e.g. :9002)")
	}
	s := c.Scoring
	if s.LoadWeight < 0 {
		bad("scoring.loadWeight", "%v must be >= 0", s.LoadWeight)
	}
	if s.ImbalanceBound < 1 {
		bad("scoring.imbalanceBound", "%v must be >= 1 (a ratio to the fleet mean)", s.ImbalanceBound)
	}
	if s.Temperature < 0 {
		bad("scoring.temperature", "%v must be >= 0", s.Temperature)
	}
	for _, w := range []struct {
		key string
		v   float64
	}{{"gpu", s.TierWeights.GPU}, {"cpu", s.TierWeights.CPU}, {"disk", s.TierWeights.Disk}} {
		if w.v < 0 || w.v > 1 {
			bad("scoring.tierWeights."+w.key, "%v is out of range 0..1", w.v)
		}
	}
	if c.Warmup.Duration.Duration < 0 {
		bad("warmup.duration", "%v must be >= 0", c.Warmup.Duration.Duration)
	}
	if c.Warmup.Credit < 0 || c.Warmup.Credit > 1 {
		bad("warmup.credit", "%v is out of range 0..1", c.Warmup.Credit)
	}
	if c.Events.HWM < 0 {
		bad("events.hwm", "%d must be >= 0", c.Events.HWM)
	}
	if c.Events.Bind != "" {
		checkZMQ(bad, "events.bind", c.Events.Bind)
	}
	if c.Limits.MaxBodyBytes <= 0 {
		bad("limits.maxBodyBytes", "%d must be > 0", c.Limits.MaxBodyBytes)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"connectTimeout", c.Limits.ConnectTimeout.Duration}, {"headerReadTimeout", c.Limits.HeaderReadTimeout.Duration},
		{"bodyReadTimeout", c.Limits.BodyReadTimeout.Duration}, {"firstTokenTimeout", c.Limits.FirstTokenTimeout.Duration},
		{"idleTimeout", c.Limits.IdleTimeout.Duration}, {"requestTimeout", c.Limits.RequestTimeout.Duration}} {
		if d.v <= 0 {
			bad("limits."+d.key, "%v must be > 0", d.v)
		}
	}
	if c.Shutdown.DrainDelay.Duration < 0 || c.Shutdown.Timeout.Duration < 0 {
		bad("shutdown", "drainDelay %v and timeout %v must be >= 0", c.Shutdown.DrainDelay.Duration, c.Shutdown.Timeout.Duration)
	}
	if c.Hold.MaxWaiting < 0 || c.Hold.MaxWaiting > MaxHoldWaiting {
		bad("hold.maxWaiting", "%d must be between 0 and %d", c.Hold.MaxWaiting, MaxHoldWaiting)
	}
	if c.Hold.MaxWaiting > 0 && c.Hold.MaxWait.Duration <= 0 {
		bad("hold.maxWait", "%v must be > 0 while hold.maxWaiting is %d", c.Hold.MaxWait.Duration, c.Hold.MaxWaiting)
	}
	if a := c.EngineAuth; a != nil {
		switch {
		case (a.APIKeyEnv == "") == (a.APIKeyFile == ""):
			bad("engineAuth", "set exactly one of apiKeyEnv and apiKeyFile")
		case a.APIKeyEnv != "" && !envName.MatchString(a.APIKeyEnv):
			bad("engineAuth.apiKeyEnv", "%q is not an environment variable name", a.APIKeyEnv)
		}
	}
	if p := c.Peers; p != nil {
		if p.URL == "" && p.ClusterListen == "" && len(p.Routes) > 0 {
			bad("peers.routes", "need peers.clusterListen (the embedded server's route port)")
		}
		if p.URL != "" && (p.ClusterListen != "" || len(p.Routes) > 0) {
			bad("peers.url", "an external NATS server excludes clusterListen and routes")
		}
		if p.ClusterListen != "" {
			checkAddr("peers.clusterListen", p.ClusterListen)
		}
		if t := p.TLS; t != nil && (t.CertFile == "" || t.KeyFile == "" || t.CAFile == "") {
			bad("peers.tls", "needs certFile, keyFile and caFile")
		}
		if p.PeerTimeout.Duration < 0 || p.ReadyTimeout.Duration < 0 || p.MaxSnapshotBytes < 0 {
			bad("peers", "timeouts and maxSnapshotBytes must be >= 0")
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("router config invalid: %w", err)
	}
	return nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func checkZMQ(bad func(string, string, ...any), key, ep string) {
	u, err := url.Parse(ep)
	if err != nil || u.Scheme != "tcp" || u.Port() == "" {
		bad(key, "%q is not a tcp://host:port endpoint", ep)
	}
}
