package render

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/router/config"
)

// RouterContainer is the router's container name.
const RouterContainer = "kvrouter"

const routerUID = 65532

// RouterDrainDelay is how long a stopping router keeps serving, not ready, after SIGTERM: the
// time for the endpoint change to reach every node's proxy (a second or two on a busy cluster).
const RouterDrainDelay = 5 * time.Second

// RouterTerminationGrace is the router pod's terminationGracePeriodSeconds: the drain delay,
// then the requests in flight (config shutdown.timeout, 5 s short of it so the process exits
// before the kubelet's SIGKILL).
const RouterTerminationGrace = 30 * time.Second

// RouterConfig is the kvrouter configuration for this model: Kubernetes discovery of the
// engine pods (ports and block size from their annotations), the engines' hashing, the
// policy and warm-up. Admin listens on all interfaces so Prometheus can scrape /metrics.
func RouterConfig(m *v1alpha1.KVRoutedModel) (config.Config, error) {
	e := &m.Spec.Engine
	c := config.Default()
	c.Listen = fmt.Sprintf(":%d", RouterHTTPPort)
	c.AdminListen = fmt.Sprintf(":%d", RouterAdminPort)
	c.Policy = m.Spec.Router.Policy
	c.BlockSize = int(e.BlockSize)
	c.Hash = config.Hash{Algo: e.HashAlgo, Seed: e.HashSeed}
	c.Discovery = &config.Discovery{Kubernetes: config.DefaultKubernetesDiscovery(m.Namespace, DiscoverySelectorString(m), int(e.Port))}
	if EndpointPicker(m) {
		// The picker follows the pool the gateway routes to, so both see the same endpoints.
		c.Discovery = &config.Discovery{InferencePool: &config.InferencePoolDiscovery{Namespace: m.Namespace, Name: InferencePoolName(m)}}
		c.ExtProc = &config.ExtProc{Listen: fmt.Sprintf(":%d", RouterGRPCPort), TLS: pickerTLSConfig(m)}
	}
	c.Warmup = config.Warmup{Duration: *m.Spec.Router.Warmup.Duration, Credit: m.Spec.Router.Warmup.Credit.Float64()}
	if to := m.Spec.Router.Timeouts; to != nil {
		for _, f := range []struct {
			from *metav1.Duration
			to   *metav1.Duration
		}{{to.Connect, &c.Limits.ConnectTimeout}, {to.HeaderRead, &c.Limits.HeaderReadTimeout}, {to.BodyRead, &c.Limits.BodyReadTimeout},
			{to.FirstToken, &c.Limits.FirstTokenTimeout}, {to.Idle, &c.Limits.IdleTimeout}, {to.Request, &c.Limits.RequestTimeout}} {
			if f.from != nil {
				*f.to = *f.from
			}
		}
	}
	c.Events = config.Events{
		Enabled:     *e.KVEvents.Enabled,
		TopicPrefix: e.KVEvents.TopicPrefix,
		HWM:         int(*e.KVEvents.HWM),
		Replay:      *e.KVEvents.Enabled && *e.KVEvents.ReplayBasePort != 0,
	}
	if EnginesConnect(m) {
		c.Events.Bind = fmt.Sprintf("tcp://*:%d", e.KVEvents.BasePort)
	}
	if e.APIKeySecretRef != nil {
		// The name of the variable, never the key: the ConfigMap is readable more widely
		// than the Secret.
		c.EngineAuth = &config.EngineAuth{APIKeyEnv: RouterAPIKeyEnv}
	}
	if a := m.Spec.Autoscaling; a != nil && a.MinReplicas != nil && *a.MinReplicas == 0 {
		// A model at zero replicas answers after a cold start (KEDA's activation, the pod's
		// scheduling, the engine's load), minutes: the hold waits that long.
		c.Hold.MaxWait = metav1.Duration{Duration: ScaleFromZeroHoldWait}
	}
	// A deleted router pod leaves the Service's endpoints only once every node's proxy has
	// seen the change: the router keeps serving (not ready) that long after SIGTERM, then
	// drains its requests within the pod's grace period (RouterTerminationGrace).
	c.Shutdown = config.Shutdown{DrainDelay: metav1.Duration{Duration: RouterDrainDelay},
		Timeout: metav1.Duration{Duration: RouterTerminationGrace - RouterDrainDelay - 5*time.Second}}
	c.ServedModelName = m.Spec.Model.Name
	c.KVCacheReportMode = m.Spec.Router.KVCacheReportMode
	c.Report = &config.Report{Namespace: m.Namespace, KVRoutedModel: m.Name}
	if cp := m.Spec.Router.Capture; cp != nil && cp.Enabled {
		c.Capture = &config.Capture{Enabled: true, Dir: RouterCaptureDir, MaxBytes: captureMaxBytes(cp), Files: int(captureFiles(cp))}
	}
	c.ShadowPolicy = m.Spec.Router.ShadowPolicy
	if a := m.Spec.Router.Audit; a != nil && a.Enabled {
		c.Audit = &config.Audit{Enabled: true, ShowText: a.ShowText}
		if a.SampleEvery != nil {
			c.Audit.SampleEvery = int(*a.SampleEvery)
		}
	}
	if d := m.Spec.Disaggregation; d != nil && d.MinUncachedTokens != nil {
		c.Disaggregation = &config.Disaggregation{MinUncachedTokens: int(*d.MinUncachedTokens)}
	}
	c.Peers = routerPeersConfig(m)
	if err := c.Validate(); err != nil {
		return config.Config{}, err
	}
	return c, nil
}

