package v1alpha1

import (
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KVRoutedModel runs a fleet of vLLM replicas with KV-cache events switched on, and the
// KV-cache-aware router in front of them.
//
// Validation lives in the schema (OpenAPI + CEL) so kubectl, OLM, Argo CD and the offline
// `kvroutectl render` all reject the same resources without a webhook.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=kvrm,categories=llm
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Warming",type=integer,JSONPath=`.status.warmingReplicas`
// +kubebuilder:printcolumn:name="Index",type=string,JSONPath=`.status.conditions[?(@.type=="IndexHealthy")].reason`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.router.endpoint`
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.model.name`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule=`self.metadata.name.size() <= 50 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')`,message="metadata.name must be a DNS-1035 label (lowercase letters, digits, '-', starting with a letter) of at most 50 characters: child Services are named <name>-engine and <name>-router"
type KVRoutedModel struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec KVRoutedModelSpec `json:"spec"`
	// +optional
	Status KVRoutedModelStatus `json:"status,omitempty"`
}

// KVRoutedModelList is a list of KVRoutedModel.
// +kubebuilder:object:root=true
type KVRoutedModelList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KVRoutedModel `json:"items"`
}

// KVRoutedModelSpec is the desired state. Pointer fields are those where the zero value is a
// meaningful setting distinct from the default (replicas 0, replay port 0, enabled false, ...).
// The EnginesConnect rules start with has() guards for the same reason as EngineSpec's: the
// apiserver also checks them against the bare `{}` defaults.
// +kubebuilder:validation:XValidation:rule=`!(has(self.engine) && has(self.engine.kvEvents) && has(self.engine.kvEvents.mode) && self.engine.kvEvents.mode == 'EnginesConnect') || !has(self.router) || !has(self.router.replicas) || self.router.replicas <= 1`,messageExpression=`'spec.router.replicas is %d but must be 0 or 1 with spec.engine.kvEvents.mode EnginesConnect: each engine sends its events to one router (use RouterConnects to run several)'.format([self.router.replicas])`,fieldPath=".router.replicas"
// +kubebuilder:validation:XValidation:rule=`!(has(self.engine) && has(self.engine.kvEvents) && has(self.engine.kvEvents.mode) && self.engine.kvEvents.mode == 'EnginesConnect') || !has(self.engine.parallelism) || !has(self.engine.parallelism.dataLocal) || self.engine.parallelism.dataLocal == 1`,messageExpression=`'spec.engine.parallelism.dataLocal is %d but must be 1 with spec.engine.kvEvents.mode EnginesConnect: kvrouter binds one events socket, and vLLM sends each DP rank to its own port (use RouterConnects for several DP ranks per pod)'.format([self.engine.parallelism.dataLocal])`,fieldPath=".engine.parallelism.dataLocal"
// +kubebuilder:validation:XValidation:rule=`!(has(self.engine) && has(self.engine.kvEvents) && has(self.engine.kvEvents.mode) && self.engine.kvEvents.mode == 'EnginesConnect') || !has(self.engine.kvEvents.basePort) || (self.engine.kvEvents.basePort != 8000 && self.engine.kvEvents.basePort != 9090)`,message="spec.engine.kvEvents.basePort must not be 8000 or 9090 with spec.engine.kvEvents.mode EnginesConnect: the router binds it beside its API (8000) and metrics (9090) ports",fieldPath=".engine.kvEvents.basePort"
// +kubebuilder:validation:XValidation:rule=`!has(self.model.cache) || !has(self.model.cache.accessMode) || self.model.cache.accessMode == 'ReadWriteMany' || !has(self.replicas) || self.replicas <= 1`,messageExpression=`'spec.replicas is %d but spec.model.cache.accessMode %s attaches the cache to one node, so only one engine pod can use it: set spec.replicas to 1 or 0, or use a ReadWriteMany claim (spec.model.cache.accessMode: ReadWriteMany)'.format([self.replicas, self.model.cache.accessMode])`,fieldPath=".replicas"
// +kubebuilder:validation:XValidation:rule=`!has(self.model.cache) || !has(self.model.cache.accessMode) || self.model.cache.accessMode == 'ReadWriteMany' || !has(self.autoscaling) || self.autoscaling.maxReplicas <= 1`,messageExpression=`'spec.autoscaling.maxReplicas is %d but spec.model.cache.accessMode %s attaches the cache to one node, so only one engine pod can use it: set spec.autoscaling.maxReplicas to 1, or use a ReadWriteMany claim (spec.model.cache.accessMode: ReadWriteMany)'.format([self.autoscaling.maxReplicas, self.model.cache.accessMode])`,fieldPath=".autoscaling.maxReplicas"
// +kubebuilder:validation:XValidation:rule=`!has(self.model.cache) || !has(self.engine) || !has(self.engine.env) || self.engine.env.all(e, e.name != 'HF_HOME')`,message="spec.engine.env must not set HF_HOME with spec.model.cache: the cache sets it to the claim's mount",fieldPath=".engine.env"
// +kubebuilder:validation:XValidation:rule=`!has(self.disaggregation) || !has(self.router) || !has(self.router.mode) || self.router.mode != 'EndpointPicker'`,message="spec.router.mode EndpointPicker does not work with spec.disaggregation yet: the picker names the prefill engine to the decode pods' routing sidecar (llm-d's x-prefiller-host-port), which the operator does not render; use spec.router.mode Proxy, or deploy the decode pods' sidecar yourself (docs/disaggregation.md)",fieldPath=".router.mode"
// +kubebuilder:validation:XValidation:rule=`!(has(self.router) && has(self.router.mode) && self.router.mode == 'EndpointPicker') || !(has(self.engine) && has(self.engine.kvEvents) && has(self.engine.kvEvents.mode) && self.engine.kvEvents.mode == 'EnginesConnect') || !has(self.engine.kvEvents.basePort) || self.engine.kvEvents.basePort != 9002`,message="spec.engine.kvEvents.basePort must not be 9002 with spec.engine.kvEvents.mode EnginesConnect and spec.router.mode EndpointPicker: the router serves the picker's gRPC on 9002",fieldPath=".engine.kvEvents.basePort"
// +kubebuilder:validation:XValidation:rule=`!has(self.disaggregation) || !has(self.replicas) || !has(self.disaggregation.prefill.replicas) || (self.replicas == 0) == (self.disaggregation.prefill.replicas == 0)`,messageExpression=`'spec.disaggregation.prefill.replicas is %d and spec.replicas (the decode pool) is %d: a pool of zero beside a non-zero one serves no request (a prefill needs a decoder to hand over to, and the decode pool alone is not disaggregation): scale both to zero, or neither'.format([self.disaggregation.prefill.replicas, self.replicas])`,fieldPath=".disaggregation.prefill.replicas"
// +kubebuilder:validation:XValidation:rule=`!has(self.disaggregation) || !has(self.disaggregation.prefill.parallelism) || self.disaggregation.connector != 'NixlConnector' || self.engine.parallelism.tensor % self.disaggregation.prefill.parallelism.tensor == 0`,messageExpression=`'spec.engine.parallelism.tensor %d (the decode pool) must be a multiple of spec.disaggregation.prefill.parallelism.tensor %d: the NIXL connector of vLLM refuses "Decode TP cannot be smaller than prefill TP"'.format([self.engine.parallelism.tensor, self.disaggregation.prefill.parallelism.tensor])`,fieldPath=".disaggregation.prefill.parallelism.tensor"
// +kubebuilder:validation:XValidation:rule=`!has(self.disaggregation) || !has(self.engine.args) || !self.engine.args.exists(a, a.matches('^--kv[-_]transfer[-_]config([=.].*)?$'))`,message="spec.engine.args must not set --kv-transfer-config with spec.disaggregation: the operator writes it for each pool from spec.disaggregation.connector",fieldPath=".engine.args"
// +kubebuilder:validation:XValidation:rule=`!has(self.disaggregation) || !has(self.engine) || !has(self.engine.kind) || self.engine.kind == 'vllm'`,messageExpression=`'spec.disaggregation needs spec.engine.kind vllm, not %s: only the prefill/decode path of vLLM (its NIXL connector, kv_transfer_params) is supported; remove spec.disaggregation or run kind vllm'.format([self.engine.kind])`,fieldPath=".disaggregation"
type KVRoutedModelSpec struct {
	// Model identity and weights.
	// +required
	Model ModelSpec `json:"model"`

	// Replicas is the number of engine pods. It is the /scale spec path, so HPA or KEDA write
	// it when spec.autoscaling is set; the operator is the only writer of the Deployment.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Suspend stops the operator from changing children; status is still reported.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// Engine configures the engine Deployment (vLLM, SGLang or TensorRT-LLM: spec.engine.kind).
	// +kubebuilder:default={}
	// +optional
	Engine EngineSpec `json:"engine,omitempty"`

	// Router configures the KV-aware router Deployment and Service.
	// +kubebuilder:default={}
	// +optional
	Router RouterSpec `json:"router,omitempty"`

	// NetworkPolicy restricts ingress to the engine pods and to the router pods' admin port.
	// +kubebuilder:default={}
	// +optional
	NetworkPolicy NetworkPolicySpec `json:"networkPolicy,omitempty"`

	// Autoscaling, when set, makes HPA or KEDA scale this resource through /scale.
	// +optional
	Autoscaling *AutoscalingSpec `json:"autoscaling,omitempty"`

	// Disaggregation splits the engines into a prefill pool and a decode pool joined by a vLLM
	// KV connector. The decode pool is the engine Deployment (spec.engine, spec.replicas,
	// spec.autoscaling, /scale); the prefill pool is a Deployment of its own.
	// +optional
	Disaggregation *DisaggregationSpec `json:"disaggregation,omitempty"`
}

// DisaggregationSpec is the prefill/decode split.
// +kubebuilder:validation:XValidation:rule=`self.connector in ['NixlConnector', 'MooncakeConnector', 'MoRIIOConnector', 'LMCacheConnectorV1']`,messageExpression=`'spec.disaggregation.connector %s is not a prefill/decode connector the pinned vLLM ships: use NixlConnector (the default), MooncakeConnector, MoRIIOConnector or LMCacheConnectorV1'.format([self.connector])`,fieldPath=".connector"
// +kubebuilder:validation:XValidation:rule=`!has(self.minUncachedTokens) || self.minUncachedTokens == -1 || (self.minUncachedTokens >= 1 && self.minUncachedTokens <= 1048576)`,messageExpression=`'spec.disaggregation.minUncachedTokens %d: use -1 to split every request, or 1 to 1048576 uncached prompt tokens below which a request goes whole to its decode replica (leave it unset for the router\'s default, 1000)'.format([self.minUncachedTokens])`,fieldPath=".minUncachedTokens"
type DisaggregationSpec struct {
	// Connector is vLLM's kv_connector of both pools (--kv-transfer-config).
	// +kubebuilder:default=NixlConnector
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Connector string `json:"connector,omitempty"`

	// SideChannelPort is VLLM_NIXL_SIDE_CHANNEL_PORT (DP rank r: port + r).
	// +kubebuilder:default=5700
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=65000
	// +optional
	SideChannelPort int32 `json:"sideChannelPort,omitempty"`

	// MinUncachedTokens is conditional disaggregation's threshold, the router's
	// disaggregation.minUncachedTokens: a request whose decode pick leaves fewer uncached prompt
	// tokens than this (a short prompt, or one whose prefix the decode replica holds) goes whole
	// to that decode replica instead of through the prefill pool; -1 splits every request.
	// Unset: the router's default (docs/disaggregation.md has the measurement behind it).
	// +optional
	MinUncachedTokens *int32 `json:"minUncachedTokens,omitempty"`

	// Prefill is the prefill pool: spec.engine with these changes.
	// +kubebuilder:default={}
	// +optional
	Prefill PrefillPoolSpec `json:"prefill,omitempty"`
}

