package status

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

func heldReport(pod string, age time.Duration, held int32, backlog string) v1alpha1.RouterReport {
	r := report(pod, age)
	r.Held = held
	if backlog != "" {
		q := resource.MustParse(backlog)
		r.BacklogSeconds = &q
	}
	return r
}

// The held requests of the fresh reports of live router pods add up (each router holds its own);
// the backlog is the largest report's (each reports the fleet's); stale reports and those of gone
// pods hold nothing. At zero replicas with requests held, Available says so under its own reason.
func TestRouterDemandInStatus(t *testing.T) {
	m := model(t)
	m.Status.RouterReports = []v1alpha1.RouterReport{
		heldReport("r1", 5*time.Second, 2, "1500m"),
		heldReport("r2", 10*time.Second, 1, "2"),
		heldReport("r3", ReportTTL+time.Second, 9, "30"), // stale
		heldReport("gone", time.Second, 9, "30"),         // its pod is gone
		heldReport("r4", time.Second, 0, ""),
	}
	o := Observed{Model: m, Engine: dep("m-engine", 0, 0, 0), Router: dep("m-router", 2, 2, 2), Now: t0,
		RouterPods: map[string]bool{"r1": true, "r2": true, "r3": true, "r4": true}}
	d := RouterDemand(o)
	if d.Held != 3 || d.Routers != 2 || d.BacklogSeconds == nil || d.BacklogSeconds.Cmp(resource.MustParse("2")) != 0 {
		t.Fatalf("demand %+v (backlog %v), want 3 held by 2 routers, backlog 2", d, d.BacklogSeconds)
	}
	st := Compute(o)
	if st.Router.HeldRequests != 3 || st.Router.BacklogSeconds.String() != "2" {
		t.Fatalf("status.router %+v", st.Router)
	}
	expect(t, st, v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonRequestsHeld)
	expect(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonRequestsHeld)
	if c := get(t, st, v1alpha1.ConditionAvailable); !strings.Contains(c.Message, "scaled to zero; 3 request(s) held by 2 router(s)") {
		t.Fatalf("Available message %q", c.Message)
	}
	tr := Transitions([]metav1.Condition{{Type: v1alpha1.ConditionAvailable, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNoReplicasReady}}, st.Conditions)
	found := false
	for _, x := range tr {
		found = found || (x.Type == v1alpha1.ConditionAvailable && x.Reason == v1alpha1.ReasonRequestsHeld)
	}
	if !found {
		t.Fatalf("no Available transition to RequestsHeld (an event) in %+v", tr)
	}

	// Released: nothing held, the plain reason again.
	for i := range m.Status.RouterReports {
		m.Status.RouterReports[i].Held = 0
	}
	st = Compute(o)
	if st.Router.HeldRequests != 0 {
		t.Fatalf("held %d after release", st.Router.HeldRequests)
	}
	expect(t, st, v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonNoReplicasReady)
}

// The operator wakes a model only at zero, opted into scaling to zero, not suspended, with
// requests held, and not where the spec's both-pools rule would refuse the write.
func TestWakes(t *testing.T) {
	zero, one := int32(0), int32(1)
	at := func(f func(m *v1alpha1.KVRoutedModel)) *v1alpha1.KVRoutedModel {
		m := &v1alpha1.KVRoutedModel{Spec: v1alpha1.KVRoutedModelSpec{Replicas: &zero,
			Autoscaling: &v1alpha1.AutoscalingSpec{Provider: "KEDA", MinReplicas: &zero, MaxReplicas: 4}}}
		if f != nil {
			f(m)
		}
		return m
	}
	held := Demand{Held: 1, Routers: 1}
	for _, c := range []struct {
		name string
		m    *v1alpha1.KVRoutedModel
		d    Demand
		want bool
	}{
		{"at zero with demand", at(nil), held, true},
		{"nothing held", at(nil), Demand{}, false},
		{"already up", at(func(m *v1alpha1.KVRoutedModel) { m.Spec.Replicas = &one }), held, false},
		{"minReplicas 1 (a person scaled it to zero)", at(func(m *v1alpha1.KVRoutedModel) { m.Spec.Autoscaling.MinReplicas = &one }), held, false},
		{"no autoscaling (replicas 0 by hand)", at(func(m *v1alpha1.KVRoutedModel) { m.Spec.Autoscaling = nil }), held, false},
		{"suspended", at(func(m *v1alpha1.KVRoutedModel) { m.Spec.Suspend = true }), held, false},
		{"prefill pinned at zero", at(func(m *v1alpha1.KVRoutedModel) {
			m.Spec.Disaggregation = &v1alpha1.DisaggregationSpec{Prefill: v1alpha1.PrefillPoolSpec{Replicas: &zero}}
		}), held, false},
	} {
		if got := Wakes(c.m, c.d); got != c.want {
			t.Errorf("%s: Wakes %v, want %v", c.name, got, c.want)
		}
	}
}
