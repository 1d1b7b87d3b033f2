package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/controllers/warmup"
)

var ctx = context.Background()

func key(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }

func engine(t *testing.T, m *v1alpha1.KVRoutedModel) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	eventually(t, 20*time.Second, func() error { return k8s.Get(ctx, key(m.Namespace, render.EngineName(m)), d) })
	return d
}

// setDeploymentStatus writes what a Deployment controller would: the test is the only
// writer of a Deployment's status in envtest. The operator writes a model's Deployments one
// after another in one reconcile, so the one named may not exist yet: wait for it first.
func setDeploymentStatus(t *testing.T, ns, name string, replicas, updated, ready int32, conds ...appsv1.DeploymentCondition) {
	t.Helper()
	eventually(t, 20*time.Second, func() error { return k8s.Get(ctx, key(ns, name), &appsv1.Deployment{}) })
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, key(ns, name), d); err != nil {
			return err
		}
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: replicas, UpdatedReplicas: updated,
			ReadyReplicas: ready, AvailableReplicas: ready, Conditions: conds}
		return k8s.Status().Update(ctx, d)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func scaleTo(t *testing.T, m *v1alpha1.KVRoutedModel, n int32) {
	t.Helper()
	s := &autoscalingv1.Scale{}
	if err := k8s.SubResource("scale").Get(ctx, m, s); err != nil {
		t.Fatal(err)
	}
	s.Spec.Replicas = n
	if err := k8s.SubResource("scale").Update(ctx, m, client.WithSubResourceBody(s)); err != nil {
		t.Fatal(err)
	}
}

func waitEngineReplicas(t *testing.T, m *v1alpha1.KVRoutedModel, n int32) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		if d := engine(t, m); *d.Spec.Replicas != n {
			return fmt.Errorf("engine Deployment replicas %d, want %d", *d.Spec.Replicas, n)
		}
		return nil
	})
}

func updateModel(t *testing.T, m *v1alpha1.KVRoutedModel, edit func(*v1alpha1.KVRoutedModel)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := getModel(t, m)
		edit(cur)
		return k8s.Update(ctx, cur)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ownedBy checks that o has exactly one controller reference, to m.
func ownedBy(o metav1.Object, m *v1alpha1.KVRoutedModel) error {
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.UID != m.UID || ref.Kind != v1alpha1.Kind || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		return fmt.Errorf("%s: controller reference %+v, want one to %s (%s)", o.GetName(), ref, m.Name, m.UID)
	}
	return nil
}

