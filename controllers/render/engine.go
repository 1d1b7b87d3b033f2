package render

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// Engine pod layout.
const (
	EngineContainer = "vllm"
	// The vllm-openai image runs as root; we run it as this uid with HOME on an emptyDir, which
	// is where Hugging Face, vLLM and torch caches go.
	engineUID      = 1000
	engineHome     = "/home/vllm"
	pvcMountRoot   = "/mnt/pvc"
	startupTimeout = 30 * 60 // seconds a model may take to download and load
)

// Ports are an engine's per-rank ports.
type Ports struct {
	Events []int32 // empty when events are off
	Replay []int32 // empty when events or replay are off
}

// EnginePorts returns the event and replay ports per DP rank, rank order (vLLM offsets both
// endpoints by the rank). With EnginesConnect the engines bind no event port (they dial the
// router), so Events is empty; replay is still bound on the engine.
func EnginePorts(m *v1alpha1.KVRoutedModel) Ports {
	ev := m.Spec.Engine.KVEvents
	var p Ports
	if ev.Enabled == nil || !*ev.Enabled {
		return p
	}
	n := m.Spec.Engine.Parallelism.DataLocal
	for r := int32(0); r < n; r++ {
		if !EnginesConnect(m) {
			p.Events = append(p.Events, ev.BasePort+r)
		}
		if ev.ReplayBasePort != nil && *ev.ReplayBasePort != 0 {
			p.Replay = append(p.Replay, *ev.ReplayBasePort+r)
		}
	}
	return p
}

// EnginesConnect reports whether the engines dial the router with their events (kvrouter's
// bound mode) instead of binding their own event ports.
func EnginesConnect(m *v1alpha1.KVRoutedModel) bool {
	ev := m.Spec.Engine.KVEvents
	return ev.Enabled != nil && *ev.Enabled && ev.Mode == v1alpha1.EventsEnginesConnect
}

// KVEventsConfigJSON is vLLM's --kv-events-config value (vllm/config/kv_events.py): the
// publisher config every kind shares (publisherConfig), with enable_kv_cache_events true.
func KVEventsConfigJSON(m *v1alpha1.KVRoutedModel) (string, error) {
	return publisherConfigJSON(m, true)
}

// publisherConfig is the KV-event publisher config vLLM and SGLang (--kv-events-config) and
// TensorRT-LLM (kv_cache_config.kv_events_config) take, in a fixed field order so the
// rendered command is stable. Enable is the switch vLLM and both engines' newer publishers
// read. The topic holds $(POD_IP), which the kubelet expands from the container's POD_IP
// variable (TensorRT-LLM's config, which no kubelet expands, replaces it). The endpoint is
// where the PUB socket goes: vLLM and SGLang bind an address with "*" and connect to one with
// a host (vllm/distributed/kv_events.py), so EnginesConnect names the router's events Service.
type publisherConfig struct {
	Enable         *bool  `json:"enable_kv_cache_events,omitempty"`
	Publisher      string `json:"publisher"`
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
	Topic          string `json:"topic"`
	HWM            int32  `json:"hwm"`
	BufferSteps    int32  `json:"buffer_steps"`
}

// newPublisherConfig fills the publisher config from spec.engine.kvEvents: rank 0's ports
// (each engine adds the DP rank), the topic with $(POD_IP) for the kubelet to expand, and with
// EnginesConnect the router's events Service to dial.
func newPublisherConfig(m *v1alpha1.KVRoutedModel, enable bool) publisherConfig {
	ev := m.Spec.Engine.KVEvents
	c := publisherConfig{
		Publisher:   "zmq",
		Endpoint:    fmt.Sprintf("tcp://*:%d", ev.BasePort),
		Topic:       ev.TopicPrefix + "@$(POD_IP)@" + m.Spec.Model.Name,
		HWM:         *ev.HWM,
		BufferSteps: ev.BufferSteps,
	}
	if enable {
		c.Enable = ptr(true)
	}
	if EnginesConnect(m) {
		c.Endpoint = fmt.Sprintf("tcp://%s.%s.svc:%d", EventsServiceName(m), m.Namespace, ev.BasePort)
	}
	if *ev.ReplayBasePort != 0 {
		c.ReplayEndpoint = fmt.Sprintf("tcp://*:%d", *ev.ReplayBasePort)
	}
	return c
}

