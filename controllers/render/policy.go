package render

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// tcpPort is one TCP port of a NetworkPolicy rule.
func tcpPort(p int32) networkingv1.NetworkPolicyPort {
	tcp := corev1.ProtocolTCP
	return networkingv1.NetworkPolicyPort{Protocol: ptr(tcp), Port: ptr(intstr.FromInt32(p))}
}

// podsLabelled is a peer: the pods of the policy's namespace with these labels ({} for all).
func podsLabelled(labels map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: labels}}
}

// allowFrom is a copy of spec.networkPolicy.allowFrom, after the peers given.
func allowFrom(m *v1alpha1.KVRoutedModel, first ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer {
	out := first
	for i := range m.Spec.NetworkPolicy.AllowFrom {
		var p networkingv1.NetworkPolicyPeer
		m.Spec.NetworkPolicy.AllowFrom[i].DeepCopyInto(&p)
		out = append(out, p)
	}
	return out
}

// ingressPolicy is an Ingress-only NetworkPolicy on the pods labelled selector.
func ingressPolicy(m *v1alpha1.KVRoutedModel, name, component string, selector map[string]string,
	rules []networkingv1.NetworkPolicyIngressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: objectMeta(m, name, component),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: selector},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     rules,
		},
	}
}

// NetworkPolicy guards the engine pods: the event and replay ports (which hand out the KV
// index and accept replay requests) from the router pods only; the HTTP/metrics port from the
// router and spec.networkPolicy.allowFrom, and in mode EndpointPicker from the gateway
// (spec.router.endpointPicker.allowFrom). Nil when spec.networkPolicy.enabled is false.
func NetworkPolicy(m *v1alpha1.KVRoutedModel) *networkingv1.NetworkPolicy {
	if !*m.Spec.NetworkPolicy.Enabled {
		return nil
	}
	routerPorts := []networkingv1.NetworkPolicyPort{tcpPort(m.Spec.Engine.Port)}
	p := EnginePorts(m)
	for _, e := range append(append([]int32{}, p.Events...), p.Replay...) {
		routerPorts = append(routerPorts, tcpPort(e))
	}
	rules := []networkingv1.NetworkPolicyIngressRule{{
		From:  []networkingv1.NetworkPolicyPeer{podsLabelled(RouterSelector(m))},
		Ports: routerPorts,
	}}
	// An empty `from` would admit every source, so an explicitly empty allowFrom adds no rule.
	if peers := allowFrom(m); len(peers) > 0 {
		rules = append(rules, networkingv1.NetworkPolicyIngressRule{From: peers, Ports: []networkingv1.NetworkPolicyPort{tcpPort(m.Spec.Engine.Port)}})
	}
	if EndpointPicker(m) {
		// The gateway sends each request to the engine pod the picker named.
		rules = append(rules, networkingv1.NetworkPolicyIngressRule{From: pickerPeers(m), Ports: []networkingv1.NetworkPolicyPort{tcpPort(m.Spec.Engine.Port)}})
	}
	if Disaggregated(m) {
		// The prefill pods reach the decode pods on every port: the KV transfer's transport
		// (UCX under NIXL) picks its own ports.
		rules = append(rules, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{podsLabelled(PrefillSelector(m))}})
	}
	return ingressPolicy(m, EngineName(m), v1alpha1.ComponentEngine, EngineSelector(m), rules)
}

// RouterNetworkPolicy guards the router pods. The API port stays open to every source: the
// gateway in front of the router may sit in any namespace, and the router is the model's public
// endpoint. In mode EndpointPicker the picker's gRPC port takes its place, admitting
// spec.router.endpointPicker.allowFrom (the gateway) only. The admin port (metrics, /debug/engines, /debug/route, which shows the fleet and
// makes engines tokenize) admits spec.networkPolicy.allowFrom (by default the monitoring
// namespace) and pods of the model's own namespace, not the rest of the cluster. With
// EnginesConnect, the bound events port admits the engine pods only (anyone else could fill the
// index with blocks no engine holds). Nil when spec.networkPolicy.enabled is false.
func RouterNetworkPolicy(m *v1alpha1.KVRoutedModel) *networkingv1.NetworkPolicy {
	if !*m.Spec.NetworkPolicy.Enabled {
		return nil
	}
	rules := []networkingv1.NetworkPolicyIngressRule{
		{Ports: []networkingv1.NetworkPolicyPort{tcpPort(RouterHTTPPort)}}, // no `from`: every source
		{From: allowFrom(m, podsLabelled(nil)), Ports: []networkingv1.NetworkPolicyPort{tcpPort(RouterAdminPort)}},
	}
	if EndpointPicker(m) {
		// The picker's gRPC port (no authentication) admits the gateway only; the API port, which
		// no Service exposes in this mode, admits no one.
		rules[0] = networkingv1.NetworkPolicyIngressRule{From: pickerPeers(m), Ports: []networkingv1.NetworkPolicyPort{tcpPort(RouterGRPCPort)}}
	}
	if r, ok := routerPeersRule(m); ok {
		rules = append(rules, r)
	}
	if EnginesConnect(m) {
		from := []networkingv1.NetworkPolicyPeer{podsLabelled(EngineSelector(m))}
		if Disaggregated(m) {
			from = append(from, podsLabelled(PrefillSelector(m)))
		}
		rules = append(rules, networkingv1.NetworkPolicyIngressRule{
			From:  from,
			Ports: []networkingv1.NetworkPolicyPort{tcpPort(m.Spec.Engine.KVEvents.BasePort)},
		})
	}
	return ingressPolicy(m, RouterName(m), v1alpha1.ComponentRouter, RouterSelector(m), rules)
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