func TestChildrenFromRenderers(t *testing.T) {
	ns := namespace(t, "children")
	m := newModel(t, ns, "qwen", nil)
	engine(t, m)
	m = getModel(t, m) // defaulted, with its UID
	want, err := render.All(m, renderOpt)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		gvk := w.GetObjectKind().GroupVersionKind()
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(gvk)
		eventually(t, 10*time.Second, func() error { return k8s.Get(ctx, key(ns, w.GetName()), got) })
		if err := ownedBy(got, m); err != nil {
			t.Errorf("%s: %v", gvk.Kind, err)
		}
		for k, v := range w.GetLabels() {
			if got.GetLabels()[k] != v {
				t.Errorf("%s %s: label %s=%q, want %q", gvk.Kind, w.GetName(), k, got.GetLabels()[k], v)
			}
		}
	}
	// The engine Deployment carries the renderer's pod template (args, ports, annotations).
	d := engine(t, m)
	var rendered *appsv1.Deployment
	for _, w := range want {
		if dd, ok := w.(*appsv1.Deployment); ok && dd.Name == render.EngineName(m) {
			rendered = dd
		}
	}
	if !equality.Semantic.DeepEqual(d.Spec.Template.Spec.Containers[0].Args, rendered.Spec.Template.Spec.Containers[0].Args) {
		t.Errorf("engine args\n got %q\nwant %q", d.Spec.Template.Spec.Containers[0].Args, rendered.Spec.Template.Spec.Containers[0].Args)
	}
	if d.Spec.Template.Spec.Containers[0].Image != renderOpt.DefaultEngineImage || *d.Spec.Replicas != 1 {
		t.Errorf("engine image %q replicas %d", d.Spec.Template.Spec.Containers[0].Image, *d.Spec.Replicas)
	}
	if got := d.Spec.Template.Annotations[v1alpha1.AnnotationKVEvents]; got != "5557" {
		t.Errorf("engine pod annotation kv-events-ports %q", got)
	}
	// One field owner for everything the operator applied.
	for _, mf := range d.ManagedFields {
		if mf.Operation == metav1.ManagedFieldsOperationApply && mf.Manager != FieldOwner {
			t.Errorf("apply by unexpected manager %q", mf.Manager)
		}
	}

	got := waitCondition(t, m, v1alpha1.ConditionAvailable, "False/NoReplicasReady")
	if got.Status.Selector != render.EngineSelectorString(m) || got.Status.Engine == nil || got.Status.Engine.DeploymentName != "qwen-engine" ||
		got.Status.Router == nil || got.Status.Router.ServiceName != "qwen-router" || got.Status.Router.Endpoint == "" {
		t.Errorf("status sections %+v / %+v / %+v", got.Status.Selector, got.Status.Engine, got.Status.Router)
	}

	// Events: the first pass reports its conditions once.
	eventually(t, 10*time.Second, func() error {
		evs := &eventsv1.EventList{}
		if err := k8s.List(ctx, evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.UID == m.UID && e.Reason == v1alpha1.ReasonNoReplicasReady {
				return nil
			}
		}
		return fmt.Errorf("no NoReplicasReady event about the model among %d events", len(evs.Items))
	})

	// Switching the NetworkPolicy off deletes it.
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.NetworkPolicy.Enabled = new(false) })
	eventually(t, 10*time.Second, func() error {
		err := k8s.Get(ctx, key(ns, render.EngineName(m)), &networkingv1.NetworkPolicy{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("NetworkPolicy still there (err %v)", err)
	})
}

func TestScaleAndRollout(t *testing.T) {
	ns := namespace(t, "scale")
	m := newModel(t, ns, "qwen", nil)
	engine(t, m)
	setDeploymentStatus(t, ns, "qwen-engine", 1, 1, 1)
	setDeploymentStatus(t, ns, "qwen-router", 2, 2, 2)
	got := waitCondition(t, m, v1alpha1.ConditionReady, "True/Reconciled")
	if condition(got, v1alpha1.ConditionAvailable) != "True/MinimumReplicasReady" || condition(got, v1alpha1.ConditionDegraded) != "False/AsExpected" {
		t.Fatalf("conditions %s", describe(got.Status.Conditions))
	}

	scaleTo(t, m, 3)
	waitEngineReplicas(t, m, 3)
	got = waitCondition(t, m, v1alpha1.ConditionProgressing, "True/RollingOut") // the new generation is unobserved
	if got.Status.LastScaleTime == nil {
		t.Errorf("lastScaleTime not set after a scale")
	}
	if condition(got, v1alpha1.ConditionReady) != "False/RollingOut" {
		t.Errorf("Ready during rollout: %s", describe(got.Status.Conditions))
	}

	setDeploymentStatus(t, ns, "qwen-engine", 3, 3, 1)
	got = waitCondition(t, m, v1alpha1.ConditionProgressing, "True/Scaling")
	if got.Status.Replicas != 3 || got.Status.ReadyReplicas != 1 || got.Status.UpdatedReplicas != 3 {
		t.Errorf("replicas %d ready %d updated %d", got.Status.Replicas, got.Status.ReadyReplicas, got.Status.UpdatedReplicas)
	}

	setDeploymentStatus(t, ns, "qwen-engine", 3, 3, 3)
	got = waitCondition(t, m, v1alpha1.ConditionReady, "True/Reconciled")
	if got.Status.ReadyReplicas != 3 || condition(got, v1alpha1.ConditionProgressing) != "False/Reconciled" {
		t.Errorf("after rollout: ready %d, %s", got.Status.ReadyReplicas, describe(got.Status.Conditions))
	}
	s := &autoscalingv1.Scale{}
	if err := k8s.SubResource("scale").Get(ctx, m, s); err != nil || s.Status.Replicas != 3 || s.Status.Selector != render.EngineSelectorString(m) {
		t.Errorf("/scale status %+v (%v)", s.Status, err)
	}

	// A rollout past its deadline degrades the model.
	setDeploymentStatus(t, ns, "qwen-engine", 3, 3, 2, appsv1.DeploymentCondition{
		Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded", Message: "ReplicaSet has timed out progressing."})
	waitCondition(t, m, v1alpha1.ConditionDegraded, "True/ProgressDeadlineExceeded")
}

func TestSuspend(t *testing.T) {
	ns := namespace(t, "suspend")
	m := newModel(t, ns, "qwen", nil)
	engine(t, m)
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.Suspend = true })
	waitCondition(t, m, v1alpha1.ConditionProgressing, "False/Suspended")
	scaleTo(t, m, 2)
	waitCondition(t, m, v1alpha1.ConditionProgressing, "False/Suspended") // the new generation is observed...
	time.Sleep(time.Second)
	if d := engine(t, m); *d.Spec.Replicas != 1 {
		t.Fatalf("suspended, yet the Deployment was scaled to %d", *d.Spec.Replicas) // ...but not acted on
	}
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.Suspend = false })
	waitEngineReplicas(t, m, 2)
}