func publisherConfigJSON(m *v1alpha1.KVRoutedModel, enable bool) (string, error) {
	return compactJSON(newPublisherConfig(m, enable))
}

// compactJSON encodes v on one line, leaving <, > and & as they are.
func compactJSON(v any) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSpace(b.String()), nil
}

// modelRef is a model or adapter URI translated for `vllm serve`.
type modelRef struct {
	Path     string // what vLLM takes: an HF repo id, a local path, or the input as is
	Revision string // hf://...@rev
	Claim    string // pvc:// claim to mount read-only
}

// TranslateURI maps hf://org/name[@rev] to org/name (+ --revision), pvc://claim/path to the
// path where the claim is mounted, and anything else to itself.
func TranslateURI(uri string) (modelRef, error) {
	switch {
	case strings.HasPrefix(uri, "hf://"):
		id, rev, _ := strings.Cut(strings.TrimPrefix(uri, "hf://"), "@")
		if org, name, ok := strings.Cut(id, "/"); !ok || org == "" || name == "" || strings.Contains(name, "/") {
			return modelRef{}, fmt.Errorf("model URI %q: want hf://org/name[@revision]", uri)
		}
		return modelRef{Path: id, Revision: rev}, nil
	case strings.HasPrefix(uri, "pvc://"):
		claim, path, _ := strings.Cut(strings.TrimPrefix(uri, "pvc://"), "/")
		if claim == "" {
			return modelRef{}, fmt.Errorf("model URI %q: want pvc://claim/path", uri)
		}
		p := pvcMountRoot + "/" + claim
		if path = strings.Trim(path, "/"); path != "" {
			p += "/" + path
		}
		return modelRef{Path: p, Claim: claim}, nil
	default:
		return modelRef{Path: uri}, nil
	}
}

// EngineArgs is the engine container's args after its command (EngineCommand), as the
// model's engine kind renders them.
func EngineArgs(m *v1alpha1.KVRoutedModel) ([]string, error) {
	s, err := serverFor(m)
	if err != nil {
		return nil, err
	}
	return s.args(m)
}

// EngineCommand is the engine container's command for the model's engine kind.
func EngineCommand(m *v1alpha1.KVRoutedModel) ([]string, error) {
	s, err := serverFor(m)
	if err != nil {
		return nil, err
	}
	return s.command(), nil
}

// vllmArgs is the container's args after the `vllm serve` command: the model, the flags the
// operator owns, LoRA adapters, then the user's args (last, so they can add anything not
// owned; the CRD refuses owned flags in them).
func vllmArgs(m *v1alpha1.KVRoutedModel) ([]string, error) {
	e := &m.Spec.Engine
	model, err := TranslateURI(m.Spec.Model.URI)
	if err != nil {
		return nil, err
	}
	args := []string{
		model.Path,
		"--served-model-name", m.Spec.Model.Name,
		"--port", itoa(e.Port),
		"--block-size", itoa(e.BlockSize),
		"--enable-prefix-caching",
		"--prefix-caching-hash-algo", e.HashAlgo,
		"--enable-prompt-tokens-details",
		"--data-parallel-size", itoa(e.Parallelism.DataLocal),
		"--tensor-parallel-size", itoa(e.Parallelism.Tensor),
	}
	if model.Revision != "" {
		args = append(args, "--revision", model.Revision)
	}
	if *e.KVEvents.Enabled {
		cfg, err := KVEventsConfigJSON(m)
		if err != nil {
			return nil, err
		}
		args = append(args, "--kv-events-config", cfg)
	}
	if Disaggregated(m) {
		args = append(args, "--kv-transfer-config", KVTransferConfigJSON(m))
	}
	lora, err := loraArgs(m, "vLLM", "--lora-modules")
	if err != nil {
		return nil, err
	}
	return withUserArgs(append(args, lora...), m), nil
}

