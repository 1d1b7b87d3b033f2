package status

import (
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/api/v1alpha1/validation"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func model(t *testing.T) *v1alpha1.KVRoutedModel {
	t.Helper()
	v, err := validation.New()
	if err != nil {
		t.Fatal(err)
	}
	m := &v1alpha1.KVRoutedModel{
		ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns", Generation: 3},
		Spec:       v1alpha1.KVRoutedModelSpec{Model: v1alpha1.ModelSpec{Name: "qwen", URI: "hf://Qwen/Qwen3-0.6B"}},
	}
	if err := v.DefaultModel(m); err != nil {
		t.Fatal(err)
	}
	return m
}

// dep is a Deployment whose controller has observed its spec and reports ready of want.
func dep(name string, want, updated, ready int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 2},
		Spec:       appsv1.DeploymentSpec{Replicas: &want},
		Status:     appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: want, UpdatedReplicas: updated, ReadyReplicas: ready},
	}
}

func get(t *testing.T, st v1alpha1.KVRoutedModelStatus, typ string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(st.Conditions, typ)
	if c == nil {
		t.Fatalf("no %s condition in %+v", typ, st.Conditions)
	}
	if c.ObservedGeneration != 3 {
		t.Errorf("%s observedGeneration %d, want 3", typ, c.ObservedGeneration)
	}
	return *c
}

func expect(t *testing.T, st v1alpha1.KVRoutedModelStatus, typ string, s metav1.ConditionStatus, reason string) {
	t.Helper()
	c := get(t, st, typ)
	if c.Status != s || c.Reason != reason {
		t.Errorf("%s = %s/%s (%q), want %s/%s", typ, c.Status, c.Reason, c.Message, s, reason)
	}
	if c.Message == "" {
		t.Errorf("%s has no message", typ)
	}
}

func TestHealthy(t *testing.T) {
	m := model(t)
	st := Compute(Observed{Model: m, Engine: dep("m-engine", 1, 1, 1), Router: dep("m-router", 1, 1, 1), Now: t0})
	expect(t, st, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReconciled)
	expect(t, st, v1alpha1.ConditionAvailable, metav1.ConditionTrue, v1alpha1.ReasonMinimumReplicasReady)
	expect(t, st, v1alpha1.ConditionProgressing, metav1.ConditionFalse, v1alpha1.ReasonReconciled)
	expect(t, st, v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.ReasonAsExpected)
	if st.ObservedGeneration != 3 || st.Replicas != 1 || st.ReadyReplicas != 1 || st.UpdatedReplicas != 1 {
		t.Errorf("counts %+v", st)
	}
	want := "app.kubernetes.io/component=engine,app.kubernetes.io/part-of=kvroute,serving.kvroute.io/model=m"
	if st.Selector != want {
		t.Errorf("selector %q, want %q", st.Selector, want)
	}
	if st.Engine == nil || st.Engine.DeploymentName != "m-engine" || len(st.Engine.KVEventPorts) != 1 || st.Engine.KVEventPorts[0] != 5557 ||
		len(st.Engine.ReplayPorts) != 1 || st.Engine.ReplayPorts[0] != 5600 {
		t.Errorf("engine status %+v", st.Engine)
	}
	if st.Router == nil || st.Router.ServiceName != "m-router" || !strings.Contains(st.Router.Endpoint, "m-router.ns.svc") {
		t.Errorf("router status %+v", st.Router)
	}
	if st.LastScaleTime != nil {
		t.Errorf("lastScaleTime set without a scale: %v", st.LastScaleTime)
	}
}

func TestNothingYet(t *testing.T) {
	st := Compute(Observed{Model: model(t), Now: t0})
	expect(t, st, v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonNoReplicasReady)
	expect(t, st, v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ReasonRollingOut)
	expect(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNoReplicasReady)
	if st.Engine != nil || st.Router != nil {
		t.Errorf("sections for absent children: %+v %+v", st.Engine, st.Router)
	}
}