// readyPod creates an engine pod of m and marks it Ready at readyAt.
func readyPod(t *testing.T, m *v1alpha1.KVRoutedModel, name string, readyAt time.Time) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.Namespace, Labels: render.EngineSelector(m)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "example.com/vllm:test"}}},
	}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(readyAt)}}
	if err := k8s.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
}

func podAnnotation(t *testing.T, ns, name string) (string, bool) {
	t.Helper()
	p := &corev1.Pod{}
	if err := k8s.Get(ctx, key(ns, name), p); err != nil {
		t.Fatal(err)
	}
	v, ok := p.Annotations[v1alpha1.AnnotationWarmup]
	return v, ok
}

func TestWarmup(t *testing.T) {
	ns := namespace(t, "warmup")
	t0 := testClock.Now()
	first := t0.Add(-time.Minute)
	m := newModel(t, ns, "qwen", nil)
	engine(t, m)
	readyPod(t, m, "qwen-engine-original", first)
	setDeploymentStatus(t, ns, "qwen-engine", 1, 1, 1)
	setDeploymentStatus(t, ns, "qwen-router", 2, 2, 2)
	waitCondition(t, m, v1alpha1.ConditionAvailable, "True/MinimumReplicasReady")

	// Scale up; the new pods become Ready a minute after the model was Available.
	scaleTo(t, m, 3)
	waitEngineReplicas(t, m, 3)
	t1 := t0.Add(time.Minute)
	testClock.SetTime(t1)
	readyPod(t, m, "qwen-engine-new-a", t1)
	readyPod(t, m, "qwen-engine-new-b", t1)
	setDeploymentStatus(t, ns, "qwen-engine", 3, 3, 3)
	until := warmup.Format(t1.Add(2 * time.Minute)) // the default spec.router.warmup.duration
	for _, p := range []string{"qwen-engine-new-a", "qwen-engine-new-b"} {
		eventually(t, 10*time.Second, func() error {
			if v, _ := podAnnotation(t, ns, p); v != until {
				return fmt.Errorf("%s warmup-until %q, want %q", p, v, until)
			}
			return nil
		})
	}
	got := waitCondition(t, m, v1alpha1.ConditionProgressing, "True/WarmingUp")
	if got.Status.WarmingReplicas != 2 || condition(got, v1alpha1.ConditionReady) != "True/Reconciled" {
		t.Errorf("warming %d, %s", got.Status.WarmingReplicas, describe(got.Status.Conditions))
	}
	if v, ok := podAnnotation(t, ns, "qwen-engine-original"); ok {
		t.Errorf("the pod Ready before the model was Available got warmup-until %q", v)
	}
	// The annotation is owned by the warm-up field owner alone.
	p := &corev1.Pod{}
	if err := k8s.Get(ctx, key(ns, "qwen-engine-new-a"), p); err != nil {
		t.Fatal(err)
	}
	owners := 0
	for _, mf := range p.ManagedFields {
		if mf.Manager == WarmupFieldOwner && mf.Operation == metav1.ManagedFieldsOperationApply {
			owners++
		}
	}
	if owners != 1 {
		t.Errorf("pod managed fields %+v: want one apply entry by %s", p.ManagedFields, WarmupFieldOwner)
	}

	// Past the expiry, the next pass (any pod change triggers one) removes the annotations.
	testClock.SetTime(t1.Add(2*time.Minute + time.Second))
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := &corev1.Pod{}
		if err := k8s.Get(ctx, key(ns, "qwen-engine-original"), p); err != nil {
			return err
		}
		p.Labels["test.kvroute.io/poke"] = "1"
		return k8s.Update(ctx, p)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"qwen-engine-new-a", "qwen-engine-new-b"} {
		eventually(t, 10*time.Second, func() error {
			if v, ok := podAnnotation(t, ns, p); ok {
				return fmt.Errorf("%s still has warmup-until %q", p, v)
			}
			return nil
		})
	}
	got = waitCondition(t, m, v1alpha1.ConditionProgressing, "False/Reconciled")
	if got.Status.WarmingReplicas != 0 {
		t.Errorf("warmingReplicas %d after expiry", got.Status.WarmingReplicas)
	}
}