// PrefillPoolSpec is what the prefill pool sets over spec.engine.
type PrefillPoolSpec struct {
	// Resources replace spec.engine.resources.
	// +optional
	Resources *PoolResources `json:"resources,omitempty"`
	// Args are added after spec.engine.args.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	Args []EngineArg `json:"args,omitempty"`
	// Parallelism replaces spec.engine.parallelism.
	// +optional
	Parallelism *ParallelismSpec `json:"parallelism,omitempty"`
	// Replicas of the prefill Deployment, unless Autoscaling owns them.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// Autoscaling is an HPA on the prefill Deployment itself.
	// +optional
	Autoscaling *PoolAutoscaling `json:"autoscaling,omitempty"`
}

// PoolResources are a pool's container resources.
type PoolResources struct {
	// +optional
	Limits corev1.ResourceList `json:"limits,omitempty"`
	// +optional
	Requests corev1.ResourceList `json:"requests,omitempty"`
}

// PoolAutoscaling is a pool's HPA.
type PoolAutoscaling struct {
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinReplicas *int32 `json:"minReplicas,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +required
	MaxReplicas int32 `json:"maxReplicas"`
	// TargetQueuePerReplica: vllm:num_requests_waiting per replica.
	// +kubebuilder:default="4"
	// +optional
	TargetQueuePerReplica *resource.Quantity `json:"targetQueuePerReplica,omitempty"`
}

// ModelSpec names the model and where its weights come from.
// +kubebuilder:validation:XValidation:rule=`!self.uri.startsWith('hf://') || self.uri.matches('^hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9][A-Za-z0-9._/-]*)?$')`,message="spec.model.uri: an hf:// URI must look like hf://org/name or hf://org/name@revision",fieldPath=".uri"
// +kubebuilder:validation:XValidation:rule=`!self.uri.startsWith('pvc://') || self.uri.matches('^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^/]+)*/?$')`,message="spec.model.uri: a pvc:// URI must look like pvc://claim-name/path/in/volume",fieldPath=".uri"
type ModelSpec struct {
	// Name is the served model name (--served-model-name), a DNS-1123 label.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`

	// URI of the weights: hf://org/name[@revision], pvc://claim/path, or a model id or path
	// passed to `vllm serve` as is.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +required
	URI string `json:"uri"`

	// AuthSecretRef selects a Secret key that becomes HF_TOKEN in the engine.
	// +optional
	AuthSecretRef *corev1.SecretKeySelector `json:"authSecretRef,omitempty"`

	// Cache is a PersistentVolumeClaim the engines keep the downloaded weights on (HF_HOME), so
	// a restarted or added replica loads them from the cache instead of downloading them again.
	// Unset: the weights go to the pod's emptyDir and are downloaded at every pod start.
	// +optional
	Cache *ModelCacheSpec `json:"cache,omitempty"`
}

// ModelCacheSpec is the engines' weight cache: an existing claim, or one the operator creates.
// +kubebuilder:validation:XValidation:rule=`has(self.claimName) != has(self.size)`,message="spec.model.cache needs exactly one of claimName (an existing PersistentVolumeClaim) or size (the operator creates <name>-model-cache)"
// +kubebuilder:validation:XValidation:rule=`!has(self.storageClassName) || has(self.size)`,message="spec.model.cache.storageClassName applies only to a claim the operator creates: set spec.model.cache.size, or drop storageClassName for an existing claimName",fieldPath=".storageClassName"
// +kubebuilder:validation:XValidation:rule=`!has(self.claimName) || !has(self.onDelete) || self.onDelete == 'Retain'`,message="spec.model.cache.onDelete must be Retain with claimName: the operator never deletes a claim it did not create",fieldPath=".onDelete"
type ModelCacheSpec struct {
	// ClaimName is an existing PersistentVolumeClaim in the model's namespace. The operator
	// mounts it and never changes or deletes it.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	ClaimName string `json:"claimName,omitempty"`

	// Size of the claim the operator creates, named <metadata.name>-model-cache. It may grow
	// later (where the storage class allows expansion), never shrink.
	// +kubebuilder:validation:XValidation:rule=`quantity(string(self)).isGreaterThan(quantity('0'))`,message="spec.model.cache.size must be positive"
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// StorageClassName of the claim the operator creates; the cluster's default class when unset.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`

	// AccessMode of the claim: the mode the operator creates it with, or the mode the existing
	// claim has (the operator checks it and warns when it differs). ReadWriteOnce and
	// ReadWriteOncePod attach the volume to one node, so they allow one engine replica only
	// and roll it out by stopping the old pod before the new one starts; ReadWriteMany
	// (NFS, CephFS, EFS, Filestore, ...) shares one cache between every replica.
	// +kubebuilder:default=ReadWriteOnce
	// +kubebuilder:validation:Enum=ReadWriteOnce;ReadWriteOncePod;ReadWriteMany
	// +optional
	AccessMode corev1.PersistentVolumeAccessMode `json:"accessMode,omitempty"`

	// OnDelete is what happens to a claim the operator created when the model is deleted or
	// stops asking for it: Retain (the default) leaves it, so a model re-created under the same
	// name finds its weights again; Delete removes it with the model.
	// +kubebuilder:default=Retain
	// +kubebuilder:validation:Enum=Retain;Delete
	// +optional
	OnDelete string `json:"onDelete,omitempty"`
}

// Engine kinds (spec.engine.kind).
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
	EngineTRTLLM = "trtllm"
)

// Model cache deletion policies (spec.model.cache.onDelete).
const (
	CacheRetain = "Retain"
	CacheDelete = "Delete"
)