// loraArgs are the flags serving spec.engine.loraAdapters, NAME=PATH each after listFlag
// (vLLM's --lora-modules, SGLang's --lora-paths), both after --enable-lora; engine names the
// engine in the error for an adapter with a revision, which neither takes.
func loraArgs(m *v1alpha1.KVRoutedModel, engine, listFlag string) ([]string, error) {
	ads := m.Spec.Engine.LoRAAdapters
	if len(ads) == 0 {
		return nil, nil
	}
	args := []string{"--enable-lora", listFlag}
	for _, a := range ads {
		ref, err := TranslateURI(a.URI)
		if err != nil {
			return nil, fmt.Errorf("spec.engine.loraAdapters[%s]: %w", a.Name, err)
		}
		if ref.Revision != "" {
			return nil, fmt.Errorf("spec.engine.loraAdapters[%s]: %s takes no revision for adapters (%s)", a.Name, engine, a.URI)
		}
		args = append(args, a.Name+"="+ref.Path)
	}
	return args, nil
}

// withUserArgs appends spec.engine.args, last, so they can add anything the operator does not
// own (the CRD refuses owned flags in them).
func withUserArgs(args []string, m *v1alpha1.KVRoutedModel) []string {
	for _, a := range m.Spec.Engine.Args {
		args = append(args, string(a))
	}
	return args
}

// claims lists the distinct PVCs the model and adapters read, in first-use order.
func claims(m *v1alpha1.KVRoutedModel) []string {
	var out []string
	add := func(uri string) {
		if ref, err := TranslateURI(uri); err == nil && ref.Claim != "" {
			for _, c := range out {
				if c == ref.Claim {
					return
				}
			}
			out = append(out, ref.Claim)
		}
	}
	add(m.Spec.Model.URI)
	for _, a := range m.Spec.Engine.LoRAAdapters {
		add(a.URI)
	}
	return out
}

// EngineDeployment renders the vLLM Deployment (with spec.disaggregation, the decode pool).
// spec.replicas is copied as is: HPA and KEDA scale the KVRoutedModel, so the operator stays
// the Deployment's only writer.
func EngineDeployment(m *v1alpha1.KVRoutedModel, opts Options) (*appsv1.Deployment, error) {
	if err := CheckDefaulted(m); err != nil {
		return nil, err
	}
	return poolDeployment(m, opts, decodePool(m))
}

