package render_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/router/config"
)

func envVar(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// spec.engine.apiKeySecretRef reaches the engine as VLLM_API_KEY and the router as its own
// variable, both resolved by the kubelet from the Secret: no argument carries the key or
// names a flag for it, the router's ConfigMap names only the variable, and the router's Role
// still reads pods only.
func TestAPIKeyFromTheSecretOnly(t *testing.T) {
	m := sample(t, "apikey")
	ref := m.Spec.Engine.APIKeySecretRef
	_, ec := engine(t, m)
	ev := envVar(ec, "VLLM_API_KEY")
	if ev == nil || ev.Value != "" || ev.ValueFrom == nil || ev.ValueFrom.SecretKeyRef == nil ||
		ev.ValueFrom.SecretKeyRef.Name != ref.Name || ev.ValueFrom.SecretKeyRef.Key != ref.Key {
		t.Fatalf("engine env %+v", ec.Env)
	}
	for _, a := range append(append([]string{}, ec.Command...), ec.Args...) {
		if strings.Contains(a, "api-key") || strings.Contains(a, "api_key") || strings.Contains(a, "VLLM_API_KEY") {
			t.Fatalf("engine argument %q carries the key", a)
		}
	}
	d, err := render.RouterDeployment(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	rc := d.Spec.Template.Spec.Containers[0]
	rv := envVar(rc, render.RouterAPIKeyEnv)
	if rv == nil || rv.ValueFrom == nil || rv.ValueFrom.SecretKeyRef == nil || *rv.ValueFrom.SecretKeyRef != *ref {
		t.Fatalf("router env %+v", rc.Env)
	}
	cm, err := render.RouterConfigMap(m)
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse([]byte(cm.Data[render.RouterConfigKey]))
	if err != nil || c.EngineAuth == nil || c.EngineAuth.APIKeyEnv != render.RouterAPIKeyEnv || c.EngineAuth.APIKeyFile != "" {
		t.Fatalf("router config %+v %v", c.EngineAuth, err)
	}
	// The key reaches the router through the kubelet: its Role reads no Secret (it reads pods,
	// and patches its own model's status with its report).
	for _, rule := range render.Role(m).Rules {
		for _, res := range rule.Resources {
			if res != "pods" && res != "kvroutedmodels/status" {
				t.Fatalf("router Role grants %s", res)
			}
		}
	}
	// User env cannot shadow the key (the CRD refuses VLLM_API_KEY; the renderer holds too).
	m.Spec.Engine.Env = append(m.Spec.Engine.Env, corev1.EnvVar{Name: "VLLM_API_KEY", Value: "literal"})
	if _, ec := engine(t, m); envVar(ec, "VLLM_API_KEY").ValueFrom == nil {
		t.Fatal("a user VLLM_API_KEY replaced the Secret's")
	}
	// Without the field nothing of it is rendered.
	plain := sample(t, "minimal")
	_, pc := engine(t, plain)
	pd, _ := render.RouterDeployment(plain, testOpts)
	pcm, _ := render.RouterConfigMap(plain)
	if envVar(pc, "VLLM_API_KEY") != nil || envVar(pd.Spec.Template.Spec.Containers[0], render.RouterAPIKeyEnv) != nil ||
		strings.Contains(pcm.Data[render.RouterConfigKey], "engineAuth") {
		t.Fatal("engine API key wiring rendered without spec.engine.apiKeySecretRef")
	}
}

// EnginesConnect: the engines' PUB dials the router's events Service, the router binds
// basePort (config events.bind) and exposes it as a container port, only engine pods may
// reach it, and the engines bind no event port — their replay port stays, announced for the
// router to dial.
func TestEnginesConnect(t *testing.T) {
	m := sample(t, "bound")
	cfgJSON, err := render.KVEventsConfigJSON(m)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cfgJSON, `"endpoint":"tcp://qwen-bound-events.llm.svc:5557"`) || !strings.Contains(cfgJSON, `"replay_endpoint":"tcp://*:5600"`) {
		t.Fatalf("kv-events-config %s", cfgJSON)
	}
	d, ec := engine(t, m)
	for _, p := range ec.Ports {
		if strings.HasPrefix(p.Name, "kv-events") {
			t.Fatalf("engine binds an event port in EnginesConnect: %+v", ec.Ports)
		}
	}
	ann := d.Spec.Template.Annotations
	if _, ok := ann[v1alpha1.AnnotationKVEvents]; ok || ann[v1alpha1.AnnotationKVReplay] != "5600" {
		t.Fatalf("engine annotations %v", ann)
	}
	cm, _ := render.RouterConfigMap(m)
	c, err := config.Parse([]byte(cm.Data[render.RouterConfigKey]))
	if err != nil || c.Events.Bind != "tcp://*:5557" || !c.Events.Replay {
		t.Fatalf("router events %+v %v", c.Events, err)
	}
	rd, _ := render.RouterDeployment(m, testOpts)
	found := false
	for _, p := range rd.Spec.Template.Spec.Containers[0].Ports {
		found = found || (p.Name == "kv-events" && p.ContainerPort == 5557)
	}
	if !found {
		t.Fatalf("router ports %+v", rd.Spec.Template.Spec.Containers[0].Ports)
	}
	svc := render.EventsService(m)
	if svc == nil || svc.Name != "qwen-bound-events" || svc.Spec.Type != corev1.ServiceTypeClusterIP ||
		len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 5557 || svc.Spec.Selector[v1alpha1.LabelComponent] != v1alpha1.ComponentRouter {
		t.Fatalf("events Service %+v", svc)
	}
	np := render.RouterNetworkPolicy(m)
	if np == nil || len(np.Spec.Ingress) != 3 {
		t.Fatalf("router policy %+v", np)
	}
	evRule := np.Spec.Ingress[2]
	if len(evRule.From) != 1 || evRule.From[0].PodSelector.MatchLabels[v1alpha1.LabelComponent] != v1alpha1.ComponentEngine ||
		evRule.Ports[0].Port.IntValue() != 5557 {
		t.Fatalf("events rule %+v", evRule)
	}
	if open := np.Spec.Ingress[0]; len(open.From) != 0 || !hasPorts(open, 8000) {
		t.Fatalf("API rule %+v", open)
	}
	if admin := np.Spec.Ingress[1]; len(admin.From) == 0 || !hasPorts(admin, 9090) {
		t.Fatalf("admin rule %+v", admin)
	}
	// The router's own Service does not carry the events port (it may be a LoadBalancer).
	for _, p := range render.RouterService(m).Spec.Ports {
		if p.Port == 5557 {
			t.Fatal("router Service exposes the events port")
		}
	}
	off := false
	m.Spec.NetworkPolicy.Enabled = &off
	if render.RouterNetworkPolicy(m) != nil {
		t.Fatal("router policy rendered with spec.networkPolicy.enabled false")
	}
	// RouterConnects (the default): none of it.
	plain := sample(t, "minimal")
	if plain.Spec.Engine.KVEvents.Mode != v1alpha1.EventsRouterConnects {
		t.Fatalf("default mode %q", plain.Spec.Engine.KVEvents.Mode)
	}
	pcm, _ := render.RouterConfigMap(plain)
	// Three rules: the API port, the admin port and (two routers by default) the peers' route port.
	if np := render.RouterNetworkPolicy(plain); render.EventsService(plain) != nil || np == nil || len(np.Spec.Ingress) != 3 ||
		strings.Contains(pcm.Data[render.RouterConfigKey], "bind") {
		t.Fatal("EnginesConnect children rendered in RouterConnects mode")
	}
}

func hasPorts(r networkingv1.NetworkPolicyIngressRule, ports ...int) bool {
	if len(r.Ports) != len(ports) {
		return false
	}
	for i, p := range ports {
		if r.Ports[i].Port.IntValue() != p {
			return false
		}
	}
	return true
}
