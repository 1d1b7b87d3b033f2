package render

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// NIXL's side channel comes from the environment (vllm/envs.py): the host a prefill engine
// answers with as remote_host and binds its handshake listener on, and rank 0's port.
const (
	SideChannelHostEnv = "VLLM_NIXL_SIDE_CHANNEL_HOST"
	SideChannelPortEnv = "VLLM_NIXL_SIDE_CHANNEL_PORT"
	// ConnectorNIXL is the default connector, the one whose side channel the operator wires.
	ConnectorNIXL = "NixlConnector"
)

// Disaggregated reports whether m splits its engines into prefill and decode pools.
func Disaggregated(m *v1alpha1.KVRoutedModel) bool { return m.Spec.Disaggregation != nil }

// PrefillName is the prefill pool's Deployment (and its policy, budget and autoscaler).
func PrefillName(m *v1alpha1.KVRoutedModel) string { return m.Name + "-prefill" }

// PrefillSelector selects the prefill pool's pods. Their component differs from the decode
// pool's, so neither Deployment selects the other's pods and the engine Deployment keeps the
// selector it had before the model was split (a Deployment's selector cannot change).
func PrefillSelector(m *v1alpha1.KVRoutedModel) map[string]string {
	return map[string]string{
		v1alpha1.LabelPartOf:    v1alpha1.PartOfValue,
		v1alpha1.LabelComponent: v1alpha1.ComponentPrefill,
		v1alpha1.LabelModel:     m.Name,
	}
}

// PrefillSelectorString is PrefillSelector in kubectl syntax.
func PrefillSelectorString(m *v1alpha1.KVRoutedModel) string {
	return labels.SelectorFromSet(PrefillSelector(m)).String()
}

// DiscoverySelectorString selects every engine pod the router routes to: both pools when
// split (each pod's serving.kvroute.io/role tells which), else the engine pods.
func DiscoverySelectorString(m *v1alpha1.KVRoutedModel) string {
	if !Disaggregated(m) {
		return EngineSelectorString(m)
	}
	sel := labels.SelectorFromSet(map[string]string{v1alpha1.LabelPartOf: v1alpha1.PartOfValue, v1alpha1.LabelModel: m.Name})
	req, err := labels.NewRequirement(v1alpha1.LabelComponent, selection.In,
		[]string{v1alpha1.ComponentEngine, v1alpha1.ComponentPrefill})
	if err != nil {
		panic(err) // constant, valid label values
	}
	return sel.Add(*req).String()
}

// KVTransferConfigJSON is both pools' --kv-transfer-config. kv_both on each side, as vLLM's
// NIXL examples run it: the role of a request comes from its kv_transfer_params, and a decode
// engine computes the prompts of requests the router does not split.
func KVTransferConfigJSON(m *v1alpha1.KVRoutedModel) string {
	return fmt.Sprintf(`{"kv_connector":%q,"kv_role":"kv_both"}`, m.Spec.Disaggregation.Connector)
}

// SideChannelPorts are the NIXL handshake ports per DP rank of a pool with dataLocal ranks
// (empty unless the connector is NIXL).
func SideChannelPorts(m *v1alpha1.KVRoutedModel, dataLocal int32) []int32 {
	d := m.Spec.Disaggregation
	if d == nil || d.Connector != ConnectorNIXL {
		return nil
	}
	out := make([]int32, dataLocal)
	for r := range out {
		out[r] = d.SideChannelPort + int32(r)
	}
	return out
}

func sideChannelContainerPorts(m *v1alpha1.KVRoutedModel) []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for r, p := range SideChannelPorts(m, m.Spec.Engine.Parallelism.DataLocal) {
		out = append(out, corev1.ContainerPort{Name: fmt.Sprintf("kv-side-%d", r), ContainerPort: p, Protocol: corev1.ProtocolTCP})
	}
	return out
}

// sideChannelEnv points NIXL's side channel at the pod's own IP, which is what a decoder
// dials (vLLM's default, localhost, is unreachable from another pod).
func sideChannelEnv(m *v1alpha1.KVRoutedModel) []corev1.EnvVar {
	if len(SideChannelPorts(m, 1)) == 0 {
		return nil
	}
	return []corev1.EnvVar{
		{Name: SideChannelHostEnv, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}},
		{Name: SideChannelPortEnv, Value: itoa(m.Spec.Disaggregation.SideChannelPort)},
	}
}

// enginePool is what differs between the two pools' Deployments.
type enginePool struct {
	name, component string
	selector        map[string]string
	podLabels       map[string]string
	replicas        *int32 // nil: an autoscaler owns the Deployment's replicas
}

func decodePool(m *v1alpha1.KVRoutedModel) enginePool {
	role := ""
	if Disaggregated(m) {
		role = v1alpha1.RoleDecode
	}
	return enginePool{name: EngineName(m), component: v1alpha1.ComponentEngine, selector: EngineSelector(m),
		podLabels: enginePodLabels(m, v1alpha1.ComponentEngine, role), replicas: m.Spec.Replicas}
}

