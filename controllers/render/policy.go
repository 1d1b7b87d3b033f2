package render

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// NetworkPolicy guards the engine pods: the event and replay ports (which hand out the KV
// index and accept replay requests) from the router pods only; the HTTP/metrics port from the
// router and spec.networkPolicy.allowFrom. Nil when spec.networkPolicy.enabled is false.
func NetworkPolicy(m *v1alpha1.KVRoutedModel) *networkingv1.NetworkPolicy {
	if !*m.Spec.NetworkPolicy.Enabled {
		return nil
	}
	tcp := corev1.ProtocolTCP
	port := func(p int32) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: ptr(tcp), Port: ptr(intstr.FromInt32(p))}
	}
	http := port(m.Spec.Engine.Port)
	routerPorts := []networkingv1.NetworkPolicyPort{http}
	p := EnginePorts(m)
	for _, e := range append(append([]int32{}, p.Events...), p.Replay...) {
		routerPorts = append(routerPorts, port(e))
	}
	rules := []networkingv1.NetworkPolicyIngressRule{{
		From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: RouterSelector(m)}}},
		Ports: routerPorts,
	}}
	// An empty `from` would admit every source, so an explicitly empty allowFrom adds no rule.
	if peers := m.Spec.NetworkPolicy.AllowFrom; len(peers) > 0 {
		from := make([]networkingv1.NetworkPolicyPeer, len(peers))
		for i := range peers {
			peers[i].DeepCopyInto(&from[i])
		}
		rules = append(rules, networkingv1.NetworkPolicyIngressRule{From: from, Ports: []networkingv1.NetworkPolicyPort{port(m.Spec.Engine.Port)}})
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: objectMeta(m, EngineName(m), v1alpha1.ComponentEngine),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: EngineSelector(m)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     rules,
		},
	}
}

// RouterNetworkPolicy guards the router pods. The API port stays open to every source: the
// gateway in front of the router may sit in any namespace, and the router is the model's public
// endpoint. The admin port (metrics, /debug/engines, /debug/route, which shows the fleet and
// makes engines tokenize) admits spec.networkPolicy.allowFrom (by default the monitoring
// namespace) and pods of the model's own namespace, not the rest of the cluster. With
// EnginesConnect, the bound events port admits the engine pods only (anyone else could fill the
// index with blocks no engine holds). Nil when spec.networkPolicy.enabled is false.
func RouterNetworkPolicy(m *v1alpha1.KVRoutedModel) *networkingv1.NetworkPolicy {
	if !*m.Spec.NetworkPolicy.Enabled {
		return nil
	}
	tcp := corev1.ProtocolTCP
	port := func(p int32) []networkingv1.NetworkPolicyPort {
		return []networkingv1.NetworkPolicyPort{{Protocol: ptr(tcp), Port: ptr(intstr.FromInt32(p))}}
	}
	admin := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}} // the model's namespace
	for i := range m.Spec.NetworkPolicy.AllowFrom {
		var p networkingv1.NetworkPolicyPeer
		m.Spec.NetworkPolicy.AllowFrom[i].DeepCopyInto(&p)
		admin = append(admin, p)
	}
	rules := []networkingv1.NetworkPolicyIngressRule{
		{Ports: port(RouterHTTPPort)}, // no `from`: every source
		{From: admin, Ports: port(RouterAdminPort)},
	}
	if EnginesConnect(m) {
		rules = append(rules, networkingv1.NetworkPolicyIngressRule{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: EngineSelector(m)}}},
			Ports: port(m.Spec.Engine.KVEvents.BasePort),
		})
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: objectMeta(m, RouterName(m), v1alpha1.ComponentRouter),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: RouterSelector(m)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     rules,
		},
	}
}

// PodDisruptionBudget lets voluntary disruptions (drains) take one engine pod at a time.
// Pods that never became Ready (still loading) may always be evicted.
func PodDisruptionBudget(m *v1alpha1.KVRoutedModel) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: objectMeta(m, EngineName(m), v1alpha1.ComponentEngine),
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable:             ptr(intstr.FromInt32(1)),
			Selector:                   &metav1.LabelSelector{MatchLabels: EngineSelector(m)},
			UnhealthyPodEvictionPolicy: ptr(policyv1.AlwaysAllow),
		},
	}
}