func scaledObjectCRD() *apiextv1.CustomResourceDefinition {
	open := &apiextv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: new(true)}
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "scaledobjects.keda.sh"},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: "keda.sh",
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "scaledobjects", Singular: "scaledobject", Kind: "ScaledObject", ListKind: "ScaledObjectList"},
			Scope: apiextv1.NamespaceScoped,
			Versions: []apiextv1.CustomResourceDefinitionVersion{{Name: "v1alpha1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object",
					Properties: map[string]apiextv1.JSONSchemaProps{"spec": *open, "status": *open}}}}},
		},
	}
}

// metricsAPIService is an APIService of group (custom.metrics.k8s.io or external.metrics.k8s.io).
func metricsAPIService(group string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]interface{}{"name": "v1beta2." + group},
		// A local APIService (no spec.service): the aggregator reports it Available at once.
		"spec": map[string]interface{}{"group": group, "version": "v1beta2", "groupPriorityMinimum": int64(100), "versionPriority": int64(100)},
	}}
	return u
}

// hpaMetric is the HPA's metric named name (nil: none).
func hpaMetric(hpa *autoscalingv2.HorizontalPodAutoscaler, name string) *autoscalingv2.MetricSpec {
	for i, m := range hpa.Spec.Metrics {
		switch {
		case m.Pods != nil && m.Pods.Metric.Name == name, m.External != nil && m.External.Metric.Name == name:
			return &hpa.Spec.Metrics[i]
		}
	}
	return nil
}