func TestRolloutSteps(t *testing.T) {
	m := model(t)
	router := dep("m-router", 1, 1, 1)
	unobserved := dep("m-engine", 3, 1, 1)
	unobserved.Generation = 3
	oldPending := dep("m-engine", 3, 3, 3)
	oldPending.Status.Replicas = 4
	for _, tc := range []struct {
		name    string
		engine  *appsv1.Deployment
		reason  string
		message string
	}{
		{"unobserved", unobserved, v1alpha1.ReasonRollingOut, "new spec"},
		{"updating", dep("m-engine", 3, 1, 1), v1alpha1.ReasonRollingOut, "1 of 3 engine replicas updated"},
		{"old pending", oldPending, v1alpha1.ReasonRollingOut, "1 old engine replica(s)"},
		{"scaling", dep("m-engine", 3, 3, 1), v1alpha1.ReasonScaling, "1 of 3 engine replicas Ready"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := Compute(Observed{Model: m, Engine: tc.engine, Router: router, Now: t0})
			p := get(t, st, v1alpha1.ConditionProgressing)
			if p.Status != metav1.ConditionTrue || p.Reason != tc.reason || !strings.Contains(p.Message, tc.message) {
				t.Errorf("Progressing %s/%s %q, want True/%s containing %q", p.Status, p.Reason, p.Message, tc.reason, tc.message)
			}
			expect(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, tc.reason)
			expect(t, st, v1alpha1.ConditionAvailable, metav1.ConditionTrue, v1alpha1.ReasonMinimumReplicasReady)
		})
	}
}

func TestWarmingKeepsReady(t *testing.T) {
	st := Compute(Observed{Model: model(t), Engine: dep("m-engine", 3, 3, 3), Router: dep("m-router", 1, 1, 1), Warming: 2, Now: t0})
	expect(t, st, v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ReasonWarmingUp)
	expect(t, st, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReconciled)
	if st.WarmingReplicas != 2 {
		t.Errorf("warmingReplicas %d", st.WarmingReplicas)
	}
}

func TestRouterNotReady(t *testing.T) {
	st := Compute(Observed{Model: model(t), Engine: dep("m-engine", 1, 1, 1), Router: dep("m-router", 1, 1, 0), Now: t0})
	expect(t, st, v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonRouterNotReady)
	expect(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonRouterNotReady)
}

func TestProblemsDegrade(t *testing.T) {
	st := Compute(Observed{Model: model(t), Engine: dep("m-engine", 1, 1, 1), Router: dep("m-router", 1, 1, 1), Now: t0,
		Problems: []Problem{{v1alpha1.ReasonKEDANotInstalled, "KEDA is not installed"}, {v1alpha1.ReasonApplyFailed, "apply Service: boom"}}})
	expect(t, st, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonKEDANotInstalled)
	expect(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonKEDANotInstalled)
	expect(t, st, v1alpha1.ConditionAvailable, metav1.ConditionTrue, v1alpha1.ReasonMinimumReplicasReady)
	if d := get(t, st, v1alpha1.ConditionDegraded); !strings.Contains(d.Message, "boom") {
		t.Errorf("second problem missing from %q", d.Message)
	}
}

func TestProgressDeadline(t *testing.T) {
	e := dep("m-engine", 2, 2, 1)
	e.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded", Message: "ReplicaSet has timed out progressing."}}
	st := Compute(Observed{Model: model(t), Engine: e, Router: dep("m-router", 1, 1, 1), Now: t0})
	expect(t, st, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonProgressDeadline)
}

func TestSuspended(t *testing.T) {
	st := Compute(Observed{Model: model(t), Engine: dep("m-engine", 1, 1, 1), Router: dep("m-router", 1, 1, 1), Suspended: true, Now: t0})
	expect(t, st, v1alpha1.ConditionProgressing, metav1.ConditionFalse, v1alpha1.ReasonSuspended)
	expect(t, st, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSuspended)
}

func TestScaleToZero(t *testing.T) {
	st := Compute(Observed{Model: model(t), Engine: dep("m-engine", 0, 0, 0), Router: dep("m-router", 1, 1, 1), Now: t0})
	c := get(t, st, v1alpha1.ConditionAvailable)
	if c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "scaled to zero") {
		t.Errorf("Available %s %q", c.Status, c.Message)
	}
}