// poolDeployment renders one engine pool's Deployment from m's engine spec (for the prefill
// pool, a copy with the pool's changes).
func poolDeployment(m *v1alpha1.KVRoutedModel, opts Options, pl enginePool) (*appsv1.Deployment, error) {
	e := &m.Spec.Engine
	server, err := serverFor(m)
	if err != nil {
		return nil, err
	}
	image, err := engineImage(m, opts)
	if err != nil {
		return nil, err
	}
	args, err := server.args(m)
	if err != nil {
		return nil, err
	}
	env, err := server.env(m)
	if err != nil {
		return nil, err
	}
	cfgFile, err := server.configFile(m)
	if err != nil {
		return nil, err
	}
	ports := EnginePorts(m)
	health := server.healthPath()

	container := corev1.Container{
		Name:            engineContainerName(m),
		Image:           image,
		ImagePullPolicy: e.ImagePullPolicy,
		Command:         server.command(),
		Args:            args,
		Ports:           append(engineContainerPorts(m, ports), sideChannelContainerPorts(m)...),
		Env:             withEnv(append(engineEnv(m), sideChannelEnv(m)...), env),
		Resources:       engineResources(m),
		VolumeMounts:    []corev1.VolumeMount{{Name: "home", MountPath: engineHome}},
		StartupProbe:    healthProbe(health, e.Port, 10, startupTimeout/10),
		ReadinessProbe:  healthProbe(health, e.Port, 5, 3),
		LivenessProbe:   healthProbe(health, e.Port, 10, 3),
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	if sc := e.Pod.ContainerSecurityContext; sc != nil {
		container.SecurityContext = overlayContainerSecurity(container.SecurityContext, sc)
	}
	pod := e.Pod
	volumes := engineVolumes(m, &container)
	annotations := EnginePodAnnotations(m)
	if cfgFile != nil {
		volumes = append(volumes, corev1.Volume{Name: engineConfigVolume, VolumeSource: corev1.VolumeSource{
			DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{
				Path:     cfgFile.Name,
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.annotations['" + v1alpha1.AnnotationEngineConfig + "']"},
			}}}}})
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: engineConfigVolume, MountPath: cfgFile.Dir, ReadOnly: true})
		annotations[v1alpha1.AnnotationEngineConfig] = cfgFile.Content
	}
	for i := range pod.EnvFrom {
		container.EnvFrom = append(container.EnvFrom, *pod.EnvFrom[i].DeepCopy())
	}
	podSecurity := &corev1.PodSecurityContext{
		RunAsNonRoot:        ptr(true),
		RunAsUser:           ptr(int64(engineUID)),
		RunAsGroup:          ptr(int64(engineUID)),
		FSGroup:             ptr(int64(engineUID)),
		FSGroupChangePolicy: ptr(corev1.FSGroupChangeOnRootMismatch),
		SeccompProfile:      &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if pod.SecurityContext != nil {
		podSecurity = overlayPodSecurity(podSecurity, pod.SecurityContext)
	}
	podSpec := corev1.PodSpec{
		Containers:                    []corev1.Container{container},
		Volumes:                       volumes,
		AutomountServiceAccountToken:  ptr(false), // vLLM never talks to the API server
		EnableServiceLinks:            ptr(false), // a Service named "vllm" would inject VLLM_PORT, which vLLM reads
		TerminationGracePeriodSeconds: ptr(int64(120)),
		SecurityContext:               podSecurity,
		NodeSelector:                  copyMap(pod.NodeSelector),
		Tolerations:                   copyTolerations(pod.Tolerations),
		Affinity:                      pod.Affinity.DeepCopy(),
		RuntimeClassName:              copyPtr(pod.RuntimeClassName),
		PriorityClassName:             pod.PriorityClassName,
		ServiceAccountName:            pod.ServiceAccountName,
	}
	podSpec.ImagePullSecrets = append(podSpec.ImagePullSecrets, pod.ImagePullSecrets...)
	podSpec.TopologySpreadConstraints = engineTopologySpread(m, pl.selector)
	strategy := engineStrategy(m)

	d := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: objectMeta(m, pl.name, pl.component),
		Spec: appsv1.DeploymentSpec{
			Replicas: copyPtr(pl.replicas),
			Selector: &metav1.LabelSelector{MatchLabels: pl.selector},
			Strategy: strategy,
			// Downloading and loading weights can take far longer than the 600 s default.
			ProgressDeadlineSeconds: ptr(int32(startupTimeout + 600)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      merge(pod.Labels, pl.podLabels),
					Annotations: merge(pod.Annotations, annotations),
				},
				Spec: podSpec,
			},
		},
	}
	return d, nil
}

func enginePodLabels(m *v1alpha1.KVRoutedModel, component, role string) map[string]string {
	l := childLabels(m, component)
	l[v1alpha1.LabelName] = v1alpha1.EngineAppName
	if role != "" {
		l[v1alpha1.LabelRole] = role
	}
	if k := EngineKind(m); k != v1alpha1.EngineVLLM {
		l[v1alpha1.LabelName] = k
	}
	return l
}