// EngineSpec configures the vLLM engine pods. The port rules start with has() guards only
// because the apiserver also checks them against the bare `{}` default; real objects always
// carry the nested defaults.
// +kubebuilder:validation:XValidation:rule=`!(has(self.parallelism) && has(self.kvEvents) && has(self.port) && has(self.parallelism.dataLocal) && has(self.kvEvents.enabled) && has(self.kvEvents.basePort) && has(self.kvEvents.replayBasePort)) || !self.kvEvents.enabled || self.kvEvents.basePort + self.parallelism.dataLocal - 1 <= 65535`,messageExpression=`'spec.engine.kvEvents.basePort + spec.engine.parallelism.dataLocal - 1 must be <= 65535 (one event port per DP rank): %d + %d - 1 = %d; lower spec.engine.kvEvents.basePort to at most %d'.format([self.kvEvents.basePort, self.parallelism.dataLocal, self.kvEvents.basePort + self.parallelism.dataLocal - 1, 65536 - self.parallelism.dataLocal])`,fieldPath=".kvEvents.basePort"
// +kubebuilder:validation:XValidation:rule=`!(has(self.parallelism) && has(self.kvEvents) && has(self.port) && has(self.parallelism.dataLocal) && has(self.kvEvents.enabled) && has(self.kvEvents.basePort) && has(self.kvEvents.replayBasePort)) || !self.kvEvents.enabled || self.kvEvents.replayBasePort == 0 || self.kvEvents.replayBasePort + self.parallelism.dataLocal - 1 <= 65535`,messageExpression=`'spec.engine.kvEvents.replayBasePort + spec.engine.parallelism.dataLocal - 1 must be <= 65535 (one replay port per DP rank): %d + %d - 1 = %d; lower spec.engine.kvEvents.replayBasePort to at most %d'.format([self.kvEvents.replayBasePort, self.parallelism.dataLocal, self.kvEvents.replayBasePort + self.parallelism.dataLocal - 1, 65536 - self.parallelism.dataLocal])`,fieldPath=".kvEvents.replayBasePort"
// +kubebuilder:validation:XValidation:rule=`!(has(self.parallelism) && has(self.kvEvents) && has(self.port) && has(self.parallelism.dataLocal) && has(self.kvEvents.enabled) && has(self.kvEvents.basePort) && has(self.kvEvents.replayBasePort)) || !self.kvEvents.enabled || self.port < self.kvEvents.basePort || self.port >= self.kvEvents.basePort + self.parallelism.dataLocal`,messageExpression=`'spec.engine.port %d collides with the KV event ports spec.engine.kvEvents.basePort .. basePort+dataLocal-1 (%d..%d): it is the event port of DP rank %d; move spec.engine.port or spec.engine.kvEvents.basePort'.format([self.port, self.kvEvents.basePort, self.kvEvents.basePort + self.parallelism.dataLocal - 1, self.port - self.kvEvents.basePort])`,fieldPath=".port"
// +kubebuilder:validation:XValidation:rule=`!(has(self.parallelism) && has(self.kvEvents) && has(self.port) && has(self.parallelism.dataLocal) && has(self.kvEvents.enabled) && has(self.kvEvents.basePort) && has(self.kvEvents.replayBasePort)) || !self.kvEvents.enabled || self.kvEvents.replayBasePort == 0 || self.port < self.kvEvents.replayBasePort || self.port >= self.kvEvents.replayBasePort + self.parallelism.dataLocal`,messageExpression=`'spec.engine.port %d collides with the KV replay ports spec.engine.kvEvents.replayBasePort .. replayBasePort+dataLocal-1 (%d..%d): it is the replay port of DP rank %d; move spec.engine.port or spec.engine.kvEvents.replayBasePort'.format([self.port, self.kvEvents.replayBasePort, self.kvEvents.replayBasePort + self.parallelism.dataLocal - 1, self.port - self.kvEvents.replayBasePort])`,fieldPath=".port"
// +kubebuilder:validation:XValidation:rule=`!(has(self.parallelism) && has(self.kvEvents) && has(self.port) && has(self.parallelism.dataLocal) && has(self.kvEvents.enabled) && has(self.kvEvents.basePort) && has(self.kvEvents.replayBasePort)) || !self.kvEvents.enabled || self.kvEvents.replayBasePort == 0 || self.kvEvents.replayBasePort >= self.kvEvents.basePort + self.parallelism.dataLocal || self.kvEvents.basePort >= self.kvEvents.replayBasePort + self.parallelism.dataLocal`,messageExpression=`'spec.engine.kvEvents.replayBasePort range %d..%d overlaps the event port range spec.engine.kvEvents.basePort .. basePort+dataLocal-1 (%d..%d), one port per DP rank each: move spec.engine.kvEvents.replayBasePort to %d or above, or to at most %d'.format([self.kvEvents.replayBasePort, self.kvEvents.replayBasePort + self.parallelism.dataLocal - 1, self.kvEvents.basePort, self.kvEvents.basePort + self.parallelism.dataLocal - 1, self.kvEvents.basePort + self.parallelism.dataLocal, self.kvEvents.basePort - self.parallelism.dataLocal])`,fieldPath=".kvEvents.replayBasePort"
// +kubebuilder:validation:XValidation:rule=`!(has(self.parallelism) && has(self.kvEvents) && has(self.port) && has(self.parallelism.dataLocal) && has(self.kvEvents.enabled) && has(self.kvEvents.basePort) && has(self.kvEvents.replayBasePort) && has(self.kvEvents.snapshots) && has(self.kvEvents.snapshotBasePort)) || !self.kvEvents.enabled || !self.kvEvents.snapshots || self.kvEvents.snapshotBasePort + self.parallelism.dataLocal - 1 <= 65535`,messageExpression=`'spec.engine.kvEvents.snapshotBasePort + spec.engine.parallelism.dataLocal - 1 must be <= 65535 (one snapshot port per DP rank): %d + %d - 1 = %d; lower spec.engine.kvEvents.snapshotBasePort to at most %d'.format([self.kvEvents.snapshotBasePort, self.parallelism.dataLocal, self.kvEvents.snapshotBasePort + self.parallelism.dataLocal - 1, 65536 - self.parallelism.dataLocal])`,fieldPath=".kvEvents.snapshotBasePort"
// +kubebuilder:validation:XValidation:rule=`!(has(self.parallelism) && has(self.kvEvents) && has(self.port) && has(self.parallelism.dataLocal) && has(self.kvEvents.enabled) && has(self.kvEvents.basePort) && has(self.kvEvents.replayBasePort) && has(self.kvEvents.snapshots) && has(self.kvEvents.snapshotBasePort)) || !self.kvEvents.enabled || !self.kvEvents.snapshots || self.port < self.kvEvents.snapshotBasePort || self.port >= self.kvEvents.snapshotBasePort + self.parallelism.dataLocal`,messageExpression=`'spec.engine.port %d collides with the KV snapshot ports spec.engine.kvEvents.snapshotBasePort .. snapshotBasePort+dataLocal-1 (%d..%d): it is the snapshot port of DP rank %d; move spec.engine.port or spec.engine.kvEvents.snapshotBasePort'.format([self.port, self.kvEvents.snapshotBasePort, self.kvEvents.snapshotBasePort + self.parallelism.dataLocal - 1, self.port - self.kvEvents.snapshotBasePort])`,fieldPath=".port"
// +kubebuilder:validation:XValidation:rule=`!(has(self.parallelism) && has(self.kvEvents) && has(self.port) && has(self.parallelism.dataLocal) && has(self.kvEvents.enabled) && has(self.kvEvents.basePort) && has(self.kvEvents.replayBasePort) && has(self.kvEvents.snapshots) && has(self.kvEvents.snapshotBasePort)) || !self.kvEvents.enabled || !self.kvEvents.snapshots || self.kvEvents.snapshotBasePort >= self.kvEvents.basePort + self.parallelism.dataLocal || self.kvEvents.basePort >= self.kvEvents.snapshotBasePort + self.parallelism.dataLocal`,messageExpression=`'spec.engine.kvEvents.snapshotBasePort range %d..%d overlaps the event port range spec.engine.kvEvents.basePort .. basePort+dataLocal-1 (%d..%d), one port per DP rank each: move spec.engine.kvEvents.snapshotBasePort to %d or above, or to at most %d'.format([self.kvEvents.snapshotBasePort, self.kvEvents.snapshotBasePort + self.parallelism.dataLocal - 1, self.kvEvents.basePort, self.kvEvents.basePort + self.parallelism.dataLocal - 1, self.kvEvents.basePort + self.parallelism.dataLocal, self.kvEvents.basePort - self.parallelism.dataLocal])`,fieldPath=".kvEvents.snapshotBasePort"
// +kubebuilder:validation:XValidation:rule=`!(has(self.parallelism) && has(self.kvEvents) && has(self.port) && has(self.parallelism.dataLocal) && has(self.kvEvents.enabled) && has(self.kvEvents.basePort) && has(self.kvEvents.replayBasePort) && has(self.kvEvents.snapshots) && has(self.kvEvents.snapshotBasePort)) || !self.kvEvents.enabled || !self.kvEvents.snapshots || self.kvEvents.replayBasePort == 0 || self.kvEvents.snapshotBasePort >= self.kvEvents.replayBasePort + self.parallelism.dataLocal || self.kvEvents.replayBasePort >= self.kvEvents.snapshotBasePort + self.parallelism.dataLocal`,messageExpression=`'spec.engine.kvEvents.snapshotBasePort range %d..%d overlaps the replay port range spec.engine.kvEvents.replayBasePort .. replayBasePort+dataLocal-1 (%d..%d), one port per DP rank each: move spec.engine.kvEvents.snapshotBasePort to %d or above, or to at most %d'.format([self.kvEvents.snapshotBasePort, self.kvEvents.snapshotBasePort + self.parallelism.dataLocal - 1, self.kvEvents.replayBasePort, self.kvEvents.replayBasePort + self.parallelism.dataLocal - 1, self.kvEvents.replayBasePort + self.parallelism.dataLocal, self.kvEvents.replayBasePort - self.parallelism.dataLocal])`,fieldPath=".kvEvents.snapshotBasePort"
// +kubebuilder:validation:XValidation:rule=`!has(self.kvEvents) || !has(self.kvEvents.snapshots) || !self.kvEvents.snapshots || !has(self.kind) || self.kind == 'vllm'`,messageExpression=`'spec.engine.kvEvents.snapshots binds the vLLM snapshot endpoint but spec.engine.kind is %s: set snapshots to false for this engine'.format([self.kind])`,fieldPath=".kvEvents.snapshots"
// The kind rules refuse, per engine, the flags the operator owns in that engine's spelling (vLLM's
// are refused for every kind by EngineArg) and what the engine cannot do.
// +kubebuilder:validation:XValidation:rule=`!has(self.kind) || self.kind != 'sglang' || !has(self.args) || self.args.all(a, !a.matches('^--(model-path|host|tp-size|tp|dp-size|dp|page-size|enable-metrics|enable-cache-report)([=].*)?$'))`,messageExpression=`'spec.engine.args sets %s, which the operator owns for SGLang: set spec.engine.parallelism.tensor for --tp-size/--tp, spec.engine.parallelism.dataLocal for --dp-size/--dp, spec.engine.blockSize for --page-size, spec.model.uri for --model-path, and remove the entry (the operator always passes --host 0.0.0.0, --enable-metrics and --enable-cache-report)'.format([self.args.filter(a, a.matches('^--(model-path|host|tp-size|tp|dp-size|dp|page-size|enable-metrics|enable-cache-report)([=].*)?$'))[0]])`,fieldPath=".args"
// +kubebuilder:validation:XValidation:rule=`!has(self.kind) || self.kind != 'sglang' || !has(self.args) || self.args.all(a, !a.matches('^--disable-radix-cache([=].*)?$'))`,message="spec.engine.args must not set --disable-radix-cache: the router routes on SGLang's radix (prefix) cache, which the operator keeps on; remove the entry",fieldPath=".args"
// +kubebuilder:validation:XValidation:rule=`!has(self.kind) || self.kind != 'trtllm' || !has(self.args) || self.args.all(a, !a.matches('^--(host|tp_size|extra_llm_api_options|backend)([=].*)?$'))`,messageExpression=`'spec.engine.args sets %s, which the operator owns for TensorRT-LLM: set spec.engine.parallelism.tensor (or dataLocal, its attention-DP ranks) for --tp_size, and remove the entry (the operator writes the --config/--extra_llm_api_options file with the KV cache and event settings from spec.engine, and passes --host 0.0.0.0 and --backend pytorch)'.format([self.args.filter(a, a.matches('^--(host|tp_size|extra_llm_api_options|backend)([=].*)?$'))[0]])`,fieldPath=".args"
// +kubebuilder:validation:XValidation:rule=`!has(self.kind) || self.kind != 'trtllm' || !has(self.apiKeySecretRef)`,message="spec.engine.apiKeySecretRef needs spec.engine.kind vllm or sglang: trtllm-serve has no API key option (tensorrt_llm/commands/serve.py) and would serve without one; remove it and keep the engines reachable from the model's routers only (spec.networkPolicy.enabled, the default)",fieldPath=".apiKeySecretRef"
// +kubebuilder:validation:XValidation:rule=`!has(self.kind) || self.kind != 'sglang' || !has(self.loraAdapters) || size(self.loraAdapters) == 0 || !has(self.args) || self.args.all(a, !a.matches('^--(enable-lora|lora-paths)([=].*)?$'))`,messageExpression=`'spec.engine.args sets %s, which the operator writes for SGLang from spec.engine.loraAdapters (--enable-lora --lora-paths NAME=PATH...; a second --lora-paths would replace its list): list the adapters in spec.engine.loraAdapters and remove the entry'.format([self.args.filter(a, a.matches('^--(enable-lora|lora-paths)([=].*)?$'))[0]])`,fieldPath=".args"
// +kubebuilder:validation:XValidation:rule=`!has(self.kind) || self.kind != 'trtllm' || !has(self.loraAdapters)`,message="spec.engine.loraAdapters needs spec.engine.kind vllm or sglang: trtllm-serve takes no adapter flag",fieldPath=".loraAdapters"
// +kubebuilder:validation:XValidation:rule=`!has(self.kind) || self.kind != 'trtllm' || !has(self.kvEvents) || !has(self.kvEvents.mode) || self.kvEvents.mode != 'EnginesConnect'`,message="spec.engine.kvEvents.mode must be RouterConnects with spec.engine.kind trtllm: its publisher always binds",fieldPath=".kvEvents.mode"
// +kubebuilder:validation:XValidation:rule=`!has(self.kind) || self.kind != 'trtllm' || !has(self.parallelism) || !has(self.parallelism.dataLocal) || self.parallelism.dataLocal == 1 || !has(self.parallelism.tensor) || self.parallelism.tensor == 1`,messageExpression=`'spec.engine.parallelism.tensor is %d but must be 1 when dataLocal is %d with spec.engine.kind trtllm: its DP ranks are attention-DP ranks, one GPU each'.format([self.parallelism.tensor, self.parallelism.dataLocal])`,fieldPath=".parallelism.tensor"
type EngineSpec struct {
	// Kind is the engine the pods run: vllm (`vllm serve`), sglang (SGLang's launch server) or
	// trtllm (`trtllm-serve`). Each gets its own flags, image, probes and metrics path.
	// +kubebuilder:default=vllm
	// +kubebuilder:validation:Enum=vllm;sglang;trtllm
	// +optional
	Kind string `json:"kind,omitempty"`

	// Image of the engine; when empty, the operator's --default-engine-image for vllm and the
	// pinned release of the kind otherwise.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`

	// ImagePullPolicy of the engine container.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// Port is vLLM's HTTP (and metrics) port.
	// +kubebuilder:default=8000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// Args are extra `vllm serve` arguments, appended after the operator's own. Flags the
	// operator owns are rejected in every spelling.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Args []EngineArg `json:"args,omitempty"`

	// APIKeySecretRef selects a Secret key holding the engines' API key. The engine gets it
	// as VLLM_API_KEY (vLLM reads it when --api-key is absent, so the key is in neither the
	// pod spec nor the process's arguments) and the router as an environment variable it
	// sends on every engine call. Both read the Secret through the kubelet: the operator
	// never reads Secrets. vLLM guards the paths under /v1 with it (generation, the render
	// endpoints, /v1/models); /health, /metrics and /tokenize stay open. SGLang has no variable
	// for its key: it gets --api-key $(VLLM_API_KEY), which the kubelet expands (the pod spec
	// shows the reference, the process's arguments on the node hold the key), and guards every
	// path but /health and /metrics. TensorRT-LLM has no API key: the CRD refuses this field.
	// +kubebuilder:validation:XValidation:rule=`!has(self.optional) || !self.optional`,message="spec.engine.apiKeySecretRef.optional must not be true: a missing key would start the engines without authentication"
	// +optional
	APIKeySecretRef *corev1.SecretKeySelector `json:"apiKeySecretRef,omitempty"`

	// Env is extra environment for the engine container. PYTHONHASHSEED is refused: it comes
	// from hashSeed so that every replica hashes blocks the same way. VLLM_API_KEY is refused:
	// the router must know the key, so it comes from apiKeySecretRef.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule=`self.all(e, e.name != 'PYTHONHASHSEED')`,message="spec.engine.env must not set PYTHONHASHSEED: set spec.engine.hashSeed instead"
	// +kubebuilder:validation:XValidation:rule=`self.all(e, e.name != 'VLLM_API_KEY')`,message="spec.engine.env must not set VLLM_API_KEY: set spec.engine.apiKeySecretRef, which gives the key to the router too"
	// +listType=map
	// +listMapKey=name
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`

	// Resources of the engine container. nvidia.com/gpu defaults to tensor x dataLocal when
	// neither requests nor limits name it.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// Parallelism inside one pod.
	// +kubebuilder:default={}
	// +optional
	Parallelism ParallelismSpec `json:"parallelism,omitempty"`

	// BlockSize is vLLM's KV block size in tokens (--block-size).
	// +kubebuilder:default=16
	// +kubebuilder:validation:Enum=8;16;32;64;128;256
	// +optional
	BlockSize int32 `json:"blockSize,omitempty"`

	// HashAlgo is vLLM's prefix-caching hash (--prefix-caching-hash-algo).
	// +kubebuilder:default=sha256
	// +kubebuilder:validation:Enum=sha256;sha256_cbor;xxhash;xxhash_cbor
	// +optional
	HashAlgo string `json:"hashAlgo,omitempty"`

	// HashSeed becomes PYTHONHASHSEED: a decimal integer 0..4294967295. "random" is refused
	// because routing needs every replica to hash the same way.
	// +kubebuilder:default="0"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=10
	// +kubebuilder:validation:Pattern=`^(0|[1-9][0-9]*)$`
	// +kubebuilder:validation:XValidation:rule=`!self.matches('^[0-9]{1,10}$') || int(self) <= 4294967295`,message="spec.engine.hashSeed must be a decimal integer between 0 and 4294967295"
	// +optional
	HashSeed string `json:"hashSeed,omitempty"`

	// KVEvents configures the engines' KV-event publisher (vLLM's and SGLang's --kv-events-config,
	// TensorRT-LLM's kv_cache_config.kv_events_config).
	// +kubebuilder:default={}
	// +optional
	KVEvents KVEventsSpec `json:"kvEvents,omitempty"`

	// LoRAAdapters are served with --enable-lora --lora-modules name=uri (vLLM) or --enable-lora
	// --lora-paths name=path (SGLang); trtllm-serve takes none.
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	// +optional
	LoRAAdapters []LoRAAdapter `json:"loraAdapters,omitempty"`

	// SharedMemorySize bounds the /dev/shm emptyDir mounted when tensor > 1.
	// +optional
	SharedMemorySize *resource.Quantity `json:"sharedMemorySize,omitempty"`

	// Pod is merged into the engine pod template.
	// +optional
	Pod PodOverrides `json:"pod,omitempty"`
}

// EngineArg is one extra `vllm serve` argument.
// +kubebuilder:validation:MaxLength=1024
// +kubebuilder:validation:XValidation:rule=`!self.matches('^(--(no[-_])?(kv[-_]events[-_]config|port|served[-_]model[-_]name|data[-_]parallel[-_]size|tensor[-_]parallel[-_]size|block[-_]size|prefix[-_]caching[-_]hash[-_]algo|config|enable[-_]prompt[-_]tokens[-_]details|model)([=.].*)?|-(dp|tp)([=0-9].*)?)$')`,message="spec.engine.args must not set a flag the operator owns (--kv-events-config, --port, --served-model-name, --data-parallel-size/-dp, --tensor-parallel-size/-tp, --block-size, --prefix-caching-hash-algo, --config, --enable-prompt-tokens-details, --model, in any spelling): use the matching spec.engine field"
// +kubebuilder:validation:XValidation:rule=`!self.matches('^--api[-_]key([=.].*)?$')`,message="spec.engine.args must not set --api-key: put the key in a Secret and name it in spec.engine.apiKeySecretRef (the router needs it too, and args are visible in the pod spec)"
// +kubebuilder:validation:XValidation:rule=`!self.matches('^--(no[-_]enable[-_]prefix[-_]caching|enable[-_]prefix[-_]caching[=.])')`,message="spec.engine.args must not switch off prefix caching (--no-enable-prefix-caching, --enable-prefix-caching=...): the router routes on the engines' prefix caches, and the operator switches them on"
type EngineArg string

// ParallelismSpec is the parallel layout of one engine pod.
type ParallelismSpec struct {
	// Tensor is --tensor-parallel-size.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	Tensor int32 `json:"tensor,omitempty"`

	// DataLocal is --data-parallel-size: DP ranks in one pod, each with its own event port.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	DataLocal int32 `json:"dataLocal,omitempty"`
}

// KVEventsSpec configures the engines' KV-cache event publishers.
// +kubebuilder:validation:XValidation:rule=`!has(self.snapshots) || !self.snapshots || !has(self.enabled) || self.enabled`,message="spec.engine.kvEvents.snapshots needs spec.engine.kvEvents.enabled: the snapshot endpoint is part of the event publisher; set enabled to true or snapshots to false",fieldPath=".snapshots"
type KVEventsSpec struct {
	// Enabled switches the events on; without them the router scores approximately.
	// +kubebuilder:default=true
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// BasePort: DP rank r publishes on basePort + r.
	// +kubebuilder:default=5557
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	BasePort int32 `json:"basePort,omitempty"`

	// ReplayBasePort: DP rank r answers replay requests on replayBasePort + r; 0 disables replay.
	// +kubebuilder:default=5600
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +optional
	ReplayBasePort *int32 `json:"replayBasePort,omitempty"`

	// TopicPrefix: the topic is <prefix>@$(POD_IP)@<spec.model.name>.
	// +kubebuilder:default=kv
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]+$`
	// +optional
	TopicPrefix string `json:"topicPrefix,omitempty"`

	// HWM is the PUB socket's send high-water mark (0 = unlimited).
	// +kubebuilder:default=100000
	// +kubebuilder:validation:Minimum=0
	// +optional
	HWM *int32 `json:"hwm,omitempty"`

	// BufferSteps is the replay ring length, in batches.
	// +kubebuilder:default=10000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	BufferSteps int32 `json:"bufferSteps,omitempty"`

	// Mode is who dials whom for the event streams. RouterConnects (the default): each
	// engine binds basePort (+ rank) and the router connects to every pod, so any number of
	// router replicas can subscribe. EnginesConnect: the router binds basePort (kvrouter's
	// bound mode, events.bind) behind the Service <name>-events and every engine dials it,
	// for networks where the router cannot reach the pods' event ports; one router replica
	// and one DP rank per pod. Replay is asked of the engines in both modes.
	// +kubebuilder:default=RouterConnects
	// +kubebuilder:validation:Enum=RouterConnects;EnginesConnect
	// +optional
	Mode string `json:"mode,omitempty"`

	// Snapshots binds vLLM's snapshot endpoint (snapshot_endpoint in --kv-events-config) on
	// snapshotBasePort + r per DP rank, so a router that starts late, restarts alone or loses
	// more than the replay ring holds rebuilds from the engine's whole cache state. Off by
	// default: the operator follows the protocol of vLLM PR #57789 as vLLM's
	// docs/features/kv_events.md describes it, and no tagged release's KVEventsConfig read has
	// the field (what a release without it does with the key is unverified: it may refuse to
	// start). With it the engine frames every batch with a 24-byte sequence, which kvrouter
	// reads. vLLM engines only.
	// +kubebuilder:default=false
	// +optional
	Snapshots *bool `json:"snapshots,omitempty"`

	// SnapshotBasePort: DP rank r answers snapshot requests on snapshotBasePort + r when
	// snapshots is on (the router pods alone may reach it).
	// +kubebuilder:default=5650
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	SnapshotBasePort int32 `json:"snapshotBasePort,omitempty"`
}

