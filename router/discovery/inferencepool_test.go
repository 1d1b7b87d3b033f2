package discovery

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/config"
)

// pool is an InferencePool (inference.networking.k8s.io/v1) as the API server serves it.
func pool(labels map[string]any, ports ...int64) *unstructured.Unstructured {
	tps := make([]any, 0, len(ports))
	for _, p := range ports {
		tps = append(tps, map[string]any{"number": p})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"namespace": "ns", "name": "llama"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": labels},
			"targetPorts":       tps,
			"endpointPickerRef": map[string]any{"name": "kvrouter", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	return u
}

func TestPoolTargetOf(t *testing.T) {
	tg, err := PoolTargetOf(pool(map[string]any{"app": "llama", "tier": "gpu"}, 8000, 8001))
	if err != nil || tg.Selector != "app=llama,tier=gpu" || len(tg.Ports) != 2 || tg.Ports[1] != 8001 {
		t.Fatalf("got %+v, %v", tg, err)
	}
	for name, tc := range map[string]struct {
		p    *unstructured.Unstructured
		want string
	}{
		"empty selector": {pool(map[string]any{}, 8000), "matchLabels is empty"},
		"no ports":       {pool(map[string]any{"app": "x"}), "targetPorts is empty"},
		"nine ports":     {pool(map[string]any{"app": "x"}, 1, 2, 3, 4, 5, 6, 7, 8, 9), "has 9 entries, at most 8"},
		"port zero":      {pool(map[string]any{"app": "x"}, 0), "targetPorts[0].number must be a port in 1..65535 (got 0)"},
		"port twice":     {pool(map[string]any{"app": "x"}, 8000, 8000), "listed twice"},
		"bad label":      {pool(map[string]any{"app": "not a value"}, 8000), "matchLabels"},
	} {
		if _, err := PoolTargetOf(tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want it to say %q", name, err, tc.want)
		}
	}
}

func TestPoolEnginesOnePortPerRank(t *testing.T) {
	es := []Engine{{Name: "p", URL: "http://10.0.0.1:8000", Ready: true,
		Events: []string{"tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"}, Replay: []string{"tcp://10.0.0.1:5600"}}}
	if got := PoolEngines(es, []int{8000}); len(got) != 1 || len(got[0].Events) != 2 {
		t.Fatalf("one port: the engine stays whole with its ranks, got %+v", got)
	}
	got := PoolEngines(es, []int{8000, 8001})
	if len(got) != 2 {
		t.Fatalf("got %+v", got)
	}
	r1 := got[1]
	if r1.Name != "p-rank1" || r1.URL != "http://10.0.0.1:8001" || len(r1.Events) != 1 || r1.Events[0] != "tcp://10.0.0.1:5558" || r1.Replay != nil {
		t.Fatalf("rank 1: %+v", r1)
	}
}

// lastEngines keeps the last snapshot a source gave.
type lastEngines struct {
	mu  sync.Mutex
	es  []Engine
	got bool
}

func (l *lastEngines) update(es []Engine) { l.mu.Lock(); l.es, l.got = es, true; l.mu.Unlock() }
func (l *lastEngines) urls() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.got {
		return "(none yet)"
	}
	var u []string
	for _, e := range l.es {
		u = append(u, e.Name+"="+e.URL)
	}
	return strings.Join(u, " ")
}

func TestInferencePoolSourceFollowsThePool(t *testing.T) {
	pod := enginePod("10.0.0.9", map[string]string{config.DefaultEventsPortsAnnotation: "5557,5558"})
	pod.Namespace, pod.Labels = "ns", map[string]string{"app": "llama"}
	other := enginePod("10.0.0.10", nil)
	other.Namespace, other.Name, other.UID, other.Labels = "ns", "other", "u2", map[string]string{"app": "mistral"}
	pods := kubefake.NewClientset(pod, other)
	scheme := runtime.NewScheme()
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{InferencePoolResource: "InferencePoolList"}, pool(map[string]any{"app": "llama"}, 8000))
	src := newPoolSource(dyn, pods, InferencePoolOptions{Namespace: "ns", Name: "llama",
		Pods: KubernetesOptions{Debounce: time.Millisecond, Logger: slog.New(slog.DiscardHandler)}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var last lastEngines
	go func() { done <- src.Run(ctx, last.update) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	wait := func(want string) {
		t.Helper()
		testkit.WaitFor(t, 10*time.Second, "engines "+want, func() bool { return last.urls() == want })
	}
	wait("p=http://10.0.0.9:8000")

	// Two target ports: one engine per DP rank, each on its own port.
	pc := dyn.Resource(InferencePoolResource).Namespace("ns")
	if _, err := pc.Update(ctx, pool(map[string]any{"app": "llama"}, 8000, 8001), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("p-rank0=http://10.0.0.9:8000 p-rank1=http://10.0.0.9:8001")

	// A new selector follows other pods.
	if _, err := pc.Update(ctx, pool(map[string]any{"app": "mistral"}, 9000), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("other=http://10.0.0.10:9000")

	// The pool gone: no engines.
	if err := pc.Delete(ctx, "llama", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("")
}