// engineContainerName is the engine container's name: "vllm" as before kinds existed, the
// kind's name for the others.
func engineContainerName(m *v1alpha1.KVRoutedModel) string {
	if k := EngineKind(m); k != v1alpha1.EngineVLLM {
		return k
	}
	return EngineContainer
}

// EnginePodAnnotations is the router <-> engine contract on each engine pod (docs/router.md,
// Kubernetes discovery; the names live in api/v1alpha1):
// event and replay ports per rank (absent when off) and the block size; for an engine other than
// vLLM its kind, and its metrics path where it is not /metrics (the engine PodMonitor reads it).
// A vLLM pod carries neither, so its template is what it was before kinds existed.
func EnginePodAnnotations(m *v1alpha1.KVRoutedModel) map[string]string {
	p := EnginePorts(m)
	a := map[string]string{v1alpha1.AnnotationBlock: itoa(m.Spec.Engine.BlockSize)}
	if k := EngineKind(m); k != v1alpha1.EngineVLLM {
		a[v1alpha1.AnnotationEngineKind] = k
	}
	if path := EngineMetricsPath(m); path != "/metrics" {
		a[v1alpha1.AnnotationMetricsPath] = path
	}
	if len(p.Events) > 0 {
		a[v1alpha1.AnnotationKVEvents] = joinPorts(p.Events)
	}
	if len(p.Replay) > 0 {
		a[v1alpha1.AnnotationKVReplay] = joinPorts(p.Replay)
	}
	if t := TRTLLMTopic(m); t != "" {
		a[v1alpha1.AnnotationKVTopic] = t
	}
	return a
}

func engineContainerPorts(m *v1alpha1.KVRoutedModel, p Ports) []corev1.ContainerPort {
	out := []corev1.ContainerPort{{Name: "http", ContainerPort: m.Spec.Engine.Port, Protocol: corev1.ProtocolTCP}}
	for r, port := range p.Events {
		out = append(out, corev1.ContainerPort{Name: fmt.Sprintf("kv-events-%d", r), ContainerPort: port, Protocol: corev1.ProtocolTCP})
	}
	for r, port := range p.Replay {
		out = append(out, corev1.ContainerPort{Name: fmt.Sprintf("kv-replay-%d", r), ContainerPort: port, Protocol: corev1.ProtocolTCP})
	}
	return out
}

// engineEnv: POD_IP for the topic, PYTHONHASHSEED for deterministic block hashes, HOME on the
// writable emptyDir, HF_HOME on the model cache's claim, HF_TOKEN and VLLM_API_KEY from their secrets; user variables replace ours
// by name, except POD_IP, PYTHONHASHSEED and VLLM_API_KEY (the CRD refuses the last two),
// which routing depends on.
//
// The API key goes in as VLLM_API_KEY, not as --api-key: vLLM reads the variable when the flag
// is absent (vllm/envs.py; vllm/entrypoints/openai/api_server.py takes args.api_key or
// [VLLM_API_KEY]), and a flag — even --api-key=$(VAR) — would put the key in the process's
// arguments, which `ps` and /proc show on the node.
func engineEnv(m *v1alpha1.KVRoutedModel) []corev1.EnvVar {
	env := []corev1.EnvVar{
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}},
		{Name: "PYTHONHASHSEED", Value: m.Spec.Engine.HashSeed},
		{Name: "HOME", Value: engineHome},
	}
	if m.Spec.Model.Cache != nil {
		// Hugging Face downloads (hub/) and token lookups go to the cache; vLLM's own compile
		// caches stay under HOME.
		env = append(env, corev1.EnvVar{Name: "HF_HOME", Value: ModelCacheMountPath})
	}
	if ref := m.Spec.Model.AuthSecretRef; ref != nil {
		env = append(env, corev1.EnvVar{Name: "HF_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: ref.DeepCopy()}})
	}
	if ref := m.Spec.Engine.APIKeySecretRef; ref != nil {
		env = append(env, corev1.EnvVar{Name: EngineAPIKeyEnv, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: ref.DeepCopy()}})
	}
	for _, u := range m.Spec.Engine.Env {
		if u.Name == "POD_IP" || u.Name == "PYTHONHASHSEED" || u.Name == EngineAPIKeyEnv {
			continue
		}
		replaced := false
		for i := range env {
			if env[i].Name == u.Name {
				env[i], replaced = *u.DeepCopy(), true
			}
		}
		if !replaced {
			env = append(env, *u.DeepCopy())
		}
	}
	return env
}