// Event stream modes (spec.engine.kvEvents.mode).
const (
	EventsRouterConnects = "RouterConnects"
	EventsEnginesConnect = "EnginesConnect"
)

// LoRAAdapter is one adapter served beside the base model.
// +kubebuilder:validation:XValidation:rule=`!self.uri.startsWith('hf://') || self.uri.matches('^hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$')`,message="spec.engine.loraAdapters[].uri: an hf:// adapter URI must look like hf://org/name (vLLM takes no revision for adapters)",fieldPath=".uri"
// +kubebuilder:validation:XValidation:rule=`!self.uri.startsWith('pvc://') || self.uri.matches('^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^/]+)*/?$')`,message="spec.engine.loraAdapters[].uri: a pvc:// URI must look like pvc://claim-name/path/in/volume",fieldPath=".uri"
type LoRAAdapter struct {
	// Name clients use as the model name to select the adapter.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._-]*$`
	// +required
	Name string `json:"name"`
	// URI of the adapter: hf://org/name, pvc://claim/path, or a path or id as is.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +required
	URI string `json:"uri"`
}

// PodOverrides is the narrow part of the engine pod a user may set. A curated struct, not a
// PodTemplateSpec, keeps the CRD small and the operator's invariants intact.
// +kubebuilder:validation:XValidation:rule=`!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name))`,messageExpression=`'spec.engine.pod.volumeMounts: %s names no volume of spec.engine.pod.volumes: add the volume there (volumes the operator adds are mounted already)'.format([self.volumeMounts.filter(m, !has(self.volumes) || !self.volumes.exists(v, v.name == m.name)).map(m, m.name)])`,fieldPath=".volumeMounts"
type PodOverrides struct {
	// +kubebuilder:validation:MaxProperties=32
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// +kubebuilder:validation:MaxLength=253
	// +optional
	RuntimeClassName *string `json:"runtimeClassName,omitempty"`
	// +kubebuilder:validation:MaxLength=253
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// Labels are added to the engine pods; the operator's own labels win on a clash.
	// +kubebuilder:validation:MaxProperties=32
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Annotations are added to the engine pods; the operator's own annotations win on a clash.
	// +kubebuilder:validation:MaxProperties=32
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`

	// ImagePullSecrets name Secrets in the model's namespace that the kubelet pulls the engine
	// image with.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// ServiceAccountName runs the engine pods as this ServiceAccount (cloud workload identity,
	// image pull credentials). Its API token is still not mounted: vLLM never calls the API
	// server.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// Volumes are added to the engine pod, beside the operator's own (home, dshm, model-cache,
	// pvc-N, engine-config), whose names they must not take. Only the sources the Pod Security
	// "restricted" profile admits are offered.
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:XValidation:rule=`self.all(v, !(v.name in ['home', 'dshm', 'model-cache', 'engine-config']) && !v.name.matches('^pvc-[0-9]+$'))`,messageExpression=`'spec.engine.pod.volumes: %s is the name of a volume the operator adds (home, dshm, model-cache, engine-config, pvc-N): rename it'.format([self.filter(v, v.name in ['home', 'dshm', 'model-cache', 'engine-config'] || v.name.matches('^pvc-[0-9]+$')).map(v, v.name)])`
	// +optional
	Volumes []EngineVolume `json:"volumes,omitempty"`

	// VolumeMounts are added to the vllm container. Each names a volume of spec.engine.pod.volumes
	// and a path the operator does not mount (/home/vllm, /dev/shm, /mnt/pvc/..., the model
	// cache's /var/lib/kvroute/model-cache, an engine's config file under /etc/kvroute).
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +kubebuilder:validation:XValidation:rule=`self.all(m, m.mountPath != '/home/vllm' && m.mountPath != '/dev/shm' && m.mountPath != '/var/lib/kvroute/model-cache' && !m.mountPath.matches('^/mnt/pvc(/.*)?$') && !m.mountPath.matches('^/etc/kvroute(/.*)?$'))`,messageExpression=`'spec.engine.pod.volumeMounts: mountPath %s is where the operator mounts its own volumes (HOME /home/vllm, /dev/shm, pvc:// claims under /mnt/pvc, the model cache, engine config under /etc/kvroute): choose another path'.format([self.filter(m, m.mountPath in ['/home/vllm', '/dev/shm', '/var/lib/kvroute/model-cache'] || m.mountPath.matches('^/mnt/pvc(/.*)?$') || m.mountPath.matches('^/etc/kvroute(/.*)?$')).map(m, m.mountPath)])`
	// +optional
	VolumeMounts []EngineVolumeMount `json:"volumeMounts,omitempty"`

	// TopologySpreadConstraints spread the model's engine pods across zones or nodes: each
	// selects the engine pods of this model (the operator writes the labelSelector).
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	// +optional
	TopologySpreadConstraints []EngineTopologySpread `json:"topologySpreadConstraints,omitempty"`

	// EnvFrom adds every key of ConfigMaps or Secrets to the vllm container's environment.
	// spec.engine.env and the operator's own variables (POD_IP, PYTHONHASHSEED, HOME,
	// HF_HOME, HF_TOKEN, VLLM_API_KEY) win over a key of the same name.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	EnvFrom []corev1.EnvFromSource `json:"envFrom,omitempty"`

	// SecurityContext overrides fields of the operator's pod security context (non-root uid and
	// gid 1000, fsGroup 1000, RuntimeDefault seccomp), within the Pod Security "restricted"
	// profile.
	// +kubebuilder:validation:XValidation:rule=`!has(self.runAsNonRoot) || self.runAsNonRoot`,message="spec.engine.pod.securityContext.runAsNonRoot must not be false: the restricted Pod Security profile runs engines as non-root (drop the field)",fieldPath=".runAsNonRoot"
	// +kubebuilder:validation:XValidation:rule=`!has(self.runAsUser) || self.runAsUser != 0`,message="spec.engine.pod.securityContext.runAsUser must not be 0 (root): pick a non-zero uid, or drop the field for the operator's 1000",fieldPath=".runAsUser"
	// +kubebuilder:validation:XValidation:rule=`!has(self.seccompProfile) || self.seccompProfile.type in ['RuntimeDefault', 'Localhost']`,message="spec.engine.pod.securityContext.seccompProfile.type must be RuntimeDefault or Localhost (restricted Pod Security profile), not Unconfined",fieldPath=".seccompProfile.type"
	// +kubebuilder:validation:XValidation:rule=`!has(self.appArmorProfile) || self.appArmorProfile.type != 'Unconfined'`,message="spec.engine.pod.securityContext.appArmorProfile.type must not be Unconfined (restricted Pod Security profile): use RuntimeDefault or Localhost",fieldPath=".appArmorProfile.type"
	// +kubebuilder:validation:XValidation:rule=`!has(self.seLinuxOptions) || (!has(self.seLinuxOptions.user) && !has(self.seLinuxOptions.role) && (!has(self.seLinuxOptions.type) || self.seLinuxOptions.type in ['', 'container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t']))`,message="spec.engine.pod.securityContext.seLinuxOptions may set only level and a type of container_t, container_init_t, container_kvm_t or container_engine_t (restricted Pod Security profile): drop user and role",fieldPath=".seLinuxOptions"
	// +kubebuilder:validation:XValidation:rule=`!has(self.sysctls) || self.sysctls.all(s, s.name in ['kernel.shm_rmid_forced', 'net.ipv4.ip_local_port_range', 'net.ipv4.ip_unprivileged_port_start', 'net.ipv4.tcp_syncookies', 'net.ipv4.ping_group_range', 'net.ipv4.ip_local_reserved_ports', 'net.ipv4.tcp_keepalive_time', 'net.ipv4.tcp_fin_timeout', 'net.ipv4.tcp_keepalive_intvl', 'net.ipv4.tcp_keepalive_probes'])`,messageExpression=`'spec.engine.pod.securityContext.sysctls: %s is not a safe sysctl of the Pod Security profiles: remove it'.format([self.sysctls.filter(s, !(s.name in ['kernel.shm_rmid_forced', 'net.ipv4.ip_local_port_range', 'net.ipv4.ip_unprivileged_port_start', 'net.ipv4.tcp_syncookies', 'net.ipv4.ping_group_range', 'net.ipv4.ip_local_reserved_ports', 'net.ipv4.tcp_keepalive_time', 'net.ipv4.tcp_fin_timeout', 'net.ipv4.tcp_keepalive_intvl', 'net.ipv4.tcp_keepalive_probes'])).map(s, s.name)])`,fieldPath=".sysctls"
	// +optional
	SecurityContext *PodSecurityOverrides `json:"securityContext,omitempty"`

	// ContainerSecurityContext overrides fields of the vllm container's security context (no
	// privilege escalation, every capability dropped), within the Pod Security "restricted"
	// profile.
	// +kubebuilder:validation:XValidation:rule=`!has(self.privileged) || !self.privileged`,message="spec.engine.pod.containerSecurityContext.privileged must not be true: the restricted Pod Security profile refuses privileged containers (the GPU device plugin gives vLLM its GPUs without it)",fieldPath=".privileged"
	// +kubebuilder:validation:XValidation:rule=`!has(self.allowPrivilegeEscalation) || !self.allowPrivilegeEscalation`,message="spec.engine.pod.containerSecurityContext.allowPrivilegeEscalation must not be true (restricted Pod Security profile): drop the field",fieldPath=".allowPrivilegeEscalation"
	// +kubebuilder:validation:XValidation:rule=`!has(self.capabilities) || !has(self.capabilities.add) || self.capabilities.add.all(c, c == 'NET_BIND_SERVICE')`,message="spec.engine.pod.containerSecurityContext.capabilities.add may hold NET_BIND_SERVICE only (the restricted Pod Security profile): remove the other capabilities",fieldPath=".capabilities.add"
	// +kubebuilder:validation:XValidation:rule=`!has(self.capabilities) || !has(self.capabilities.drop) || 'ALL' in self.capabilities.drop`,message="spec.engine.pod.containerSecurityContext.capabilities.drop must include ALL (restricted Pod Security profile), or be left out: the operator drops ALL",fieldPath=".capabilities.drop"
	// +kubebuilder:validation:XValidation:rule=`!has(self.runAsNonRoot) || self.runAsNonRoot`,message="spec.engine.pod.containerSecurityContext.runAsNonRoot must not be false: the restricted Pod Security profile runs engines as non-root (drop the field)",fieldPath=".runAsNonRoot"
	// +kubebuilder:validation:XValidation:rule=`!has(self.runAsUser) || self.runAsUser != 0`,message="spec.engine.pod.containerSecurityContext.runAsUser must not be 0 (root): pick a non-zero uid, or drop the field",fieldPath=".runAsUser"
	// +kubebuilder:validation:XValidation:rule=`!has(self.procMount) || self.procMount == 'Default'`,message="spec.engine.pod.containerSecurityContext.procMount must be Default (restricted Pod Security profile)",fieldPath=".procMount"
	// +kubebuilder:validation:XValidation:rule=`!has(self.seccompProfile) || self.seccompProfile.type in ['RuntimeDefault', 'Localhost']`,message="spec.engine.pod.containerSecurityContext.seccompProfile.type must be RuntimeDefault or Localhost (restricted Pod Security profile), not Unconfined",fieldPath=".seccompProfile.type"
	// +kubebuilder:validation:XValidation:rule=`!has(self.appArmorProfile) || self.appArmorProfile.type != 'Unconfined'`,message="spec.engine.pod.containerSecurityContext.appArmorProfile.type must not be Unconfined (restricted Pod Security profile): use RuntimeDefault or Localhost",fieldPath=".appArmorProfile.type"
	// +kubebuilder:validation:XValidation:rule=`!has(self.seLinuxOptions) || (!has(self.seLinuxOptions.user) && !has(self.seLinuxOptions.role) && (!has(self.seLinuxOptions.type) || self.seLinuxOptions.type in ['', 'container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t']))`,message="spec.engine.pod.containerSecurityContext.seLinuxOptions may set only level and a type of container_t, container_init_t, container_kvm_t or container_engine_t (restricted Pod Security profile): drop user and role",fieldPath=".seLinuxOptions"
	// +optional
	ContainerSecurityContext *ContainerSecurityOverrides `json:"containerSecurityContext,omitempty"`
}

// PodSecurityOverrides are the fields of the engine pod's securityContext a user may set
// (corev1.PodSecurityContext's, less the Windows ones). A field left out keeps the operator's.
type PodSecurityOverrides struct {
	// +optional
	RunAsUser *int64 `json:"runAsUser,omitempty"`
	// +optional
	RunAsGroup *int64 `json:"runAsGroup,omitempty"`
	// +optional
	RunAsNonRoot *bool `json:"runAsNonRoot,omitempty"`
	// FSGroup owns the pod's volumes (the model cache included).
	// +optional
	FSGroup *int64 `json:"fsGroup,omitempty"`
	// +kubebuilder:validation:Enum=OnRootMismatch;Always
	// +optional
	FSGroupChangePolicy *corev1.PodFSGroupChangePolicy `json:"fsGroupChangePolicy,omitempty"`
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	SupplementalGroups []int64 `json:"supplementalGroups,omitempty"`
	// +optional
	SeccompProfile *corev1.SeccompProfile `json:"seccompProfile,omitempty"`
	// +optional
	AppArmorProfile *corev1.AppArmorProfile `json:"appArmorProfile,omitempty"`
	// +optional
	SELinuxOptions *corev1.SELinuxOptions `json:"seLinuxOptions,omitempty"`
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	Sysctls []corev1.Sysctl `json:"sysctls,omitempty"`
}

// ContainerSecurityOverrides are the fields of the vllm container's securityContext a user may
// set (corev1.SecurityContext's, less the Windows ones). A field left out keeps the operator's.
type ContainerSecurityOverrides struct {
	// +optional
	Privileged *bool `json:"privileged,omitempty"`
	// +optional
	AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation,omitempty"`
	// Capabilities: ALL stays dropped; NET_BIND_SERVICE is the one that may be added.
	// +optional
	Capabilities *corev1.Capabilities `json:"capabilities,omitempty"`
	// +optional
	RunAsUser *int64 `json:"runAsUser,omitempty"`
	// +optional
	RunAsGroup *int64 `json:"runAsGroup,omitempty"`
	// +optional
	RunAsNonRoot *bool `json:"runAsNonRoot,omitempty"`
	// ReadOnlyRootFilesystem: HOME, /dev/shm and the model cache are volumes already; Python's
	// temporary files need one more, an emptyDir mounted at /tmp through volumes.
	// +optional
	ReadOnlyRootFilesystem *bool `json:"readOnlyRootFilesystem,omitempty"`
	// +optional
	ProcMount *corev1.ProcMountType `json:"procMount,omitempty"`
	// +optional
	SeccompProfile *corev1.SeccompProfile `json:"seccompProfile,omitempty"`
	// +optional
	AppArmorProfile *corev1.AppArmorProfile `json:"appArmorProfile,omitempty"`
	// +optional
	SELinuxOptions *corev1.SELinuxOptions `json:"seLinuxOptions,omitempty"`
}