func TestAutoscalerSwitchKEDAAndMetricsAPI(t *testing.T) {
	ns := namespace(t, "autoscale")
	m := newModel(t, ns, "qwen", func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Autoscaling = &v1alpha1.AutoscalingSpec{Provider: "HPA", MaxReplicas: 5}
	})
	hpa := &autoscalingv2.HorizontalPodAutoscaler{}
	eventually(t, 20*time.Second, func() error { return k8s.Get(ctx, key(ns, "qwen"), hpa) })
	if err := ownedBy(hpa, getModel(t, m)); err != nil {
		t.Error(err)
	}
	// The routers' backlog (external metrics API) beside the engines' queue (custom metrics API).
	if hpa.Spec.ScaleTargetRef.Kind != v1alpha1.Kind || hpa.Spec.MaxReplicas != 5 ||
		hpaMetric(hpa, render.QueueMetric) == nil || hpaMetric(hpa, render.BacklogMetric) == nil {
		t.Errorf("HPA spec %+v", hpa.Spec)
	}
	got := waitCondition(t, m, v1alpha1.ConditionDegraded, "True/MetricsAPIUnavailable")
	if got.Status.Autoscaler == nil || got.Status.Autoscaler.Kind != "HorizontalPodAutoscaler" {
		t.Errorf("status.autoscaler %+v", got.Status.Autoscaler)
	}

	// The custom and external metrics APIs appear: the model recovers on its own (retry
	// interval). The HPA reads both metrics, so the model needs both APIs.
	for _, group := range []string{"custom.metrics.k8s.io", "external.metrics.k8s.io"} {
		api := metricsAPIService(group)
		if err := k8s.Create(ctx, api); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(ctx, api) })
	}
	waitCondition(t, m, v1alpha1.ConditionDegraded, "False/AsExpected")

	// Switch to KEDA with no KEDA installed: the HPA goes, the rest still reconciles.
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Autoscaling.Provider = "KEDA"
		m.Spec.Autoscaling.KEDA = &v1alpha1.KEDASpec{Prometheus: &v1alpha1.KEDAPrometheus{ServerAddress: "http://prometheus.monitoring:9090"}}
	})
	waitCondition(t, m, v1alpha1.ConditionDegraded, "True/KEDANotInstalled")
	eventually(t, 10*time.Second, func() error {
		if err := k8s.Get(ctx, key(ns, "qwen"), &autoscalingv2.HorizontalPodAutoscaler{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("HPA still there after switching to KEDA (err %v)", err)
		}
		return nil
	})
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.Router.Replicas = new(int32(2)) })
	eventually(t, 10*time.Second, func() error {
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, key(ns, "qwen-router"), d); err != nil {
			return err
		}
		if *d.Spec.Replicas != 2 {
			return fmt.Errorf("router replicas %d, want 2 while KEDA is missing", *d.Spec.Replicas)
		}
		return nil
	})

	// KEDA's CRD appears: the ScaledObject is created and the model recovers.
	crds, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: []*apiextv1.CustomResourceDefinition{scaledObjectCRD()}})
	if err != nil {
		t.Fatal(err)
	}
	// Uninstall KEDA afterwards, so a -count=N rerun starts without it again.
	t.Cleanup(func() {
		if err := envtest.UninstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: crds}); err != nil {
			t.Error(err)
		}
	})
	so := &unstructured.Unstructured{}
	so.SetGroupVersionKind(render.ScaledObjectGVK)
	eventually(t, 30*time.Second, func() error { return k8s.Get(ctx, key(ns, "qwen"), so) })
	if err := ownedBy(so, getModel(t, m)); err != nil {
		t.Error(err)
	}
	if name, _, _ := unstructured.NestedString(so.Object, "spec", "scaleTargetRef", "name"); name != "qwen" {
		t.Errorf("ScaledObject scaleTargetRef.name %q", name)
	}
	got = waitCondition(t, m, v1alpha1.ConditionDegraded, "False/AsExpected")
	if got.Status.Autoscaler == nil || got.Status.Autoscaler.Kind != "ScaledObject" {
		t.Errorf("status.autoscaler %+v", got.Status.Autoscaler)
	}

	// And back to HPA: the ScaledObject goes.
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.Autoscaling.Provider = "HPA"; m.Spec.Autoscaling.KEDA = nil })
	eventually(t, 10*time.Second, func() error {
		err := k8s.Get(ctx, key(ns, "qwen"), so)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("ScaledObject still there after switching to HPA (err %v)", err)
	})
	eventually(t, 10*time.Second, func() error { return k8s.Get(ctx, key(ns, "qwen"), &autoscalingv2.HorizontalPodAutoscaler{}) })
}