// withEnv appends the engine kind's variables to env, in place of any user variable of the
// same name: the kind's are what its command line depends on.
func withEnv(env, kind []corev1.EnvVar) []corev1.EnvVar {
	for _, k := range kind {
		env = slices.DeleteFunc(env, func(e corev1.EnvVar) bool { return e.Name == k.Name })
	}
	return append(env, kind...)
}

// engineResources copies the user's resources and, when neither requests nor limits name a
// GPU, asks for tensor x dataLocal of them (extended resources need requests == limits).
func engineResources(m *v1alpha1.KVRoutedModel) corev1.ResourceRequirements {
	r := *m.Spec.Engine.Resources.DeepCopy()
	_, inReq := r.Requests[GPUResource]
	_, inLim := r.Limits[GPUResource]
	if inReq || inLim {
		return r
	}
	n := resource.NewQuantity(int64(m.Spec.Engine.Parallelism.Tensor*m.Spec.Engine.Parallelism.DataLocal), resource.DecimalSI)
	if r.Requests == nil {
		r.Requests = corev1.ResourceList{}
	}
	if r.Limits == nil {
		r.Limits = corev1.ResourceList{}
	}
	r.Requests[GPUResource] = *n
	r.Limits[GPUResource] = n.DeepCopy()
	return r
}

func healthProbe(path string, port int32, period, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: path, Port: intstr.FromInt32(port), Scheme: corev1.URISchemeHTTP}},
		PeriodSeconds:    period,
		TimeoutSeconds:   5,
		SuccessThreshold: 1,
		FailureThreshold: failures,
	}
}

// EngineService is the headless Service of the engine pods: stable DNS per pod, and the
// ports named as on the container.
func EngineService(m *v1alpha1.KVRoutedModel) *corev1.Service {
	var ports []corev1.ServicePort
	for _, cp := range engineContainerPorts(m, EnginePorts(m)) {
		ports = append(ports, corev1.ServicePort{Name: cp.Name, Port: cp.ContainerPort, TargetPort: intstr.FromString(cp.Name), Protocol: corev1.ProtocolTCP})
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: objectMeta(m, EngineName(m), v1alpha1.ComponentEngine),
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: corev1.ClusterIPNone,
			Selector:  EngineSelector(m),
			Ports:     ports,
		},
	}
}

func itoa(v int32) string { return strconv.FormatInt(int64(v), 10) }

func joinPorts(ps []int32) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = itoa(p)
	}
	return strings.Join(s, ",")
}

// merge returns user entries overlaid by ours (ours win on a clash).
func merge(user, ours map[string]string) map[string]string {
	out := make(map[string]string, len(user)+len(ours))
	for k, v := range user {
		out[k] = v
	}
	for k, v := range ours {
		out[k] = v
	}
	return out
}

func copyMap(in map[string]string) map[string]string {
	if len(in) == 0 {
		return nil
	}
	return merge(in, nil)
}

func copyTolerations(in []corev1.Toleration) []corev1.Toleration {
	if in == nil {
		return nil
	}
	out := make([]corev1.Toleration, len(in))
	for i := range in {
		in[i].DeepCopyInto(&out[i])
	}
	return out
}

func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	return ptr(*p)
}