func TestTransitionTimesAndLastScale(t *testing.T) {
	m := model(t)
	first := Compute(Observed{Model: m, Engine: dep("m-engine", 1, 1, 1), Router: dep("m-router", 1, 1, 1), Now: t0})
	m.Status = first
	t1 := t0.Add(time.Minute)
	second := Compute(Observed{Model: m, Engine: dep("m-engine", 3, 3, 1), Router: dep("m-router", 1, 1, 1), Scaled: true, Now: t1})
	if a := get(t, second, v1alpha1.ConditionAvailable); !a.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("Available unchanged but its transition time moved to %v", a.LastTransitionTime)
	}
	if r := get(t, second, v1alpha1.ConditionReady); !r.LastTransitionTime.Time.Equal(t1) {
		t.Errorf("Ready flipped but its transition time is %v", r.LastTransitionTime)
	}
	if second.LastScaleTime == nil || !second.LastScaleTime.Time.Equal(t1) {
		t.Errorf("lastScaleTime %v, want %v", second.LastScaleTime, t1)
	}
	if !FirstAvailable(second.Conditions).Equal(t0) {
		t.Errorf("FirstAvailable %v", FirstAvailable(second.Conditions))
	}
	m.Status = second
	third := Compute(Observed{Model: m, Engine: dep("m-engine", 3, 3, 3), Router: dep("m-router", 1, 1, 1), Now: t1.Add(time.Minute)})
	if !third.LastScaleTime.Time.Equal(t1) {
		t.Errorf("lastScaleTime not kept: %v", third.LastScaleTime)
	}

	tr := Transitions(first.Conditions, second.Conditions)
	if len(tr) != 2 {
		t.Fatalf("transitions %+v, want Ready and Progressing", tr)
	}
	for _, x := range tr {
		if x.Type == v1alpha1.ConditionReady && !x.Warning {
			t.Errorf("Ready going False is not a warning: %+v", x)
		}
		if x.Type == v1alpha1.ConditionAvailable || x.Type == v1alpha1.ConditionDegraded {
			t.Errorf("unchanged condition reported: %+v", x)
		}
	}
	if again := Transitions(second.Conditions, second.Conditions); len(again) != 0 {
		t.Errorf("no change, yet transitions %+v", again)
	}
}

func TestFirstAvailableWhenNot(t *testing.T) {
	st := Compute(Observed{Model: model(t), Now: t0})
	if !FirstAvailable(st.Conditions).IsZero() {
		t.Errorf("not Available, yet FirstAvailable %v", FirstAvailable(st.Conditions))
	}
}

// In mode EndpointPicker the router's status names the pool and the picker's gRPC address; the
// missing InferencePool API is a Degraded reason that takes Ready down with it, as KEDA's does.
func TestEndpointPickerStatus(t *testing.T) {
	m := model(t)
	m.Spec.Router.Mode = v1alpha1.RouterModeEndpointPicker
	st := Compute(Observed{Model: m, Engine: dep("m-engine", 1, 1, 1), Router: dep("m-router", 1, 1, 1), Now: t0})
	if st.Router == nil || st.Router.InferencePool != "m" || st.Router.Endpoint != "m-router.ns.svc:9002" {
		t.Errorf("router status %+v, want pool m and the picker at m-router.ns.svc:9002", st.Router)
	}
	st = Compute(Observed{Model: m, Engine: dep("m-engine", 1, 1, 1), Router: dep("m-router", 1, 1, 1), Now: t0,
		Problems: []Problem{{v1alpha1.ReasonInferencePoolCRDMissing, "the InferencePool API is not installed"}}})
	expect(t, st, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonInferencePoolCRDMissing)
	expect(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonInferencePoolCRDMissing)

	m.Spec.Router.Mode = v1alpha1.RouterModeProxy
	if st := Compute(Observed{Model: m, Router: dep("m-router", 1, 1, 1), Now: t0}); st.Router.InferencePool != "" {
		t.Errorf("Proxy mode names a pool: %+v", st.Router)
	}
}