// The engine API key and EnginesConnect through the real API server: the key's Secret need
// not exist (nor be readable by the operator) for the children to be applied, since the
// kubelet resolves it; EnginesConnect adds the events Service and the router's policy, and
// switching back to RouterConnects deletes them and brings the engines' event ports back.
func TestAPIKeyAndEnginesConnect(t *testing.T) {
	ns := namespace(t, "interop")
	m := newModel(t, ns, "qwen", func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Engine.APIKeySecretRef = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "no-such-secret"}, Key: "key"}
		m.Spec.Engine.KVEvents.Mode = v1alpha1.EventsEnginesConnect
	})
	d := engine(t, m)
	c := d.Spec.Template.Spec.Containers[0]
	var keyVar *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == render.EngineAPIKeyEnv {
			keyVar = &c.Env[i]
		}
	}
	if keyVar == nil || keyVar.ValueFrom == nil || keyVar.ValueFrom.SecretKeyRef == nil || keyVar.ValueFrom.SecretKeyRef.Name != "no-such-secret" {
		t.Fatalf("engine env %+v", c.Env)
	}
	if _, ok := d.Spec.Template.Annotations[v1alpha1.AnnotationKVEvents]; ok {
		t.Errorf("EnginesConnect engine announces event ports: %v", d.Spec.Template.Annotations)
	}
	eventually(t, 10*time.Second, func() error {
		r := &appsv1.Deployment{}
		if err := k8s.Get(ctx, key(ns, render.RouterName(m)), r); err != nil {
			return err
		}
		for _, e := range r.Spec.Template.Spec.Containers[0].Env {
			if e.Name == render.RouterAPIKeyEnv && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				return nil
			}
		}
		return fmt.Errorf("router env %+v", r.Spec.Template.Spec.Containers[0].Env)
	})
	for _, o := range []client.Object{&corev1.Service{}, &networkingv1.NetworkPolicy{}} {
		name := render.EventsServiceName(m)
		if _, ok := o.(*networkingv1.NetworkPolicy); ok {
			name = render.RouterName(m)
		}
		eventually(t, 10*time.Second, func() error { return k8s.Get(ctx, key(ns, name), o) })
		if err := ownedBy(o, getModel(t, m)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.Engine.KVEvents.Mode = v1alpha1.EventsRouterConnects })
	// The router's policy stays (it guards the admin port in either mode) without the events rule.
	eventually(t, 10*time.Second, func() error {
		np := &networkingv1.NetworkPolicy{}
		if err := k8s.Get(ctx, key(ns, render.RouterName(m)), np); err != nil {
			return err
		}
		// API and admin, and the peers' route port: back to RouterConnects, the model runs
		// render.DefaultRouterReplicas routers again.
		if len(np.Spec.Ingress) != 3 {
			return fmt.Errorf("router policy has %d rules, want API, admin and peers only", len(np.Spec.Ingress))
		}
		return nil
	})
	for _, o := range []struct {
		obj  client.Object
		name string
	}{{&corev1.Service{}, render.EventsServiceName(m)}} {
		eventually(t, 10*time.Second, func() error {
			err := k8s.Get(ctx, key(ns, o.name), o.obj)
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("%T %s still there (err %v)", o.obj, o.name, err)
		})
	}
	eventually(t, 10*time.Second, func() error {
		if got := engine(t, m).Spec.Template.Annotations[v1alpha1.AnnotationKVEvents]; got != "5557" {
			return fmt.Errorf("kv-events-ports %q", got)
		}
		return nil
	})
}

