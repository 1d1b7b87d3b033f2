package controllers

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/router/discovery"
)

// inferencePoolCRD is the test fixture for the Inference Extension's InferencePool API
// (testdata/crds: written from the API's documented fields, not the Extension's YAML).
var inferencePoolCRD = filepath.Join("..", "testdata", "crds", "inference.networking.k8s.io_inferencepools.yaml")

func inferencePool(t *testing.T, ns, name string) (*unstructured.Unstructured, error) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(render.InferencePoolGVK)
	return u, k8s.Get(ctx, key(ns, name), u)
}

// The operator's side of spec.router.mode EndpointPicker on a real API server, in order: the
// InferencePool API absent (Degraded, the rest reconciled), its CRD installed (the pool
// appears without any other change), the router's rendered Role read through the router's own
// InferencePool discovery as the router's ServiceAccount, and back to Proxy (the pool goes).
// One test, because the API's presence is cluster-wide state the steps depend on.
func TestEndpointPicker(t *testing.T) {
	ns := namespace(t, "epp")
	gateway := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "envoy-gateway-system"}}}
	m := newModel(t, ns, "qwen", func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Router.Mode = v1alpha1.RouterModeEndpointPicker
		m.Spec.Router.EndpointPicker = &v1alpha1.EndpointPickerSpec{AllowFrom: []networkingv1.NetworkPolicyPeer{gateway}}
	})

	// No InferencePool API: Degraded with what to install; the router and its policy are there.
	got := waitCondition(t, m, v1alpha1.ConditionDegraded, "True/"+v1alpha1.ReasonInferencePoolCRDMissing)
	if _, err := inferencePool(t, ns, "qwen"); err == nil {
		t.Fatal("an InferencePool exists before its CRD")
	}
	for _, c := range got.Status.Conditions {
		if c.Type == v1alpha1.ConditionDegraded && !containsAll(c.Message, "inference.networking.k8s.io/v1", "Inference Extension", "Proxy") {
			t.Errorf("Degraded message says neither the API nor what to do: %q", c.Message)
		}
	}
	router := &appsv1.Deployment{}
	eventually(t, 10*time.Second, func() error { return k8s.Get(ctx, key(ns, render.RouterName(m)), router) })
	rc := router.Spec.Template.Spec.Containers[0]
	// HTTP probes: a kubelet gRPC probe cannot speak the TLS the picker serves by default.
	if p := rc.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		t.Errorf("router readiness probe %+v, want HTTP /readyz", p)
	}
	if p := rc.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
		t.Errorf("router liveness probe %+v, want HTTP /healthz", p)
	}
	svc := &corev1.Service{}
	if err := k8s.Get(ctx, key(ns, render.RouterName(m)), svc); err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.Ports) != 2 || svc.Spec.Ports[0].Name != "grpc" || svc.Spec.Ports[0].Port != render.RouterGRPCPort || svc.Spec.Ports[1].Name != "metrics" {
		t.Errorf("router Service ports %+v, want grpc %d and metrics", svc.Spec.Ports, render.RouterGRPCPort)
	}
	np := &networkingv1.NetworkPolicy{}
	if err := k8s.Get(ctx, key(ns, render.RouterName(m)), np); err != nil {
		t.Fatal(err)
	}
	if r := np.Spec.Ingress[0]; len(r.From) != 1 || r.From[0].NamespaceSelector == nil || len(r.Ports) != 1 || r.Ports[0].Port.IntValue() != render.RouterGRPCPort {
		t.Errorf("router policy's first rule %+v, want the gateway's namespace to port %d", r, render.RouterGRPCPort)
	}
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			if p.Port.IntValue() == render.RouterHTTPPort {
				t.Errorf("router policy admits the API port in picker mode: %+v", r)
			}
		}
	}
	enp := &networkingv1.NetworkPolicy{}
	if err := k8s.Get(ctx, key(ns, render.EngineName(m)), enp); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(enp.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
		return len(r.From) == 1 && r.From[0].NamespaceSelector != nil && len(r.Ports) == 1 && r.Ports[0].Port.IntValue() == 8000
	}) {
		t.Errorf("engine policy does not admit the gateway to the engine port: %+v", enp.Spec.Ingress)
	}

	// The CRD appears: the next retry creates the pool, with no change to the model.
	crds, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{inferencePoolCRD}, ErrorIfPathMissing: true})
	if err != nil {
		t.Fatal(err)
	}
	// Uninstalled afterwards, so a -count=N rerun starts without it again.
	t.Cleanup(func() {
		if err := envtest.UninstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: crds}); err != nil {
			t.Error(err)
		}
	})
	var pool *unstructured.Unstructured
	eventually(t, 30*time.Second, func() (err error) { pool, err = inferencePool(t, ns, "qwen"); return err })
	got = waitCondition(t, m, v1alpha1.ConditionDegraded, "False/AsExpected")
	if err := ownedBy(pool, got); err != nil {
		t.Error(err)
	}
	if got.Status.Router == nil || got.Status.Router.InferencePool != "qwen" || got.Status.Router.Endpoint != render.PickerEndpoint(m) {
		t.Errorf("status.router %+v, want inferencePool qwen and the picker's endpoint", got.Status.Router)
	}
	// The pool as the router reads it: the engine pods' selector on the engine's port.
	target, err := discovery.PoolTargetOf(pool)
	if err != nil {
		t.Fatal(err)
	}
	if target.Selector != render.EngineSelectorString(m) || !slices.Equal(target.Ports, []int{8000}) {
		t.Errorf("pool target %+v, want %s on [8000]", target, render.EngineSelectorString(m))
	}
	ref, _, _ := unstructured.NestedMap(pool.Object, "spec", "endpointPickerRef")
	if ref["name"] != render.RouterName(m) || ref["failureMode"] != "FailClose" || ref["kind"] != "Service" {
		t.Errorf("endpointPickerRef %v, want Service %s, FailClose", ref, render.RouterName(m))
	}
	if n, _, _ := unstructured.NestedInt64(pool.Object, "spec", "endpointPickerRef", "port", "number"); n != render.RouterGRPCPort {
		t.Errorf("endpointPickerRef.port.number %d, want %d", n, render.RouterGRPCPort)
	}

	t.Run("discovery through the rendered Role", func(t *testing.T) { pickerDiscovery(t, m) })

	// Back to Proxy: the pool goes, the Role loses its pool rule, the API port returns.
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Router.Mode = v1alpha1.RouterModeProxy
		m.Spec.Router.EndpointPicker = nil
	})
	eventually(t, 20*time.Second, func() error {
		if _, err := inferencePool(t, ns, "qwen"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("InferencePool still there after switching to Proxy (err %v)", err)
		}
		return nil
	})
	eventually(t, 10*time.Second, func() error {
		role := &rbacv1.Role{}
		if err := k8s.Get(ctx, key(ns, render.RouterName(m)), role); err != nil {
			return err
		}
		for _, r := range role.Rules {
			if slices.Contains(r.Resources, "inferencepools") {
				return fmt.Errorf("the Proxy router's Role still reads inferencepools: %+v", role.Rules)
			}
		}
		return nil
	})
	eventually(t, 10*time.Second, func() error {
		if err := k8s.Get(ctx, key(ns, render.RouterName(m)), svc); err != nil {
			return err
		}
		if svc.Spec.Ports[0].Name != "http" {
			return fmt.Errorf("router Service ports %+v, want http first", svc.Spec.Ports)
		}
		return nil
	})
	waitCondition(t, m, v1alpha1.ConditionDegraded, "False/AsExpected")
}