// RouterCaptureDir is where a router pod writes its capture files (spec.router.capture).
const RouterCaptureDir = "/var/lib/kvroute/capture"

func captureMaxBytes(cp *v1alpha1.RouterCaptureSpec) int64 {
	if cp.MaxBytes != nil {
		return *cp.MaxBytes
	}
	return config.DefaultCaptureMaxBytes
}

func captureFiles(cp *v1alpha1.RouterCaptureSpec) int32 {
	if cp.Files != nil {
		return *cp.Files
	}
	return config.DefaultCaptureFiles
}

// captureVolume is the capture directory's volume: the claim, or an emptyDir sized for the
// files kept plus the one being rotated in (the kubelet evicts a pod past its sizeLimit).
func captureVolume(cp *v1alpha1.RouterCaptureSpec) corev1.Volume {
	v := corev1.Volume{Name: "capture"}
	if cp.ClaimName != "" {
		v.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: cp.ClaimName}
		return v
	}
	limit := resource.NewQuantity(captureMaxBytes(cp)*int64(captureFiles(cp)+1), resource.BinarySI)
	v.EmptyDir = &corev1.EmptyDirVolumeSource{SizeLimit: limit}
	return v
}

// RouterConfigMap holds RouterConfig as config.yaml.
func RouterConfigMap(m *v1alpha1.KVRoutedModel) (*corev1.ConfigMap, error) {
	if err := CheckDefaulted(m); err != nil {
		return nil, err
	}
	c, err := RouterConfig(m)
	if err != nil {
		return nil, err
	}
	data, err := c.Marshal()
	if err != nil {
		return nil, err
	}
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: objectMeta(m, RouterName(m), v1alpha1.ComponentRouter),
		Data:       map[string]string{RouterConfigKey: string(data)},
	}, nil
}