// EngineTopologySpread is a topology spread constraint over this model's engine pods.
type EngineTopologySpread struct {
	// MaxSkew is the most the number of engine pods may differ between two domains.
	// +kubebuilder:validation:Minimum=1
	// +required
	MaxSkew int32 `json:"maxSkew"`
	// TopologyKey is the node label whose values are the domains (topology.kubernetes.io/zone,
	// kubernetes.io/hostname).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +required
	TopologyKey string `json:"topologyKey"`
	// WhenUnsatisfiable: DoNotSchedule keeps a pod Pending rather than break the skew;
	// ScheduleAnyway only prefers the spread.
	// +kubebuilder:validation:Enum=DoNotSchedule;ScheduleAnyway
	// +kubebuilder:default=DoNotSchedule
	// +optional
	WhenUnsatisfiable corev1.UnsatisfiableConstraintAction `json:"whenUnsatisfiable,omitempty"`
	// MinDomains is the number of eligible domains below which the global minimum counts as 0
	// (DoNotSchedule only).
	// +kubebuilder:validation:Minimum=1
	// +optional
	MinDomains *int32 `json:"minDomains,omitempty"`
}

// EngineVolumeMount mounts a volume of spec.engine.pod.volumes in the vllm container.
type EngineVolumeMount struct {
	// Name of the volume in spec.engine.pod.volumes.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +required
	Name string `json:"name"`
	// MountPath in the container, absolute.
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^/`
	// +required
	MountPath string `json:"mountPath"`
	// SubPath within the volume to mount instead of its root.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	SubPath string `json:"subPath,omitempty"`
	// +optional
	ReadOnly bool `json:"readOnly,omitempty"`
}

// EngineVolume is a volume of the engine pod, limited to the sources the Pod Security
// "restricted" profile admits that an engine needs: exactly one of them.
// +kubebuilder:validation:XValidation:rule=`[has(self.configMap), has(self.secret), has(self.persistentVolumeClaim), has(self.emptyDir), has(self.csi)].filter(x, x).size() == 1`,messageExpression=`'spec.engine.pod.volumes[%s] needs exactly one of configMap, secret, persistentVolumeClaim, emptyDir or csi'.format([self.name])`
type EngineVolume struct {
	// Name is what a volumeMount names.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`
	// ConfigMap mounts every key of a ConfigMap as a file.
	// +optional
	ConfigMap *ConfigMapVolume `json:"configMap,omitempty"`
	// Secret mounts every key of a Secret as a file.
	// +optional
	Secret *SecretVolume `json:"secret,omitempty"`
	// PersistentVolumeClaim mounts a claim in the model's namespace.
	// +optional
	PersistentVolumeClaim *corev1.PersistentVolumeClaimVolumeSource `json:"persistentVolumeClaim,omitempty"`
	// EmptyDir is scratch space that lives as long as the pod.
	// +optional
	EmptyDir *corev1.EmptyDirVolumeSource `json:"emptyDir,omitempty"`
	// CSI is an inline CSI volume (the Secrets Store CSI driver, for instance).
	// +optional
	CSI *CSIVolume `json:"csi,omitempty"`
}