// overlayPodSecurity sets on ours every field the user set (the CRD keeps them within the
// restricted Pod Security profile).
func overlayPodSecurity(ours *corev1.PodSecurityContext, user *v1alpha1.PodSecurityOverrides) *corev1.PodSecurityContext {
	out, u := ours.DeepCopy(), user.DeepCopy()
	if u.SELinuxOptions != nil {
		out.SELinuxOptions = u.SELinuxOptions
	}
	if u.RunAsUser != nil {
		out.RunAsUser = u.RunAsUser
	}
	if u.RunAsGroup != nil {
		out.RunAsGroup = u.RunAsGroup
	}
	if u.RunAsNonRoot != nil {
		out.RunAsNonRoot = u.RunAsNonRoot
	}
	if u.SupplementalGroups != nil {
		out.SupplementalGroups = u.SupplementalGroups
	}
	if u.FSGroup != nil {
		out.FSGroup = u.FSGroup
	}
	if u.Sysctls != nil {
		out.Sysctls = u.Sysctls
	}
	if u.FSGroupChangePolicy != nil {
		out.FSGroupChangePolicy = u.FSGroupChangePolicy
	}
	if u.SeccompProfile != nil {
		out.SeccompProfile = u.SeccompProfile
	}
	if u.AppArmorProfile != nil {
		out.AppArmorProfile = u.AppArmorProfile
	}
	return out
}

// overlayContainerSecurity sets on ours every field the user set. Capabilities merge: ALL
// stays dropped, and the user's additions (NET_BIND_SERVICE at most, per the CRD) are added.
func overlayContainerSecurity(ours *corev1.SecurityContext, user *v1alpha1.ContainerSecurityOverrides) *corev1.SecurityContext {
	out, u := ours.DeepCopy(), user.DeepCopy()
	if u.Capabilities != nil && len(u.Capabilities.Add) > 0 {
		out.Capabilities.Add = u.Capabilities.Add
	}
	if u.Privileged != nil {
		out.Privileged = u.Privileged
	}
	if u.SELinuxOptions != nil {
		out.SELinuxOptions = u.SELinuxOptions
	}
	if u.RunAsUser != nil {
		out.RunAsUser = u.RunAsUser
	}
	if u.RunAsGroup != nil {
		out.RunAsGroup = u.RunAsGroup
	}
	if u.RunAsNonRoot != nil {
		out.RunAsNonRoot = u.RunAsNonRoot
	}
	if u.ReadOnlyRootFilesystem != nil {
		out.ReadOnlyRootFilesystem = u.ReadOnlyRootFilesystem
	}
	if u.AllowPrivilegeEscalation != nil {
		out.AllowPrivilegeEscalation = u.AllowPrivilegeEscalation
	}
	if u.ProcMount != nil {
		out.ProcMount = u.ProcMount
	}
	if u.SeccompProfile != nil {
		out.SeccompProfile = u.SeccompProfile
	}
	if u.AppArmorProfile != nil {
		out.AppArmorProfile = u.AppArmorProfile
	}
	return out
}

// userVolume turns a spec.engine.pod.volumes entry into the pod's volume.
func userVolume(v *v1alpha1.EngineVolume) corev1.Volume {
	out := corev1.Volume{Name: v.Name}
	switch {
	case v.ConfigMap != nil:
		out.ConfigMap = &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: v.ConfigMap.Name},
			Optional:             copyPtr(v.ConfigMap.Optional),
			DefaultMode:          copyPtr(v.ConfigMap.DefaultMode),
		}
	case v.Secret != nil:
		out.Secret = &corev1.SecretVolumeSource{
			SecretName:  v.Secret.SecretName,
			Optional:    copyPtr(v.Secret.Optional),
			DefaultMode: copyPtr(v.Secret.DefaultMode),
		}
	case v.PersistentVolumeClaim != nil:
		out.PersistentVolumeClaim = v.PersistentVolumeClaim.DeepCopy()
	case v.EmptyDir != nil:
		out.EmptyDir = v.EmptyDir.DeepCopy()
	case v.CSI != nil:
		out.CSI = &corev1.CSIVolumeSource{
			Driver:               v.CSI.Driver,
			ReadOnly:             copyPtr(v.CSI.ReadOnly),
			VolumeAttributes:     copyMap(v.CSI.VolumeAttributes),
			NodePublishSecretRef: copyPtr(v.CSI.NodePublishSecretRef),
		}
	}
	return out
}