// pickerDiscovery runs kvrouter's InferencePool discovery as the router's ServiceAccount,
// authorized by the Role the operator rendered (envtest's API server authorizes with RBAC).
// It answers whether resourceNames-scoped list and watch serve an informer: they do, because
// the router's informer lists and watches with a metadata.name field selector, which the
// API server turns into the request's name. Without the selector the same list is refused.
func pickerDiscovery(t *testing.T, m *v1alpha1.KVRoutedModel) {
	ns := m.Namespace
	asRouter := rest.CopyConfig(cfg)
	asRouter.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + render.RouterName(m)}
	dyn, err := dynamic.NewForConfig(asRouter)
	if err != nil {
		t.Fatal(err)
	}
	pools := dyn.Resource(discovery.InferencePoolResource).Namespace(ns)
	byName := metav1.ListOptions{FieldSelector: "metadata.name=" + render.InferencePoolName(m)}
	// The RoleBinding may land after the pool: wait for the grant, not for a fixed time.
	eventually(t, 10*time.Second, func() error { _, err := pools.List(ctx, byName); return err })
	if _, err := pools.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing every pool of the namespace: err %v, want Forbidden (the Role names one pool)", err)
	}
	if _, err := pools.Get(ctx, "another-pool", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("reading another pool: err %v, want Forbidden", err)
	}
	w, err := pools.Watch(ctx, byName)
	if err != nil {
		t.Fatalf("watching the pool by name: %v", err)
	}
	w.Stop()

	// An engine pod as the kubelet would report it (envtest runs no kubelet).
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "qwen-engine-0", Namespace: ns, Labels: render.EngineSelector(m),
			Annotations: map[string]string{v1alpha1.AnnotationKVEvents: "5557", v1alpha1.AnnotationBlock: "16"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "example.com/vllm:test",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}}}}},
	}
	if err := k8s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", PodIPs: []corev1.PodIP{{IP: "10.1.2.3"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := k8s.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}

	src, err := discovery.NewInferencePool(asRouter, discovery.InferencePoolOptions{Namespace: ns, Name: render.InferencePoolName(m)})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		last []discovery.Engine
	)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- src.Run(rctx, func(es []discovery.Engine) { mu.Lock(); last = es; mu.Unlock() })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("discovery ended with %v", err)
		}
	}()
	eventually(t, 20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(last) != 1 || last[0].URL != "http://10.1.2.3:8000" || !last[0].Ready || len(last[0].Events) != 1 {
			return fmt.Errorf("engines %+v, want the one pod at http://10.1.2.3:8000 with its event port", last)
		}
		return nil
	})
	// The router may not read pools of another model.
	other := rest.CopyConfig(cfg)
	other.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":someone-else"}
	od, err := dynamic.NewForConfig(other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := od.Resource(discovery.InferencePoolResource).Namespace(ns).List(ctx, byName); !apierrors.IsForbidden(err) {
		t.Errorf("a ServiceAccount without the Role listed the pool: err %v, want Forbidden", err)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