// ConfigChecksum is the router pod template's checksum annotation value: a changed config
// changes the template, which rolls the router.
func ConfigChecksum(cm *corev1.ConfigMap) string {
	sum := sha256.Sum256([]byte(cm.Data[RouterConfigKey]))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// RouterDeployment renders the kvrouter Deployment.
func RouterDeployment(m *v1alpha1.KVRoutedModel, opts Options) (*appsv1.Deployment, error) {
	cm, err := RouterConfigMap(m)
	if err != nil {
		return nil, err
	}
	r := &m.Spec.Router
	image := r.Image
	if image == "" {
		image = opts.DefaultRouterImage
	}
	if image == "" {
		return nil, fmt.Errorf("spec.router.image is empty and the operator has no --default-router-image")
	}
	var res corev1.ResourceRequirements
	if r.Resources != nil {
		res = *r.Resources.DeepCopy()
	}
	podLabels := childLabels(m, v1alpha1.ComponentRouter)
	podLabels[v1alpha1.LabelName] = v1alpha1.RouterAppName
	probe := func(path string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromString("http"), Scheme: corev1.URISchemeHTTP}},
			PeriodSeconds: period, TimeoutSeconds: 2, SuccessThreshold: 1, FailureThreshold: failures,
		}
	}
	ports := []corev1.ContainerPort{
		{Name: "http", ContainerPort: RouterHTTPPort, Protocol: corev1.ProtocolTCP},
		{Name: "metrics", ContainerPort: RouterAdminPort, Protocol: corev1.ProtocolTCP},
	}
	if EnginesConnect(m) {
		ports = append(ports, corev1.ContainerPort{Name: eventsPortName, ContainerPort: m.Spec.Engine.KVEvents.BasePort, Protocol: corev1.ProtocolTCP})
	}
	// In picker mode too: the picker's gRPC health follows /readyz, and a kubelet gRPC probe
	// cannot speak the TLS the picker serves by default.
	readiness, liveness := probe("/readyz", 5, 3), probe("/healthz", 10, 3)
	if EndpointPicker(m) {
		ports = append(ports, corev1.ContainerPort{Name: grpcPortName, ContainerPort: RouterGRPCPort, Protocol: corev1.ProtocolTCP})
	}
	// POD_NAME keys this router's entry in status.routerReports: the pod's own name from the
	// downward API, which the operator compares with the live router pods (a hostname can be
	// set to anything in the pod spec).
	env := []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}}}
	if ref := m.Spec.Engine.APIKeySecretRef; ref != nil {
		// The kubelet resolves the Secret: the operator needs no access to it, and the key
		// is in neither the ConfigMap nor the arguments.
		env = append(env, corev1.EnvVar{Name: RouterAPIKeyEnv, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: ref.DeepCopy()}})
	}
	container := corev1.Container{
		Name:            RouterContainer,
		Image:           image,
		ImagePullPolicy: r.ImagePullPolicy,
		Args:            routerArgs(m),
		Ports:           ports,
		Env:             env,
		Resources:       res,
		VolumeMounts:    []corev1.VolumeMount{{Name: "config", MountPath: RouterConfigDir, ReadOnly: true}},
		ReadinessProbe:  readiness,
		LivenessProbe:   liveness,
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr(false),
			ReadOnlyRootFilesystem:   ptr(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	volumes := []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name}}}}}
	podSec := &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr(true),
		RunAsUser:      ptr(int64(routerUID)),
		RunAsGroup:     ptr(int64(routerUID)),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if cp := r.Capture; cp != nil && cp.Enabled {
		volumes = append(volumes, captureVolume(cp))
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: "capture", MountPath: RouterCaptureDir})
		if cp.ClaimName != "" {
			podSec.FSGroup = ptr(int64(routerUID)) // a claim's root directory is not writable by the router's user otherwise
		}
	}
	routerPeersPod(m, &container, &volumes)
	pickerTLSPod(m, &container, &volumes)
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: objectMeta(m, RouterName(m), v1alpha1.ComponentRouter),
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(RouterReplicas(m)),
			Selector: &metav1.LabelSelector{MatchLabels: RouterSelector(m)},
			Strategy: appsv1.DeploymentStrategy{
				Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{
					MaxUnavailable: ptr(intstr.FromInt32(0)),
					MaxSurge:       ptr(intstr.FromInt32(1)),
				},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      podLabels,
					Annotations: map[string]string{v1alpha1.AnnotationConfigChecksum: ConfigChecksum(cm)},
				},
				Spec: corev1.PodSpec{
					ServiceAccountName:            RouterName(m),
					Containers:                    []corev1.Container{container},
					Volumes:                       volumes,
					EnableServiceLinks:            ptr(false),
					TerminationGracePeriodSeconds: ptr(int64(RouterTerminationGrace / time.Second)),
					SecurityContext:               podSec,
					TopologySpreadConstraints:     routerSpread(m),
				},
			},
		},
	}, nil
}

// RouterService fronts the router pods; gateways point at it. In mode EndpointPicker it carries
// the picker's gRPC port (the pool's endpointPickerRef) instead of the API port, which the
// gateway does not use (it sends requests to the engine pods).
func RouterService(m *v1alpha1.KVRoutedModel) *corev1.Service {
	s := m.Spec.Router.Service
	ports := []corev1.ServicePort{
		{Name: "http", Port: s.Port, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP},
		{Name: "metrics", Port: RouterAdminPort, TargetPort: intstr.FromString("metrics"), Protocol: corev1.ProtocolTCP},
	}
	if EndpointPicker(m) {
		ports[0] = pickerServicePort()
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: objectMeta(m, RouterName(m), v1alpha1.ComponentRouter),
		Spec: corev1.ServiceSpec{
			Type:     s.Type,
			Selector: RouterSelector(m),
			Ports:    ports,
		},
	}
}

// eventsPortName names the router's bound events port (EnginesConnect).
const eventsPortName = "kv-events"