// ConfigMapVolume is a ConfigMap mounted as files.
type ConfigMapVolume struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// Optional lets the pod start without the ConfigMap.
	// +optional
	Optional *bool `json:"optional,omitempty"`
	// DefaultMode of the files (octal 0644 is decimal 420).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=511
	// +optional
	DefaultMode *int32 `json:"defaultMode,omitempty"`
}

// SecretVolume is a Secret mounted as files.
type SecretVolume struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	SecretName string `json:"secretName"`
	// Optional lets the pod start without the Secret.
	// +optional
	Optional *bool `json:"optional,omitempty"`
	// DefaultMode of the files (octal 0644 is decimal 420).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=511
	// +optional
	DefaultMode *int32 `json:"defaultMode,omitempty"`
}

// CSIVolume is an inline CSI volume.
type CSIVolume struct {
	// Driver is the CSI driver's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +required
	Driver string `json:"driver"`
	// +optional
	ReadOnly *bool `json:"readOnly,omitempty"`
	// VolumeAttributes are passed to the driver.
	// +kubebuilder:validation:MaxProperties=32
	// +optional
	VolumeAttributes map[string]string `json:"volumeAttributes,omitempty"`
	// NodePublishSecretRef names a Secret the driver reads.
	// +optional
	NodePublishSecretRef *corev1.LocalObjectReference `json:"nodePublishSecretRef,omitempty"`
}

// RouterSpec configures the KV-aware router.
// +kubebuilder:validation:XValidation:rule=`!has(self.mode) || self.mode != 'EndpointPicker' || !has(self.service) || !has(self.service.type) || self.service.type == 'ClusterIP'`,messageExpression=`'spec.router.service.type is %s but must be ClusterIP with spec.router.mode EndpointPicker: the picker\'s gRPC port carries no authentication, and only the gateway in the cluster calls it'.format([self.service.type])`,fieldPath=".service.type"
// +kubebuilder:validation:XValidation:rule=`(has(self.mode) && self.mode == 'EndpointPicker') || !has(self.endpointPicker)`,message="spec.router.endpointPicker may only be set when spec.router.mode is EndpointPicker",fieldPath=".endpointPicker"
type RouterSpec struct {
	// Mode is how requests reach the engines. Proxy: clients (or a gateway) send them to the
	// router Service, which forwards each to the engine replica it picks. EndpointPicker: a
	// Gateway API gateway with the Inference Extension sends them to the engine pods itself and
	// asks the router which one (Envoy ext_proc over gRPC); the operator renders the
	// InferencePool (inference.networking.k8s.io/v1, named as this resource) that the gateway's
	// HTTPRoute names (docs/gateways.md).
	// +kubebuilder:default=Proxy
	// +kubebuilder:validation:Enum=Proxy;EndpointPicker
	// +optional
	Mode string `json:"mode,omitempty"`

	// EndpointPicker configures mode EndpointPicker.
	// +optional
	EndpointPicker *EndpointPickerSpec `json:"endpointPicker,omitempty"`

	// Replicas of the router Deployment. Unset: 2 (1 with spec.engine.kvEvents.mode
	// EnginesConnect, where each engine sends its events to one router). Two routers share their
	// in-flight load and start from each other's index, so a rolling update or a lost node keeps
	// one serving with an exact index; 1 is a single router (a restart past the engines' replay
	// rings starts approximate).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Image of kvrouter; the operator's --default-router-image when empty.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`

	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// Resources of the router container.
	// +kubebuilder:default={requests:{cpu:"100m",memory:"128Mi"}}
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// Service in front of the router.
	// +kubebuilder:default={}
	// +optional
	Service RouterServiceSpec `json:"service,omitempty"`

	// Policy picks a replica per request: one of the production policies (router/score
	// ProductionPolicies). The peers' emulations are kvbench's, for benchmarks only.
	// +kubebuilder:default=kv
	// +kubebuilder:validation:Enum=kv;load;least-loaded;round-robin;session
	// +optional
	Policy string `json:"policy,omitempty"`

	// Warmup credit for newly Ready engine replicas.
	// +kubebuilder:default={}
	// +optional
	Warmup WarmupSpec `json:"warmup,omitempty"`
	// KVCacheReportMode "full" makes the router ask every engine to re-announce the blocks a
	// request hit (vllm_xargs.kv_cache_report_mode), which keeps the index's recency exact. vLLM
	// honours it from PR #45261 on; older engines ignore it. Unset leaves requests alone.
	// +kubebuilder:validation:Enum=full
	// +optional
	KVCacheReportMode string `json:"kvCacheReportMode,omitempty"`

	// Timeouts of the router's request path; an unset one keeps kvrouter's default.
	// +optional
	Timeouts *RouterTimeouts `json:"timeouts,omitempty"`

	// Capture writes the router's traffic as a Mooncake-format trace (timestamps, lengths and
	// salted block ids; no text, no token ids) for `kvbench cache|replay --trace`: the trial of
	// every policy on this fleet's own traffic. Off unless enabled.
	// +optional
	Capture *RouterCaptureSpec `json:"capture,omitempty"`

	// Audit samples prompts for a varying span at their start (a timestamp, an id) that no
	// router can match past; /debug/audit on the metrics port. Off unless enabled.
	// +optional
	Audit *RouterAuditSpec `json:"audit,omitempty"`

	// ShadowPolicy re-decides every request with this policy on the signals the real decision
	// saw, without acting on it, and exports what its picks had cached beside production's
	// (kvroute_router_shadow_*). Its caches were filled by the production policy: see
	// docs/should-you-route.md for what that biases. One of the production policies, as Policy.
	// +kubebuilder:validation:Enum=kv;load;least-loaded;round-robin;session
	// +optional
	ShadowPolicy string `json:"shadowPolicy,omitempty"`

	// Sync is how router replicas share their in-flight load and start from each other's index
	// (used when replicas > 1). Unset: each router embeds a NATS server and they cluster through
	// the router's headless Service.
	// +optional
	Sync *RouterSync `json:"sync,omitempty"`
}

