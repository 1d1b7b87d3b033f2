package v1alpha1

// Condition types on KVRoutedModel status. Ready is the summary that `kubectl wait
// --for=condition=Ready` and kstatus read; the other three say why.
const (
	ConditionReady       = "Ready"
	ConditionAvailable   = "Available"
	ConditionProgressing = "Progressing"
	ConditionDegraded    = "Degraded"
	// ConditionIndexHealthy says whether the routers trust every engine replica's index
	// (from status.routerReports). It does not affect Ready: routing goes on by load.
	ConditionIndexHealthy = "IndexHealthy"
)

// Condition reasons. CamelCase, as metav1.Condition requires.
const (
	ReasonReconciled           = "Reconciled"
	ReasonSuspended            = "Suspended"
	ReasonRollingOut           = "RollingOut"
	ReasonScaling              = "Scaling"
	ReasonWarmingUp            = "WarmingUp"
	ReasonMinimumReplicasReady = "MinimumReplicasReady"
	ReasonNoReplicasReady      = "NoReplicasReady"
	// ReasonRequestsHeld is Available's reason (False) while no engine replica is Ready and the
	// routers hold requests until one is (status.router.heldRequests).
	ReasonRequestsHeld = "RequestsHeld"
	// ReasonScaledFromZero is the reason of the Normal event the operator records when it
	// scales a model at zero replicas to one because its routers hold requests.
	ReasonScaledFromZero        = "ScaledFromZero"
	ReasonRouterNotReady        = "RouterNotReady"
	ReasonApplyFailed           = "ApplyFailed"
	ReasonInvalidSpec           = "InvalidSpec"
	ReasonProgressDeadline      = "ProgressDeadlineExceeded"
	ReasonKEDANotInstalled      = "KEDANotInstalled"
	ReasonMetricsAPIUnavailable = "MetricsAPIUnavailable"
	// ReasonInferencePoolCRDMissing: spec.router.mode is EndpointPicker but the API server
	// serves no InferencePool (inference.networking.k8s.io/v1); Degraded until it appears.
	ReasonInferencePoolCRDMissing = "InferencePoolCRDMissing"
	ReasonAsExpected              = "AsExpected"
	// IndexHealthy reasons. IndexUnhealthy is also Degraded's reason when a replica's keys may
	// be wrong (undecodable, unchained, hash-mismatch, keys-wrong).
	ReasonIndexHealthy   = "IndexHealthy"
	ReasonIndexUnhealthy = "IndexUnhealthy"
	ReasonNoRouterReport = "NoRouterReport"
)

// Labels and annotations shared by the operator, the router's discovery and the tests.
const (
	LabelPartOf    = "app.kubernetes.io/part-of"
	LabelComponent = "app.kubernetes.io/component"
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// LabelModel carries the KVRoutedModel's metadata.name (not spec.model.name: two
	// resources may serve the same model name, and each router must see only its own pods).
	LabelModel = "serving.kvroute.io/model"

	PartOfValue     = "kvroute"
	ManagedByValue  = "kvroute-operator"
	ComponentEngine = "engine"
	ComponentRouter = "router"
	// ComponentPrefill labels the prefill pool's pods (spec.disaggregation); the decode pool
	// keeps ComponentEngine, so the engine Deployment's selector and /scale stay as they are.
	ComponentPrefill = "prefill"
	// LabelRole is an engine pod's pool with spec.disaggregation: RolePrefill or RoleDecode.
	// The router's discovery reads it.
	LabelRole          = "serving.kvroute.io/role"
	RolePrefill        = "prefill"
	RoleDecode         = "decode"
	EngineAppName      = "vllm"
	RouterAppName      = "kvrouter"
	AnnotationPrefix   = "serving.kvroute.io/"
	AnnotationKVEvents = "serving.kvroute.io/kv-events-ports"
	AnnotationKVReplay = "serving.kvroute.io/kv-replay-ports"
	// AnnotationKVSnapshot is read by the router; the operator does not write it yet.
	AnnotationKVSnapshot = "serving.kvroute.io/kv-snapshot-ports"
	AnnotationBlock      = "serving.kvroute.io/block-size"
	// AnnotationEngineKind is spec.engine.kind on engine pods other than vLLM's.
	AnnotationEngineKind = "serving.kvroute.io/engine-kind"
	// AnnotationMetricsPath is the engine's Prometheus path where it is not /metrics.
	AnnotationMetricsPath = "serving.kvroute.io/metrics-path"
	AnnotationWarmup      = "serving.kvroute.io/warmup-until"
	// AnnotationKVTopic is the KV-event topic of an engine whose topic is not
	// <prefix>@<pod IP>@<model> (TensorRT-LLM's, written in a config shared by every pod).
	AnnotationKVTopic = "serving.kvroute.io/kv-events-topic"
	// AnnotationEngineConfig holds the config file an engine reads at start (TensorRT-LLM's
	// --config YAML); the kubelet projects it into the container through a downward API volume.
	AnnotationEngineConfig = "serving.kvroute.io/engine-config"
	// AnnotationConfigChecksum on the router pod template rolls the router when its ConfigMap changes.
	AnnotationConfigChecksum = "serving.kvroute.io/config-checksum"
)