// EventsService is the ClusterIP Service the engines dial with EnginesConnect: the router's
// events port alone. The engines' kv-events endpoint names it; it is separate from the router
// Service, which may face outside the cluster, so events can only come from inside. Nil in
// RouterConnects mode.
func EventsService(m *v1alpha1.KVRoutedModel) *corev1.Service {
	if !EnginesConnect(m) {
		return nil
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: objectMeta(m, EventsServiceName(m), v1alpha1.ComponentRouter),
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: RouterSelector(m),
			Ports: []corev1.ServicePort{{Name: eventsPortName, Port: m.Spec.Engine.KVEvents.BasePort,
				TargetPort: intstr.FromString(eventsPortName), Protocol: corev1.ProtocolTCP}},
		},
	}
}

// RouterEndpoint is the in-cluster URL of the router Service (status.router.endpoint); in mode
// EndpointPicker, the picker's gRPC address.
func RouterEndpoint(m *v1alpha1.KVRoutedModel) string {
	if EndpointPicker(m) {
		return PickerEndpoint(m)
	}
	return fmt.Sprintf("http://%s.%s.svc:%d", RouterName(m), m.Namespace, m.Spec.Router.Service.Port)
}

// ServiceAccount is the router's identity.
func ServiceAccount(m *v1alpha1.KVRoutedModel) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: objectMeta(m, RouterName(m), v1alpha1.ComponentRouter),
	}
}

// Role lets the router discover engine pods in its own namespace and write its index report
// into its own model's status (status.routerReports), and nothing else. In mode
// EndpointPicker it also reads its one InferencePool: the router lists and watches it with a
// metadata.name field selector, which the API server authorizes against resourceNames
// (controllers TestEndpointPicker checks this on a real API server).
func Role(m *v1alpha1.KVRoutedModel) *rbacv1.Role {
	r := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: objectMeta(m, RouterName(m), v1alpha1.ComponentRouter),
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""},
			Resources: []string{"pods"},
			Verbs:     []string{"get", "list", "watch"},
		}, {
			APIGroups:     []string{v1alpha1.GroupVersion.Group},
			Resources:     []string{"kvroutedmodels/status"},
			ResourceNames: []string{m.Name},
			Verbs:         []string{"get", "patch"},
		}},
	}
	if EndpointPicker(m) {
		r.Rules = append(r.Rules, rbacv1.PolicyRule{
			APIGroups:     []string{InferencePoolGVK.Group},
			Resources:     []string{"inferencepools"},
			ResourceNames: []string{InferencePoolName(m)},
			Verbs:         []string{"get", "list", "watch"},
		})
	}
	return r
}

// RoleBinding grants Role to the router's ServiceAccount.
func RoleBinding(m *v1alpha1.KVRoutedModel) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: objectMeta(m, RouterName(m), v1alpha1.ComponentRouter),
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: RouterName(m)},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: RouterName(m), Namespace: m.Namespace}},
	}
}

// ScaleFromZeroHoldWait is how long the router holds a request for a model whose minReplicas
// is 0 (config hold.maxWait; 30s otherwise, a replica restarting).
const ScaleFromZeroHoldWait = 5 * time.Minute

// routerSpread spreads several router pods across nodes, so a lost node leaves a router (the
// PodDisruptionBudget covers drains). A preference, not a rule: a one-node cluster still runs
// them all. matchLabelKeys counts each ReplicaSet's pods apart, so a rolling update's new pods
// spread among themselves too. Nil with one router.
func routerSpread(m *v1alpha1.KVRoutedModel) []corev1.TopologySpreadConstraint {
	if !severalRouters(m) {
		return nil
	}
	return []corev1.TopologySpreadConstraint{{
		MaxSkew:           1,
		TopologyKey:       corev1.LabelHostname,
		WhenUnsatisfiable: corev1.ScheduleAnyway,
		LabelSelector:     &metav1.LabelSelector{MatchLabels: RouterSelector(m)},
		MatchLabelKeys:    []string{appsv1.DefaultDeploymentUniqueLabelKey},
	}}
}

// routerArgs are kvrouter's arguments: its config file, and for engines other than vLLM the
// engine kind (--engine-kind), which picks the event wire, tokenize endpoint and metrics names
// the router reads and makes it refuse an engine of another kind. A vLLM fleet's router is
// left as it was before kinds existed (vllm is kvrouter's default), so an operator upgrade
// does not roll every router.
func routerArgs(m *v1alpha1.KVRoutedModel) []string {
	args := []string{"--config", RouterConfigDir + "/" + RouterConfigKey}
	if k := EngineKind(m); k != v1alpha1.EngineVLLM {
		args = append(args, "--engine-kind", k)
	}
	return args
}
