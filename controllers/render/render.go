// Package render turns a KVRoutedModel into its child objects. Every function here is pure:
// a defaulted model and Options in, a typed object with TypeMeta set out, no API calls. The
// reconciler applies the results with server-side apply; `kvroutectl render` prints them.
//
// The model must already carry its schema defaults (read from the API server, or passed
// through api/v1alpha1/validation): the defaults live once, in the CRD, so a missing one is
// reported as an error here rather than guessed.
package render

import (
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// Options are the operator-level settings that are not in the resource.
type Options struct {
	// DefaultEngineImage is used when spec.engine.image is empty (--default-engine-image).
	DefaultEngineImage string
	// DefaultRouterImage is used when spec.router.image is empty (--default-router-image).
	DefaultRouterImage string
}

// Fixed router ports inside its pod; the Service maps spec.router.service.port to "http".
const (
	RouterHTTPPort  = 8000
	RouterAdminPort = 9090
	// RouterConfigKey is the ConfigMap key (and file name) kvrouter reads with --config.
	RouterConfigKey = "config.yaml"
	RouterConfigDir = "/etc/kvrouter"
	// GPUResource is what the engine requests when the user names no GPU.
	GPUResource = "nvidia.com/gpu"
	// EngineAPIKeyEnv is the variable vLLM reads its API key from; RouterAPIKeyEnv is where
	// the router reads the same key (config engineAuth.apiKeyEnv). Both come from
	// spec.engine.apiKeySecretRef through the kubelet.
	EngineAPIKeyEnv = "VLLM_API_KEY"
	RouterAPIKeyEnv = "KVROUTER_ENGINE_API_KEY"
)

// Names of the children, derived from the resource's name (at most 50 characters, so every
// child name stays a valid DNS-1035 label).
func EngineName(m *v1alpha1.KVRoutedModel) string     { return m.Name + "-engine" }
func RouterName(m *v1alpha1.KVRoutedModel) string     { return m.Name + "-router" }
func AutoscalerName(m *v1alpha1.KVRoutedModel) string { return m.Name }

// EventsServiceName is the ClusterIP Service engines dial with EnginesConnect: the router's
// events port only, apart from the router Service (which may be a LoadBalancer).
func EventsServiceName(m *v1alpha1.KVRoutedModel) string { return m.Name + "-events" }

// EngineSelector selects the engine pods; its string form is status.selector (/scale).
func EngineSelector(m *v1alpha1.KVRoutedModel) map[string]string {
	return map[string]string{
		v1alpha1.LabelPartOf:    v1alpha1.PartOfValue,
		v1alpha1.LabelComponent: v1alpha1.ComponentEngine,
		v1alpha1.LabelModel:     m.Name,
	}
}

// EngineSelectorString is EngineSelector in kubectl syntax.
func EngineSelectorString(m *v1alpha1.KVRoutedModel) string {
	return labels.SelectorFromSet(EngineSelector(m)).String()
}

// RouterSelector selects the router pods.
func RouterSelector(m *v1alpha1.KVRoutedModel) map[string]string {
	return map[string]string{
		v1alpha1.LabelPartOf:    v1alpha1.PartOfValue,
		v1alpha1.LabelComponent: v1alpha1.ComponentRouter,
		v1alpha1.LabelModel:     m.Name,
	}
}

// childLabels are the labels on every child object's metadata. The resource's own labels are
// never copied: GitOps tools track objects by them.
func childLabels(m *v1alpha1.KVRoutedModel, component string) map[string]string {
	l := map[string]string{
		v1alpha1.LabelPartOf:    v1alpha1.PartOfValue,
		v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue,
		v1alpha1.LabelInstance:  m.Name,
		v1alpha1.LabelModel:     m.Name,
	}
	if component != "" {
		l[v1alpha1.LabelComponent] = component
	}
	return l
}

// objectMeta is the metadata of a child: name, namespace, our labels, and a controller
// owner reference once the resource has a UID (offline rendering has none).
func objectMeta(m *v1alpha1.KVRoutedModel, name, component string) metav1.ObjectMeta {
	om := metav1.ObjectMeta{Name: name, Namespace: m.Namespace, Labels: childLabels(m, component)}
	if m.UID != "" {
		om.OwnerReferences = []metav1.OwnerReference{{
			APIVersion:         v1alpha1.GroupVersion.String(),
			Kind:               v1alpha1.Kind,
			Name:               m.Name,
			UID:                m.UID,
			Controller:         ptr(true),
			BlockOwnerDeletion: ptr(true),
		}}
	}
	return om
}

// All renders every child in a stable order: router config and RBAC, engine Service, the
// model cache's claim when the operator creates it, engine Deployment and disruption budget, network policy, router Deployment and Service, with
// EnginesConnect the events Service and the router's network policy, with mode EndpointPicker
// the InferencePool, and the autoscaler.
// Children switched off by the spec (network policies, events Service, autoscaler) are absent.
func All(m *v1alpha1.KVRoutedModel, opts Options) ([]client.Object, error) {
	if err := CheckDefaulted(m); err != nil {
		return nil, err
	}
	cm, err := RouterConfigMap(m)
	if err != nil {
		return nil, err
	}
	engine, err := EngineDeployment(m, opts)
	if err != nil {
		return nil, err
	}
	router, err := RouterDeployment(m, opts)
	if err != nil {
		return nil, err
	}
	objs := []client.Object{cm, ServiceAccount(m), Role(m), RoleBinding(m), EngineService(m)}
	if pvc := ModelCachePVC(m); pvc != nil {
		objs = append(objs, pvc)
	}
	objs = append(objs, engine, PodDisruptionBudget(m))
	if np := NetworkPolicy(m); np != nil {
		objs = append(objs, np)
	}
	prefill, err := PrefillDeployment(m, opts)
	if err != nil {
		return nil, err
	}
	if prefill != nil {
		objs = append(objs, prefill, PrefillPodDisruptionBudget(m))
		if np := PrefillNetworkPolicy(m); np != nil {
			objs = append(objs, np)
		}
		if hpa := PrefillAutoscaler(m); hpa != nil {
			objs = append(objs, hpa)
		}
	}
	objs = append(objs, router, RouterService(m))
	if svc := RouterPeersService(m); svc != nil {
		objs = append(objs, svc)
	}
	if pdb := RouterPodDisruptionBudget(m); pdb != nil {
		objs = append(objs, pdb)
	}
	if svc := EventsService(m); svc != nil {
		objs = append(objs, svc)
	}
	if np := RouterNetworkPolicy(m); np != nil {
		objs = append(objs, np)
	}
	pool, err := InferencePool(m)
	if err != nil {
		return nil, err
	}
	if pool != nil {
		objs = append(objs, pool)
	}
	if a := m.Spec.Autoscaling; a != nil {
		switch a.Provider {
		case "HPA":
			objs = append(objs, HorizontalPodAutoscaler(m))
		case "KEDA":
			so, err := ScaledObject(m)
			if err != nil {
				return nil, err
			}
			objs = append(objs, so)
		default:
			return nil, fmt.Errorf("spec.autoscaling.provider %q is neither HPA nor KEDA", a.Provider)
		}
	}
	return objs, nil
}

// CheckDefaulted reports schema defaults missing from m, which means m did not come from the
// API server or the offline validator.
func CheckDefaulted(m *v1alpha1.KVRoutedModel) error {
	var missing []error
	need := func(ok bool, path string) {
		if !ok {
			missing = append(missing, fmt.Errorf("%s is unset", path))
		}
	}
	if m.Name == "" {
		return errors.New("metadata.name is empty")
	}
	if m.Namespace == "" {
		return errors.New("metadata.namespace is empty")
	}
	s := &m.Spec
	e := &s.Engine
	need(s.Model.Name != "" && s.Model.URI != "", "spec.model.name/uri")
	need(s.Replicas != nil, "spec.replicas")
	need(e.Port != 0, "spec.engine.port")
	need(e.Parallelism.Tensor > 0 && e.Parallelism.DataLocal > 0, "spec.engine.parallelism")
	need(e.BlockSize != 0, "spec.engine.blockSize")
	need(e.HashAlgo != "", "spec.engine.hashAlgo")
	need(e.HashSeed != "", "spec.engine.hashSeed")
	need(e.KVEvents.Enabled != nil, "spec.engine.kvEvents.enabled")
	need(e.KVEvents.BasePort != 0, "spec.engine.kvEvents.basePort")
	need(e.KVEvents.ReplayBasePort != nil, "spec.engine.kvEvents.replayBasePort")
	need(e.KVEvents.TopicPrefix != "", "spec.engine.kvEvents.topicPrefix")
	need(e.KVEvents.HWM != nil, "spec.engine.kvEvents.hwm")
	need(e.KVEvents.BufferSteps != 0, "spec.engine.kvEvents.bufferSteps")
	need(s.Router.Service.Port != 0 && s.Router.Service.Type != "", "spec.router.service")
	need(s.Router.Policy != "", "spec.router.policy")
	need(s.Router.Warmup.Duration != nil && s.Router.Warmup.Credit.IsSet(), "spec.router.warmup")
	need(s.NetworkPolicy.Enabled != nil, "spec.networkPolicy.enabled")
	if d := s.Disaggregation; d != nil {
		need(d.Connector != "" && d.SideChannelPort != 0 && d.Prefill.Replicas != nil, "spec.disaggregation.connector/sideChannelPort/prefill.replicas")
		if a := d.Prefill.Autoscaling; a != nil {
			need(a.MinReplicas != nil && a.TargetQueuePerReplica != nil, "spec.disaggregation.prefill.autoscaling.minReplicas/targetQueuePerReplica")
		}
	}
	if a := s.Autoscaling; a != nil {
		need(a.MinReplicas != nil, "spec.autoscaling.minReplicas")
		need(a.TargetQueuePerReplica != nil, "spec.autoscaling.targetQueuePerReplica")
		need(a.TargetBacklogPerReplica != nil, "spec.autoscaling.targetBacklogPerReplica")
		if a.KEDA != nil {
			need(a.KEDA.PollingInterval != nil && a.KEDA.CooldownPeriod != nil, "spec.autoscaling.keda.pollingInterval/cooldownPeriod")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("KVRoutedModel %s/%s is not defaulted (read it from the API server or admit it with api/v1alpha1/validation): %w",
			m.Namespace, m.Name, errors.Join(missing...))
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
