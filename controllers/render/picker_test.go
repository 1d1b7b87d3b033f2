package render_test

import (
	"reflect"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
)

// The pool lists the engine's one HTTP port whatever the DP ranks per pod (they share it, the
// picker pins the rank by header), and the router reads the pool the gateway routes to.
func TestEndpointPickerPoolAndRouterConfig(t *testing.T) {
	m := sample(t, "endpointpicker")
	if m.Spec.Engine.Parallelism.DataLocal != 2 {
		t.Fatalf("the sample should have two DP ranks, has %d", m.Spec.Engine.Parallelism.DataLocal)
	}
	pool, err := render.InferencePool(m)
	if err != nil || pool == nil {
		t.Fatalf("pool %v, err %v", pool, err)
	}
	target, err := discovery.PoolTargetOf(pool)
	if err != nil {
		t.Fatalf("the router cannot read the rendered pool: %v", err)
	}
	if target.Selector != render.EngineSelectorString(m) || !slices.Equal(target.Ports, []int{int(m.Spec.Engine.Port)}) {
		t.Errorf("pool target %+v, want the engine selector on [%d] alone", target, m.Spec.Engine.Port)
	}
	ref, _, _ := unstructured.NestedMap(pool.Object, "spec", "endpointPickerRef")
	if ref["name"] != render.RouterName(m) || ref["failureMode"] != "FailClose" {
		t.Errorf("endpointPickerRef %v", ref)
	}
	cm, err := render.RouterConfigMap(m)
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse([]byte(cm.Data[render.RouterConfigKey]))
	if err != nil {
		t.Fatalf("rendered config does not parse: %v", err)
	}
	if c.Discovery.Kubernetes != nil || c.Discovery.InferencePool == nil || *c.Discovery.InferencePool != (config.InferencePoolDiscovery{Namespace: "llm", Name: "qwen-epp"}) {
		t.Errorf("discovery %+v, want the pool llm/qwen-epp alone", c.Discovery)
	}
	if c.ExtProc == nil || c.ExtProc.Listen != ":9002" || c.ExtProc.ConformanceHooks {
		t.Errorf("extProc %+v, want :9002 without conformance hooks", c.ExtProc)
	}

	// Proxy mode renders no pool and keeps its Kubernetes discovery.
	p := sample(t, "minimal")
	if pool, err := render.InferencePool(p); pool != nil || err != nil {
		t.Errorf("Proxy mode rendered a pool: %v (%v)", pool, err)
	}
	objs, err := render.All(p, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetObjectKind().GroupVersionKind() == render.InferencePoolGVK {
			t.Error("All renders an InferencePool in Proxy mode")
		}
	}
}

// The picker's Role adds read access to its one pool, by name; Proxy's has none.
func TestEndpointPickerRole(t *testing.T) {
	r := render.Role(sample(t, "endpointpicker"))
	if len(r.Rules) != 3 {
		t.Fatalf("rules %+v, want pods, own status and the pool", r.Rules)
	}
	pool := r.Rules[2]
	if !reflect.DeepEqual(pool.APIGroups, []string{"inference.networking.k8s.io"}) || !reflect.DeepEqual(pool.Resources, []string{"inferencepools"}) ||
		!reflect.DeepEqual(pool.ResourceNames, []string{"qwen-epp"}) || !reflect.DeepEqual(pool.Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("pool rule %+v", pool)
	}
}

// Unset allowFrom admits the model's own namespace to the picker and the engines; the API port
// is closed in picker mode.
func TestEndpointPickerNetworkPoliciesDefault(t *testing.T) {
	m := sample(t, "endpointpicker")
	m.Spec.Router.EndpointPicker.AllowFrom = nil
	rp := render.RouterNetworkPolicy(m)
	first := rp.Spec.Ingress[0]
	if len(first.From) != 1 || first.From[0].PodSelector == nil || len(first.From[0].PodSelector.MatchLabels) != 0 || first.From[0].NamespaceSelector != nil ||
		len(first.Ports) != 1 || first.Ports[0].Port.IntValue() != render.RouterGRPCPort {
		t.Errorf("router policy's gRPC rule %+v, want the own namespace's pods on %d", first, render.RouterGRPCPort)
	}
	for _, r := range rp.Spec.Ingress {
		if len(r.From) == 0 {
			t.Errorf("a rule admits every source in picker mode: %+v", r)
		}
	}
	ep := render.NetworkPolicy(m)
	last := ep.Spec.Ingress[len(ep.Spec.Ingress)-1]
	if len(last.From) != 1 || last.From[0].PodSelector == nil || len(last.Ports) != 1 || last.Ports[0].Port.IntValue() != int(m.Spec.Engine.Port) {
		t.Errorf("engine policy's gateway rule %+v", last)
	}
	// Proxy: the API port stays open to every source and the engines admit no gateway rule.
	p := sample(t, "minimal")
	if r := render.RouterNetworkPolicy(p).Spec.Ingress[0]; len(r.From) != 0 || r.Ports[0].Port.IntValue() != render.RouterHTTPPort {
		t.Errorf("Proxy router policy's first rule %+v", r)
	}
	if n, pn := len(render.NetworkPolicy(p).Spec.Ingress), len(ep.Spec.Ingress); n != pn-1 {
		t.Errorf("engine policy rules: Proxy %d, picker %d; want exactly one more (the gateway)", n, pn)
	}
}

// The picker serves TLS by default (self-signed), from a mounted Secret re-read in place, or
// plaintext when disabled; the config and the pod agree.
func TestEndpointPickerTLSModes(t *testing.T) {
	for _, c := range []struct {
		tls     *v1alpha1.EndpointPickerTLS
		want    *config.ExtProcTLS
		mounted bool
	}{
		{nil, &config.ExtProcTLS{}, false},
		{&v1alpha1.EndpointPickerTLS{Mode: v1alpha1.PickerTLSSecret, SecretName: "picker-cert"}, &config.ExtProcTLS{CertDir: render.RouterPickerTLSDir}, true},
		{&v1alpha1.EndpointPickerTLS{Mode: v1alpha1.PickerTLSDisabled}, nil, false},
	} {
		m := sample(t, "endpointpicker")
		if m.Spec.Router.EndpointPicker == nil {
			m.Spec.Router.EndpointPicker = &v1alpha1.EndpointPickerSpec{}
		}
		m.Spec.Router.EndpointPicker.TLS = c.tls
		cm, err := render.RouterConfigMap(m)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Parse([]byte(cm.Data[render.RouterConfigKey]))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(cfg.ExtProc.TLS, c.want) {
			t.Errorf("%+v: extProc.tls %+v, want %+v", c.tls, cfg.ExtProc.TLS, c.want)
		}
		d, err := render.RouterDeployment(m, testOpts)
		if err != nil {
			t.Fatal(err)
		}
		pod := d.Spec.Template.Spec
		var secret string
		for _, v := range pod.Volumes {
			if v.Secret != nil {
				secret = v.Secret.SecretName
			}
		}
		var mountedAt string
		for _, vm := range pod.Containers[0].VolumeMounts {
			if vm.Name == "picker-tls" {
				mountedAt = vm.MountPath
			}
		}
		if c.mounted != (secret == "picker-cert" && mountedAt == render.RouterPickerTLSDir) {
			t.Errorf("%+v: secret volume %q mounted at %q", c.tls, secret, mountedAt)
		}
	}
}