// spec.engine.kvEvents.snapshots through the real API server and the reconciler: switched on,
// the engine Deployment carries snapshot_endpoint in --kv-events-config, one container port per
// DP rank and the kv-snapshot-ports annotation, the engine NetworkPolicy admits those ports
// from the router pods, and the status lists them; switched off, all of it goes.
func TestSnapshotsSwitch(t *testing.T) {
	ns := namespace(t, "snapshots")
	m := newModel(t, ns, "qwen", func(m *v1alpha1.KVRoutedModel) { m.Spec.Engine.Parallelism.DataLocal = 2 })
	if a := engine(t, m).Spec.Template.Annotations[v1alpha1.AnnotationKVSnapshot]; a != "" {
		t.Fatalf("snapshots off by default, but %s = %q", v1alpha1.AnnotationKVSnapshot, a)
	}
	policyPorts := func() (map[int32]bool, error) {
		np := &networkingv1.NetworkPolicy{}
		if err := k8s.Get(ctx, key(ns, render.EngineName(m)), np); err != nil {
			return nil, err
		}
		routerOnly := map[int32]bool{}
		for _, r := range np.Spec.Ingress {
			if len(r.From) != 1 || r.From[0].PodSelector == nil || r.From[0].PodSelector.MatchLabels[v1alpha1.LabelComponent] != v1alpha1.ComponentRouter {
				continue
			}
			for _, p := range r.Ports {
				routerOnly[p.Port.IntVal] = true
			}
		}
		return routerOnly, nil
	}
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.Engine.KVEvents.Snapshots = new(true) })
	eventually(t, 10*time.Second, func() error {
		d := engine(t, m)
		c := d.Spec.Template.Spec.Containers[0]
		if a := d.Spec.Template.Annotations[v1alpha1.AnnotationKVSnapshot]; a != "5650,5651" {
			return fmt.Errorf("%s = %q", v1alpha1.AnnotationKVSnapshot, a)
		}
		cfg := ""
		for i, a := range c.Args {
			if a == "--kv-events-config" && i+1 < len(c.Args) {
				cfg = c.Args[i+1]
			}
		}
		if !strings.Contains(cfg, `"snapshot_endpoint":"tcp://*:5650"`) {
			return fmt.Errorf("--kv-events-config %s", cfg)
		}
		named := map[string]int32{}
		for _, p := range c.Ports {
			named[p.Name] = p.ContainerPort
		}
		if named["kv-snap-0"] != 5650 || named["kv-snap-1"] != 5651 {
			return fmt.Errorf("container ports %v", named)
		}
		ports, err := policyPorts()
		if err != nil {
			return err
		}
		if !ports[5650] || !ports[5651] {
			return fmt.Errorf("engine policy's router-only ports %v lack 5650, 5651", ports)
		}
		if st := getModel(t, m).Status.Engine; st == nil || !slices.Equal(st.SnapshotPorts, []int32{5650, 5651}) {
			return fmt.Errorf("status.engine %+v", st)
		}
		return nil
	})
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.Engine.KVEvents.Snapshots = new(false) })
	eventually(t, 10*time.Second, func() error {
		d := engine(t, m)
		if a, has := d.Spec.Template.Annotations[v1alpha1.AnnotationKVSnapshot]; has {
			return fmt.Errorf("%s = %q after switching off", v1alpha1.AnnotationKVSnapshot, a)
		}
		if strings.Contains(strings.Join(d.Spec.Template.Spec.Containers[0].Args, " "), "snapshot_endpoint") {
			return fmt.Errorf("snapshot_endpoint still rendered")
		}
		ports, err := policyPorts()
		if err != nil {
			return err
		}
		if ports[5650] || ports[5651] {
			return fmt.Errorf("engine policy still admits %v", ports)
		}
		return nil
	})
}