// Router modes (spec.router.mode).
const (
	RouterModeProxy          = "Proxy"
	RouterModeEndpointPicker = "EndpointPicker"
)

// EndpointPickerSpec configures the router as the InferencePool's endpoint picker.
type EndpointPickerSpec struct {
	// FailureMode is the InferencePool's spec.endpointPickerRef.failureMode: what the gateway
	// does when the picker does not answer. FailClose answers the request with an error;
	// FailOpen sends it to a pod of the pool the gateway picks itself (no KV-cache awareness).
	// +kubebuilder:default=FailClose
	// +kubebuilder:validation:Enum=FailClose;FailOpen
	// +optional
	FailureMode string `json:"failureMode,omitempty"`
	// AllowFrom are the gateway's proxies: the peers admitted to the picker's gRPC port and to
	// the engines' HTTP port, which the gateway sends requests to directly. Unset: the pods of
	// the model's own namespace (where Istio and kgateway run a Gateway's proxy). Envoy Gateway
	// runs its proxies in envoy-gateway-system; GKE's come from the region's proxy-only subnet
	// (an ipBlock).
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	AllowFrom []networkingv1.NetworkPolicyPeer `json:"allowFrom,omitempty"`
	// TLS is how the picker serves its gRPC port. Gateways dial a picker over TLS without
	// verifying it, as the Inference Extension's own picker serves a self-signed certificate;
	// the default does the same.
	// +kubebuilder:default={mode: SelfSigned}
	// +optional
	TLS *EndpointPickerTLS `json:"tls,omitempty"`
}

// The picker's TLS modes (spec.router.endpointPicker.tls.mode).
const (
	PickerTLSSelfSigned = "SelfSigned"
	PickerTLSSecret     = "Secret"
	PickerTLSDisabled   = "Disabled"
)

// EndpointPickerTLS is the picker's certificate.
// +kubebuilder:validation:XValidation:rule="self.mode == 'Secret' ? has(self.secretName) : !has(self.secretName)",message="spec.router.endpointPicker.tls: set secretName with mode Secret (a kubernetes.io/tls Secret in the model's namespace), and only then"
type EndpointPickerTLS struct {
	// Mode: SelfSigned (a certificate the router makes at start), Secret (tls.crt and tls.key
	// from secretName, e.g. cert-manager's, re-read when rotated) or Disabled (plaintext gRPC:
	// only for a gateway configured for it, or a mesh that encrypts the hop).
	// +kubebuilder:default=SelfSigned
	// +kubebuilder:validation:Enum=SelfSigned;Secret;Disabled
	Mode string `json:"mode"`
	// SecretName is a kubernetes.io/tls Secret in the model's namespace, with mode Secret.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	SecretName string `json:"secretName,omitempty"`
}

// RouterCaptureSpec bounds the trace capture. Files are written to
// /var/lib/kvroute/capture in each router pod: an emptyDir sized for them, or the claim.
type RouterCaptureSpec struct {
	// +optional
	Enabled bool `json:"enabled,omitempty"`
	// MaxBytes per file; the next record opens a new file.
	// +kubebuilder:default=67108864
	// +kubebuilder:validation:Minimum=65536
	// +kubebuilder:validation:Maximum=17179869184
	// +optional
	MaxBytes *int64 `json:"maxBytes,omitempty"`
	// Files kept, the one being written included; older ones are deleted.
	// +kubebuilder:default=4
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	Files *int32 `json:"files,omitempty"`
	// ClaimName, when set, is a PersistentVolumeClaim the files go to (it outlives the pod);
	// otherwise an emptyDir of (files + 1) x maxBytes.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ClaimName string `json:"claimName,omitempty"`
}

// RouterAuditSpec configures the prompt audit.
type RouterAuditSpec struct {
	// +optional
	Enabled bool `json:"enabled,omitempty"`
	// SampleEvery audits one request in this many.
	// +kubebuilder:default=8
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1048576
	// +optional
	SampleEvery *int32 `json:"sampleEvery,omitempty"`
	// ShowText lets /debug/audit show the detokenized text of a varying span (prompt content:
	// the metrics port then needs the same care as the prompts). Off, it shows its shape only.
	// +optional
	ShowText bool `json:"showText,omitempty"`
}

// RouterSync configures the load sync between router replicas (NATS core publish/subscribe).
type RouterSync struct {
	// NATSURL, when set, is an external NATS server (nats:// or tls://) the routers share
	// instead of embedding one each; no cluster port or headless Service is rendered then.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^(nats|tls)://[^\s]+$`
	// +optional
	NATSURL string `json:"natsURL,omitempty"`
	// TLSSecretName names a Secret in the model's namespace with tls.crt, tls.key and ca.crt:
	// mutual TLS on the routes between the routers' embedded servers (or to NATSURL).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	TLSSecretName string `json:"tlsSecretName,omitempty"`
}

// RouterTimeouts bound the request path (the limits.*Timeout keys of the router's config).
type RouterTimeouts struct {
	// Connect bounds dialling an engine. kvrouter's default: 5s.
	// +kubebuilder:validation:XValidation:rule=`duration(self) > duration('0s')`,message="spec.router.timeouts.connect must be positive"
	// +optional
	Connect *metav1.Duration `json:"connect,omitempty"`
	// HeaderRead bounds reading a client's request headers. kvrouter's default: 10s.
	// +kubebuilder:validation:XValidation:rule=`duration(self) > duration('0s')`,message="spec.router.timeouts.headerRead must be positive"
	// +optional
	HeaderRead *metav1.Duration `json:"headerRead,omitempty"`
	// BodyRead bounds reading a client's request body (408 past it). kvrouter's default: 30s.
	// +kubebuilder:validation:XValidation:rule=`duration(self) > duration('0s')`,message="spec.router.timeouts.bodyRead must be positive"
	// +optional
	BodyRead *metav1.Duration `json:"bodyRead,omitempty"`
	// FirstToken bounds one attempt's wait for a stream's first token; past it the request is
	// retried on another engine. Keep it generous: long prefills behind a queue are legitimate.
	// kvrouter's default: 10m.
	// +kubebuilder:validation:XValidation:rule=`duration(self) > duration('0s')`,message="spec.router.timeouts.firstToken must be positive"
	// +optional
	FirstToken *metav1.Duration `json:"firstToken,omitempty"`
	// Idle cuts a started stream silent for this long. kvrouter's default: 5m.
	// +kubebuilder:validation:XValidation:rule=`duration(self) > duration('0s')`,message="spec.router.timeouts.idle must be positive"
	// +optional
	Idle *metav1.Duration `json:"idle,omitempty"`
	// Request bounds a whole request, first byte in to last byte out. kvrouter's default: 30m.
	// +kubebuilder:validation:XValidation:rule=`duration(self) > duration('0s')`,message="spec.router.timeouts.request must be positive"
	// +optional
	Request *metav1.Duration `json:"request,omitempty"`
}

// RouterServiceSpec is the router's Service.
type RouterServiceSpec struct {
	// +kubebuilder:default=ClusterIP
	// +kubebuilder:validation:Enum=ClusterIP;NodePort;LoadBalancer
	// +optional
	Type corev1.ServiceType `json:"type,omitempty"`
	// +kubebuilder:default=8000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
}

// WarmupSpec is the credit a newly Ready replica gets while its prefix cache is cold.
type WarmupSpec struct {
	// Duration of the credit, decaying linearly to 0.
	// +kubebuilder:default="2m"
	// +kubebuilder:validation:XValidation:rule=`duration(self) >= duration('0s') && duration(self) <= duration('24h')`,message="spec.router.warmup.duration must be between 0s and 24h"
	// +optional
	Duration *metav1.Duration `json:"duration,omitempty"`
	// Credit is the share (0..1) of a request's prompt blocks credited to a warming replica.
	// +kubebuilder:default=0.5
	// +kubebuilder:validation:XValidation:rule=`self >= 0.0 && self <= 1.0`,message="spec.router.warmup.credit must be between 0 and 1"
	// +optional
	Credit Fraction `json:"credit,omitempty"`
}

// NetworkPolicySpec controls the NetworkPolicies on the engine pods and the router pods.
type NetworkPolicySpec struct {
	// Enabled renders both: the engine pods' ports reachable from the router (events and replay
	// from the router only), the router's admin port (metrics, /debug) from the model's own
	// namespace and allowFrom; the router's API port stays open to every source (with
	// spec.router.mode EndpointPicker, the picker's gRPC port admits the gateway only).
	// +kubebuilder:default=true
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// AllowFrom are extra peers allowed to the engine HTTP/metrics port and to the router's
	// admin port (the event and replay ports stay router-only). Default: the namespace named
	// monitoring.
	// +kubebuilder:default={{namespaceSelector:{matchLabels:{"kubernetes.io/metadata.name":"monitoring"}}}}
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	AllowFrom []networkingv1.NetworkPolicyPeer `json:"allowFrom,omitempty"`
}

