package render_test

import (
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
)

// endpoint is a pod as NetworkPolicy sees it.
type endpoint struct {
	namespace string
	nsLabels  map[string]string
	labels    map[string]string
}

// allowed is a small NetworkPolicy ingress evaluator (one policy; pod and namespace peers,
// numeric and named ports) written for this test: would traffic from src to dst:port pass?
func allowed(t *testing.T, np *networkingv1.NetworkPolicy, src, dst endpoint, dstPorts []corev1.ContainerPort, port int32) bool {
	t.Helper()
	if dst.namespace != np.Namespace || !matches(t, &np.Spec.PodSelector, dst.labels) {
		return true // not selected: not isolated by this policy
	}
	for _, rule := range np.Spec.Ingress {
		if !peerAllowed(t, np.Namespace, rule.From, src) {
			continue
		}
		if len(rule.Ports) == 0 {
			return true
		}
		for _, p := range rule.Ports {
			if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
				continue
			}
			if p.Port == nil {
				return true
			}
			want := p.Port.IntVal
			if p.Port.StrVal != "" {
				want = -1
				for _, cp := range dstPorts {
					if cp.Name == p.Port.StrVal {
						want = cp.ContainerPort
					}
				}
			}
			end := want
			if p.EndPort != nil {
				end = *p.EndPort
			}
			if port >= want && port <= end {
				return true
			}
		}
	}
	return false
}

func peerAllowed(t *testing.T, policyNS string, from []networkingv1.NetworkPolicyPeer, src endpoint) bool {
	if len(from) == 0 {
		return true // an empty from admits every source
	}
	for _, peer := range from {
		switch {
		case peer.PodSelector != nil && peer.NamespaceSelector != nil:
			if matches(t, peer.NamespaceSelector, src.nsLabels) && matches(t, peer.PodSelector, src.labels) {
				return true
			}
		case peer.PodSelector != nil:
			if src.namespace == policyNS && matches(t, peer.PodSelector, src.labels) {
				return true
			}
		case peer.NamespaceSelector != nil:
			if matches(t, peer.NamespaceSelector, src.nsLabels) {
				return true
			}
		}
	}
	return false
}

func matches(t *testing.T, sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("bad selector %v: %v", sel, err)
	}
	return s.Matches(labels.Set(l))
}

// check is one connection attempt and whether the policy must admit it.
type check struct {
	name  string
	src   endpoint
	port  int32
	allow bool
}

func TestNetworkPolicy(t *testing.T) {
	for _, shape := range []string{"minimal", "dp2tp2", "netpol"} {
		t.Run(shape, func(t *testing.T) {
			m := sample(t, shape)
			np := render.NetworkPolicy(m)
			if np == nil {
				t.Fatal("no NetworkPolicy with networkPolicy.enabled defaulted to true")
			}
			d, err := render.EngineDeployment(m, testOpts)
			if err != nil {
				t.Fatal(err)
			}
			router, _ := render.RouterDeployment(m, testOpts)
			ns := m.Namespace
			nsLabels := map[string]string{"kubernetes.io/metadata.name": ns}
			engine := endpoint{ns, nsLabels, d.Spec.Template.Labels}
			cports := d.Spec.Template.Spec.Containers[0].Ports
			routerPod := endpoint{ns, nsLabels, router.Spec.Template.Labels}
			other := endpoint{ns, nsLabels, map[string]string{"app": "curl"}}
			otherRouter := endpoint{ns, nsLabels, map[string]string{
				v1alpha1.LabelPartOf: v1alpha1.PartOfValue, v1alpha1.LabelComponent: v1alpha1.ComponentRouter, v1alpha1.LabelModel: "another-model"}}
			monitoring := endpoint{"monitoring", map[string]string{"kubernetes.io/metadata.name": "monitoring"}, map[string]string{"app": "prometheus"}}

			http := m.Spec.Engine.Port
			p := render.EnginePorts(m)
			checks := []check{
				{"router -> http", routerPod, http, true},
				{"other pod -> http", other, http, false},
				{"monitoring -> metrics (http)", monitoring, http, true},
				{"router of another model -> http", otherRouter, http, false},
				{"router -> unrelated port", routerPod, 22, false},
			}
			for r, ev := range p.Events {
				checks = append(checks,
					check{"router -> events rank " + itoa(r), routerPod, ev, true},
					check{"other pod -> events rank " + itoa(r), other, ev, false},
					check{"monitoring -> events rank " + itoa(r), monitoring, ev, false},
					check{"router of another model -> events rank " + itoa(r), otherRouter, ev, false},
				)
			}
			for r, rp := range p.Replay {
				checks = append(checks, check{"router -> replay rank " + itoa(r), routerPod, rp, true}, check{"other pod -> replay rank " + itoa(r), other, rp, false})
			}
			if shape == "netpol" {
				debug := endpoint{ns, nsLabels, map[string]string{"app": "debug-shell"}}
				checks = append(checks, check{"allowFrom pod -> http", debug, http, true}, check{"allowFrom pod -> events", debug, p.Events[0], false})
			}
			for _, c := range checks {
				if got := allowed(t, np, c.src, engine, cports, c.port); got != c.allow {
					t.Errorf("%s (port %d): allowed = %v, want %v", c.name, c.port, got, c.allow)
				}
			}
		})
	}
}