// prefillModel is m with the prefill pool's changes applied to spec.engine.
func prefillModel(m *v1alpha1.KVRoutedModel) *v1alpha1.KVRoutedModel {
	pm := m.DeepCopy()
	p := &pm.Spec.Disaggregation.Prefill
	if p.Parallelism != nil {
		if p.Parallelism.Tensor > 0 {
			pm.Spec.Engine.Parallelism.Tensor = p.Parallelism.Tensor
		}
		if p.Parallelism.DataLocal > 0 {
			pm.Spec.Engine.Parallelism.DataLocal = p.Parallelism.DataLocal
		}
	}
	if p.Resources != nil {
		pm.Spec.Engine.Resources = corev1.ResourceRequirements{Limits: p.Resources.Limits.DeepCopy(), Requests: p.Resources.Requests.DeepCopy()}
	}
	pm.Spec.Engine.Args = append(pm.Spec.Engine.Args, p.Args...)
	return pm
}

// PrefillDeployment renders the prefill pool; nil without spec.disaggregation. Its replicas
// are spec.disaggregation.prefill.replicas, or left to the pool's autoscaler (the operator
// then applies no replicas field, so the HPA is that field's only writer).
func PrefillDeployment(m *v1alpha1.KVRoutedModel, opts Options) (*appsv1.Deployment, error) {
	if !Disaggregated(m) {
		return nil, nil
	}
	if err := CheckDefaulted(m); err != nil {
		return nil, err
	}
	p := &m.Spec.Disaggregation.Prefill
	pl := enginePool{name: PrefillName(m), component: v1alpha1.ComponentPrefill, selector: PrefillSelector(m),
		podLabels: enginePodLabels(m, v1alpha1.ComponentPrefill, v1alpha1.RolePrefill), replicas: p.Replicas}
	if p.Autoscaling != nil {
		pl.replicas = nil
	}
	return poolDeployment(prefillModel(m), opts, pl)
}

// PrefillNetworkPolicy guards the prefill pods as NetworkPolicy guards the decode pods, and
// admits the decode pods on every port: a decoder dials the side channel, and the NIXL/UCX
// transfer itself uses ports the transport picks. Nil when policies are off or not split.
func PrefillNetworkPolicy(m *v1alpha1.KVRoutedModel) *networkingv1.NetworkPolicy {
	if !Disaggregated(m) {
		return nil
	}
	np := NetworkPolicy(prefillModel(m))
	if np == nil {
		return nil
	}
	np.Name = PrefillName(m)
	np.Labels = childLabels(m, v1alpha1.ComponentPrefill)
	np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: PrefillSelector(m)}
	// NetworkPolicy's last rule admits the other pool: here, the decode pods.
	last := &np.Spec.Ingress[len(np.Spec.Ingress)-1]
	last.From = []networkingv1.NetworkPolicyPeer{podsLabelled(EngineSelector(m))}
	return np
}

// PrefillPodDisruptionBudget lets drains take one prefill pod at a time.
func PrefillPodDisruptionBudget(m *v1alpha1.KVRoutedModel) *policyv1.PodDisruptionBudget {
	if !Disaggregated(m) {
		return nil
	}
	pdb := PodDisruptionBudget(m)
	pdb.Name = PrefillName(m)
	pdb.Labels = childLabels(m, v1alpha1.ComponentPrefill)
	pdb.Spec.Selector = &metav1.LabelSelector{MatchLabels: PrefillSelector(m)}
	return pdb
}

// PrefillAutoscaler is an HPA on the prefill Deployment itself: the KVRoutedModel has one
// /scale, which is the decode pool's (every request ends on a decode replica, split or not,
// so it is the model's replicas in the sense HPA, KEDA and `kubectl scale` already use), and
// the Deployment's own /scale is the standard way to scale a second workload. Nil without
// spec.disaggregation.prefill.autoscaling.
func PrefillAutoscaler(m *v1alpha1.KVRoutedModel) *autoscalingv2.HorizontalPodAutoscaler {
	if !Disaggregated(m) || m.Spec.Disaggregation.Prefill.Autoscaling == nil {
		return nil
	}
	a := m.Spec.Disaggregation.Prefill.Autoscaling
	target := a.TargetQueuePerReplica.DeepCopy()
	return &autoscalingv2.HorizontalPodAutoscaler{
		TypeMeta:   metav1.TypeMeta{APIVersion: "autoscaling/v2", Kind: "HorizontalPodAutoscaler"},
		ObjectMeta: objectMeta(m, PrefillName(m), v1alpha1.ComponentPrefill),
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: PrefillName(m)},
			MinReplicas:    copyPtr(a.MinReplicas),
			MaxReplicas:    a.MaxReplicas,
			Metrics: []autoscalingv2.MetricSpec{{
				Type: autoscalingv2.PodsMetricSourceType,
				Pods: &autoscalingv2.PodsMetricSource{
					Metric: autoscalingv2.MetricIdentifier{Name: QueueMetric},
					Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: &target},
				},
			}},
			Behavior: DefaultBehavior(),
		},
	}
}
