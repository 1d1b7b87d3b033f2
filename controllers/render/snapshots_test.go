package render_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/router/discovery"
)

// spec.engine.kvEvents.snapshots: vLLM's snapshot_endpoint (PR #57789) per DP rank, in the
// engine's --kv-events-config, its container ports, the pod annotation the router's discovery
// reads and the engine NetworkPolicy (router pods only). Off by default: nothing of it rendered.
func TestSnapshotsRenderedPerRank(t *testing.T) {
	m := sample(t, "snapshots")
	d, c := engine(t, m)
	raw, _ := argValue(c.Args, "--kv-events-config")
	var kc map[string]any
	if err := json.Unmarshal([]byte(raw), &kc); err != nil {
		t.Fatalf("--kv-events-config %q: %v", raw, err)
	}
	if kc["snapshot_endpoint"] != "tcp://*:5650" || kc["replay_endpoint"] != "tcp://*:5600" || kc["endpoint"] != "tcp://*:5557" {
		t.Errorf("--kv-events-config = %s", raw)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["kv-snap-0"] != 5650 || ports["kv-snap-1"] != 5651 {
		t.Errorf("container ports = %v", ports)
	}
	if a := d.Spec.Template.Annotations[v1alpha1.AnnotationKVSnapshot]; a != "5650,5651" {
		t.Errorf("%s = %q, want 5650,5651", v1alpha1.AnnotationKVSnapshot, a)
	}

	// The router's discovery reads the pod the template makes: one snapshot endpoint per rank,
	// beside the event and replay endpoints, no problem reported.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "e-0", Namespace: m.Namespace, Labels: d.Spec.Template.Labels, Annotations: d.Spec.Template.Annotations},
		Spec:       d.Spec.Template.Spec,
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	e, ok, problems := discovery.EngineFromPod(pod, discovery.KubernetesOptions{})
	if !ok || len(problems) > 0 {
		t.Fatalf("discovery: ok=%v problems=%v", ok, problems)
	}
	if want := []string{"tcp://10.0.0.7:5650", "tcp://10.0.0.7:5651"}; !reflect.DeepEqual(e.Snapshot, want) || len(e.Events) != 2 || len(e.Replay) != 2 {
		t.Errorf("discovered %+v, want snapshot %v", e, want)
	}

	// The engine NetworkPolicy admits the snapshot ports from the router pods alone.
	np := render.NetworkPolicy(m)
	router, _ := render.RouterDeployment(m, testOpts)
	ns := m.Namespace
	nsLabels := map[string]string{"kubernetes.io/metadata.name": ns}
	enginePod := endpoint{ns, nsLabels, d.Spec.Template.Labels}
	routerPod := endpoint{ns, nsLabels, router.Spec.Template.Labels}
	other := endpoint{ns, nsLabels, map[string]string{"app": "curl"}}
	monitoring := endpoint{"monitoring", map[string]string{"kubernetes.io/metadata.name": "monitoring"}, map[string]string{"app": "prometheus"}}
	for _, port := range []int32{5650, 5651} {
		for _, c2 := range []check{{"router", routerPod, port, true}, {"other pod", other, port, false}, {"monitoring", monitoring, port, false}} {
			if got := allowed(t, np, c2.src, enginePod, c.Ports, c2.port); got != c2.allow {
				t.Errorf("%s -> snapshot port %d: allowed = %v, want %v", c2.name, port, got, c2.allow)
			}
		}
	}

	// Off (the default): no field, no port, no annotation.
	for _, shape := range []string{"minimal", "dp2tp2", "sim"} {
		m := sample(t, shape)
		if m.Spec.Engine.KVEvents.Snapshots == nil || *m.Spec.Engine.KVEvents.Snapshots {
			t.Fatalf("%s: snapshots defaulted to %v, want false", shape, m.Spec.Engine.KVEvents.Snapshots)
		}
		d, c := engine(t, m)
		raw, _ := argValue(c.Args, "--kv-events-config")
		if strings.Contains(raw, "snapshot") || len(render.EnginePorts(m).Snapshot) > 0 {
			t.Errorf("%s: snapshots off but --kv-events-config = %s", shape, raw)
		}
		if _, has := d.Spec.Template.Annotations[v1alpha1.AnnotationKVSnapshot]; has {
			t.Errorf("%s: %s written with snapshots off", shape, v1alpha1.AnnotationKVSnapshot)
		}
	}
}