// AutoscalingSpec makes HPA or KEDA scale the resource through /scale.
// +kubebuilder:validation:XValidation:rule=`self.minReplicas <= self.maxReplicas`,messageExpression=`'spec.autoscaling.minReplicas %d must be <= spec.autoscaling.maxReplicas %d'.format([self.minReplicas, self.maxReplicas])`,fieldPath=".minReplicas"
// +kubebuilder:validation:XValidation:rule=`self.provider == 'KEDA' || !has(self.keda)`,message="spec.autoscaling.keda may only be set when spec.autoscaling.provider is KEDA",fieldPath=".keda"
// +kubebuilder:validation:XValidation:rule=`self.provider == 'HPA' || !has(self.hpa)`,message="spec.autoscaling.hpa may only be set when spec.autoscaling.provider is HPA",fieldPath=".hpa"
// +kubebuilder:validation:XValidation:rule=`self.provider != 'KEDA' || (has(self.keda) && has(self.keda.prometheus) && size(self.keda.prometheus.serverAddress) > 0)`,message="spec.autoscaling.keda.prometheus.serverAddress is required when spec.autoscaling.provider is KEDA"
// +kubebuilder:validation:XValidation:rule=`self.provider != 'HPA' || self.minReplicas >= 1`,message="spec.autoscaling.minReplicas must be >= 1 with provider HPA (only KEDA scales to zero)",fieldPath=".minReplicas"
type AutoscalingSpec struct {
	// +kubebuilder:validation:Enum=HPA;KEDA
	// +required
	Provider string `json:"provider"`
	// MinReplicas may be 0 with provider KEDA: the model then scales to zero, a request that
	// finds no ready replica is held by the router (up to 5 minutes) and the routers' held
	// requests (kvroute_router_held_requests) activate KEDA, which brings a replica up.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinReplicas *int32 `json:"minReplicas,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +required
	MaxReplicas int32 `json:"maxReplicas"`
	// TargetQueuePerReplica is the target of the fallback metric, vllm:num_requests_waiting per
	// replica: it scales the model while the routers' backlog is absent (no router metrics yet,
	// or no adapter rule for them), and beside it otherwise (the autoscaler takes the larger).
	// +kubebuilder:default="4"
	// +optional
	TargetQueuePerReplica *resource.Quantity `json:"targetQueuePerReplica,omitempty"`
	// TargetBacklogPerReplica is the target of the default metric, the routers' queued prefill
	// in seconds of the replicas' measured drain (kvroute_router_backlog_seconds) per replica.
	// The default 1 s is chosen from the fleet model's comparison (docs/autoscaling.md,
	// `kvbench autoscale`): against 2 s it scales up one sync sooner and holds TTFT p90 while
	// scaling 2-3x lower, for 1-2 % more replica-seconds.
	// +kubebuilder:default="1"
	// +kubebuilder:validation:XValidation:rule=`quantity(string(self)).isGreaterThan(quantity('0'))`,message="spec.autoscaling.targetBacklogPerReplica must be positive (seconds of queued prefill per replica)"
	// +optional
	TargetBacklogPerReplica *resource.Quantity `json:"targetBacklogPerReplica,omitempty"`
	// Behavior of the HPA (KEDA passes it to the HPA it creates).
	// +optional
	Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
	// +optional
	HPA *HPASpec `json:"hpa,omitempty"`
	// +optional
	KEDA *KEDASpec `json:"keda,omitempty"`
}

// HPASpec holds HPA-only settings.
type HPASpec struct {
	// Metrics replace the default metric; they need a custom or external metrics adapter.
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	// +optional
	Metrics []autoscalingv2.MetricSpec `json:"metrics,omitempty"`
}

// KEDASpec holds KEDA-only settings.
type KEDASpec struct {
	// +optional
	Prometheus *KEDAPrometheus `json:"prometheus,omitempty"`
	// +kubebuilder:default=15
	// +kubebuilder:validation:Minimum=1
	// +optional
	PollingInterval *int32 `json:"pollingInterval,omitempty"`
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=0
	// +optional
	CooldownPeriod *int32 `json:"cooldownPeriod,omitempty"`
}

// KEDAPrometheus is the Prometheus trigger KEDA polls.
type KEDAPrometheus struct {
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://`
	// +required
	ServerAddress string `json:"serverAddress"`
	// Query; default sum(vllm:num_requests_waiting{namespace=..., model_name=...}).
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Query string `json:"query,omitempty"`
	// AuthenticationRef names a KEDA TriggerAuthentication in the namespace.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	AuthenticationRef string `json:"authenticationRef,omitempty"`
}

// KVRoutedModelStatus is the observed state.
type KVRoutedModelStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Replicas is the /scale status path: engine pods observed.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas,omitempty"`
	// WarmingReplicas are Ready engine pods still inside their warm-up window.
	// +optional
	WarmingReplicas int32 `json:"warmingReplicas,omitempty"`
	// Selector is the /scale selector path: the engine pods' label selector.
	// +optional
	Selector string `json:"selector,omitempty"`
	// +optional
	Engine *EngineStatus `json:"engine,omitempty"`
	// +optional
	Router *RouterStatus `json:"router,omitempty"`
	// +optional
	Autoscaler *AutoscalerStatus `json:"autoscaler,omitempty"`
	// Prefill reports the prefill pool; absent without spec.disaggregation.
	// +optional
	Prefill *PoolStatus `json:"prefill,omitempty"`
	// LastScaleTime is when spec.replicas last changed.
	// +optional
	LastScaleTime *metav1.Time `json:"lastScaleTime,omitempty"`
	// RouterReports is each router replica's view of the index: the engine replicas it finds
	// degraded and why. Each router pod writes its own entry (server-side apply, field manager
	// kvrouter-<pod>); the operator reads the fresh ones into the IndexHealthy condition.
	// Bounded so the object stays far below etcd's size limit: 16 router pods report.
	// +listType=map
	// +listMapKey=pod
	// +kubebuilder:validation:MaxItems=16
	// +optional
	RouterReports []RouterReport `json:"routerReports,omitempty"`
}

// RouterReport is one router pod's report on the index health.
type RouterReport struct {
	// Pod is the router pod's name.
	// +kubebuilder:validation:MaxLength=253
	Pod string `json:"pod"`
	// ObservedAt is when the router last confirmed this report; the operator ignores reports
	// older than 50 seconds.
	ObservedAt metav1.Time `json:"observedAt"`
	// Degraded lists the engine replicas with a degraded reason in force; empty when none. A
	// router lists the first 32 (by replica name).
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Degraded []DegradedReplica `json:"degraded,omitempty"`
	// Peers are the other router pods whose load this router receives (several router
	// replicas); empty when alone or cut off.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	// +optional
	Peers []string `json:"peers,omitempty"`
	// Held is how many requests this router holds for want of a ready engine replica
	// (kvroute_router_held_requests): the demand that wakes a model at zero replicas. A router
	// writes its report at once when it starts or stops holding, and the count at each
	// confirmation.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Held int32 `json:"held,omitempty"`
	// BacklogSeconds is the model's queued prefill in seconds of the replicas' measured drain
	// (kvroute_router_backlog_seconds, the fleet's figure) when the router last confirmed its
	// report; absent while the drain rate is not measured.
	// +optional
	BacklogSeconds *resource.Quantity `json:"backlogSeconds,omitempty"`
}

// DegradedReplica is one degraded reason in force on one engine replica (engine pod and DP rank).
type DegradedReplica struct {
	// Replica is "<engine pod>/<rank>".
	// +kubebuilder:validation:MaxLength=300
	Replica string `json:"replica"`
	// Reason is undecodable, unchained, no-events, stalled, inexact, tokenizer-failing,
	// hash-mismatch, keys-wrong, multimodal-unkeyed, hybrid-groups-skipped or partial (docs/operations.md).
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`
	// Since is when the router first saw the reason.
	Since metav1.Time `json:"since"`
	// Detail explains the trigger.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Detail string `json:"detail,omitempty"`
}

// EngineStatus reports the engine children.
type EngineStatus struct {
	// +optional
	DeploymentName string `json:"deploymentName,omitempty"`
	// KVEventPorts per DP rank, rank order.
	// +listType=atomic
	// +optional
	KVEventPorts []int32 `json:"kvEventPorts,omitempty"`
	// ReplayPorts per DP rank, rank order; empty when replay is off.
	// +listType=atomic
	// +optional
	ReplayPorts []int32 `json:"replayPorts,omitempty"`
	// SnapshotPorts per DP rank, rank order; empty unless spec.engine.kvEvents.snapshots.
	// +listType=atomic
	// +optional
	SnapshotPorts []int32 `json:"snapshotPorts,omitempty"`
	// ModelCache is the claim the weights are cached on; absent without spec.model.cache.
	// +optional
	ModelCache *ModelCacheStatus `json:"modelCache,omitempty"`
}

// ModelCacheStatus reports the weight cache's claim as the API server has it.
type ModelCacheStatus struct {
	// ClaimName of the PersistentVolumeClaim.
	// +optional
	ClaimName string `json:"claimName,omitempty"`
	// Managed is true for a claim the operator created (spec.model.cache.size).
	// +optional
	Managed bool `json:"managed,omitempty"`
	// Phase of the claim (Pending, Bound, Lost); empty when it was not found.
	// +optional
	Phase string `json:"phase,omitempty"`
	// Capacity of the bound volume.
	// +optional
	Capacity string `json:"capacity,omitempty"`
	// AccessModes the claim has.
	// +listType=atomic
	// +optional
	AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes,omitempty"`
	// Message says what is wrong with the claim: not found, or an access mode other than
	// spec.model.cache.accessMode.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
}

// RouterStatus reports the router children.
type RouterStatus struct {
	// +optional
	DeploymentName string `json:"deploymentName,omitempty"`
	// +optional
	ServiceName string `json:"serviceName,omitempty"`
	// Endpoint is the in-cluster URL a gateway points at; with spec.router.mode EndpointPicker,
	// the picker's gRPC address the InferencePool names.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// InferencePool is the pool a gateway's HTTPRoute names (spec.router.mode EndpointPicker).
	// +optional
	InferencePool string `json:"inferencePool,omitempty"`
	// Replicas and ReadyReplicas of the router Deployment.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// PeersConnected, with several router replicas, is whether every reporting router receives
	// the load of every other one (status.routerReports[].peers); unset with one router.
	// +optional
	PeersConnected *bool `json:"peersConnected,omitempty"`
	// PeersMessage names the routers that do not see each other.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	PeersMessage string `json:"peersMessage,omitempty"`
	// HeldRequests is how many requests the routers hold now for want of a ready engine
	// replica, summed over the fresh status.routerReports. Above zero at zero replicas, the
	// operator scales a model with spec.autoscaling.minReplicas 0 to one (docs/autoscaling.md).
	// +optional
	HeldRequests int32 `json:"heldRequests,omitempty"`
	// BacklogSeconds is the routers' queued prefill in seconds of the measured drain (the
	// largest fresh report's; each router reports the fleet's figure), as of the routers' last
	// confirmation (at most 20 s old); absent while no router has measured the drain rate.
	// +optional
	BacklogSeconds *resource.Quantity `json:"backlogSeconds,omitempty"`
}

// AutoscalerStatus names the autoscaler object.
type AutoscalerStatus struct {
	// Kind is HorizontalPodAutoscaler or ScaledObject.
	// +optional
	Kind string `json:"kind,omitempty"`
	// +optional
	Name string `json:"name,omitempty"`
}

// PoolStatus reports the prefill Deployment.
type PoolStatus struct {
	// +optional
	DeploymentName string `json:"deploymentName,omitempty"`
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas,omitempty"`
	// +optional
	Selector string `json:"selector,omitempty"`
	// +listType=atomic
	// +optional
	SideChannelPorts []int32 `json:"sideChannelPorts,omitempty"`
}