// engineVolumes returns the engine pod's volumes and adds their mounts to the container: the
// operator's (home, /dev/shm for tensor parallelism, pvc:// models, the model cache), then the
// user's (the CRD keeps their names and paths apart from the operator's).
func engineVolumes(m *v1alpha1.KVRoutedModel, container *corev1.Container) []corev1.Volume {
	volumes := []corev1.Volume{{Name: "home", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	if m.Spec.Engine.Parallelism.Tensor > 1 || m.Spec.Engine.SharedMemorySize != nil {
		// NCCL between tensor-parallel workers needs more than the runtime's 64 MiB /dev/shm.
		volumes = append(volumes, corev1.Volume{Name: "dshm", VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: m.Spec.Engine.SharedMemorySize}}})
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: "dshm", MountPath: "/dev/shm"})
	}
	for i, claim := range claims(m) {
		name := "pvc-" + strconv.Itoa(i)
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: true}}})
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: pvcMountRoot + "/" + claim, ReadOnly: true})
	}

	if claim := ModelCacheClaimName(m); claim != "" {
		volumes = append(volumes, corev1.Volume{Name: ModelCacheVolume, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: ModelCacheVolume, MountPath: ModelCacheMountPath})
	}
	pod := m.Spec.Engine.Pod
	// The user's volumes and mounts come after the operator's; the CRD keeps their names and
	// paths apart.
	for i := range pod.Volumes {
		volumes = append(volumes, userVolume(&pod.Volumes[i]))
	}
	for _, vm := range pod.VolumeMounts {
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: vm.Name, MountPath: vm.MountPath, SubPath: vm.SubPath, ReadOnly: vm.ReadOnly})
	}
	return volumes
}

// engineTopologySpread renders the user's spread constraints over one pool's pods.
func engineTopologySpread(m *v1alpha1.KVRoutedModel, selector map[string]string) []corev1.TopologySpreadConstraint {
	var out []corev1.TopologySpreadConstraint
	for _, t := range m.Spec.Engine.Pod.TopologySpreadConstraints {
		out = append(out, corev1.TopologySpreadConstraint{
			MaxSkew:           t.MaxSkew,
			TopologyKey:       t.TopologyKey,
			WhenUnsatisfiable: t.WhenUnsatisfiable,
			MinDomains:        copyPtr(t.MinDomains),
			LabelSelector:     &metav1.LabelSelector{MatchLabels: selector},
			// Spread each revision on its own, so a rollout's surge pod is not counted against
			// the pods it replaces.
			MatchLabelKeys: []string{appsv1.DefaultDeploymentUniqueLabelKey},
		})
	}
	return out
}

// engineStrategy is the engine Deployment's rollout.
func engineStrategy(m *v1alpha1.KVRoutedModel) appsv1.DeploymentStrategy {
	// Never take a serving replica down before its replacement is Ready, unless the cache's
	// claim attaches to one node only: the replacement could not mount it while the old pod
	// holds it (and with maxUnavailable 0 the rollout would wait forever), so the old pod goes
	// first.
	strategy := appsv1.DeploymentStrategy{
		Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{
			MaxUnavailable: ptr(intstr.FromInt32(0)),
			MaxSurge:       ptr(intstr.FromInt32(1)),
		},
	}
	if cacheSingleNode(m) {
		strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	}
	return strategy
}