// The router's admin port (metrics, /debug) is reachable from its own namespace and from
// allowFrom (monitoring by default), not from the rest of the cluster; its API port from anywhere.
func TestRouterNetworkPolicy(t *testing.T) {
	for _, shape := range []string{"minimal", "netpol"} {
		t.Run(shape, func(t *testing.T) {
			m := sample(t, shape)
			np := render.RouterNetworkPolicy(m)
			if np == nil {
				t.Fatal("no router NetworkPolicy with networkPolicy.enabled defaulted to true")
			}
			router, _ := render.RouterDeployment(m, testOpts)
			ns := m.Namespace
			nsLabels := map[string]string{"kubernetes.io/metadata.name": ns}
			routerPod := endpoint{ns, nsLabels, router.Spec.Template.Labels}
			cports := router.Spec.Template.Spec.Containers[0].Ports
			sameNS := endpoint{ns, nsLabels, map[string]string{"app": "curl"}}
			gateway := endpoint{"gateway", map[string]string{"kubernetes.io/metadata.name": "gateway"}, map[string]string{"app": "litellm"}}
			monitoring := endpoint{"monitoring", map[string]string{"kubernetes.io/metadata.name": "monitoring"}, map[string]string{"app": "prometheus"}}
			checks := []check{
				{"gateway elsewhere -> api", gateway, render.RouterHTTPPort, true},
				{"gateway elsewhere -> admin", gateway, render.RouterAdminPort, false},
				{"same namespace -> admin", sameNS, render.RouterAdminPort, true},
				{"gateway elsewhere -> unrelated port", gateway, 22, false},
			}
			if shape == "minimal" { // the default allowFrom: the monitoring namespace
				checks = append(checks, check{"monitoring -> admin", monitoring, render.RouterAdminPort, true})
			}
			for _, c := range checks {
				if got := allowed(t, np, c.src, routerPod, cports, c.port); got != c.allow {
					t.Errorf("%s (port %d): allowed = %v, want %v", c.name, c.port, got, c.allow)
				}
			}
		})
	}
}

func TestNetworkPolicyEmptyAllowFromAddsNoOpenRule(t *testing.T) {
	m := sample(t, "minimal")
	m.Spec.NetworkPolicy.AllowFrom = []networkingv1.NetworkPolicyPeer{}
	np := render.NetworkPolicy(m)
	for _, r := range np.Spec.Ingress {
		if len(r.From) == 0 {
			t.Fatal("a rule with an empty from admits every source")
		}
	}
	if len(np.Spec.Ingress) != 1 {
		t.Errorf("want only the router rule, got %d rules", len(np.Spec.Ingress))
	}
}

func TestNetworkPolicyDisabled(t *testing.T) {
	m := sample(t, "minimal")
	m.Spec.NetworkPolicy.Enabled = ptr(false)
	if render.NetworkPolicy(m) != nil || render.RouterNetworkPolicy(m) != nil {
		t.Error("NetworkPolicy rendered while disabled")
	}
	objs, _ := render.All(m, testOpts)
	for _, o := range objs {
		if o.GetObjectKind().GroupVersionKind().Kind == "NetworkPolicy" {
			t.Error("All includes a disabled NetworkPolicy")
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// With several routers the route port (NATS) admits the model's router pods only: not the
// gateway, not another pod of the namespace, not monitoring.
func TestRouterPeersNetworkPolicy(t *testing.T) {
	m := sample(t, "routers3")
	np := render.RouterNetworkPolicy(m)
	router, _ := render.RouterDeployment(m, testOpts)
	ns := m.Namespace
	nsLabels := map[string]string{"kubernetes.io/metadata.name": ns}
	routerPod := endpoint{ns, nsLabels, router.Spec.Template.Labels}
	cports := router.Spec.Template.Spec.Containers[0].Ports
	sameNS := endpoint{ns, nsLabels, map[string]string{"app": "curl"}}
	gateway := endpoint{"gateway", map[string]string{"kubernetes.io/metadata.name": "gateway"}, map[string]string{"app": "litellm"}}
	for _, c := range []check{
		{"router -> peers", routerPod, render.RouterPeersPort, true},
		{"router -> admin (snapshot)", routerPod, render.RouterAdminPort, true},
		{"same namespace -> peers", sameNS, render.RouterPeersPort, false},
		{"gateway elsewhere -> peers", gateway, render.RouterPeersPort, false},
	} {
		if got := allowed(t, np, c.src, routerPod, cports, c.port); got != c.allow {
			t.Errorf("%s (port %d): allowed = %v, want %v", c.name, c.port, got, c.allow)
		}
	}
}
