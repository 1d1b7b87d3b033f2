package status

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"

	"github.com/kvroute/kvroute/router/degraded"
)

func report(pod string, age time.Duration, degraded ...v1alpha1.DegradedReplica) v1alpha1.RouterReport {
	return v1alpha1.RouterReport{Pod: pod, ObservedAt: metav1.NewTime(t0.Add(-age)), Degraded: degraded}
}

func deg(replica, reason string) v1alpha1.DegradedReplica {
	return v1alpha1.DegradedReplica{Replica: replica, Reason: reason, Since: metav1.NewTime(t0.Add(-time.Minute)), Detail: "why " + reason}
}

// IndexHealthy aggregates the fresh reports of live router pods: a key-correctness reason makes
// the model Degraded/IndexUnhealthy while Ready stays True; a stale-index reason only flips
// IndexHealthy; known limits stay healthy; stale reports and reports of gone pods are ignored.
func TestIndexHealthy(t *testing.T) {
	healthy := func(m *v1alpha1.KVRoutedModel) Observed {
		return Observed{Model: m, Engine: dep("m-engine", 2, 2, 2), Router: dep("m-router", 2, 2, 2), Now: t0,
			RouterPods: map[string]bool{"r1": true, "r2": true}}
	}
	cases := []struct {
		name            string
		reports         []v1alpha1.RouterReport
		index           metav1.ConditionStatus
		indexReason     string
		degraded        bool
		wantInMessage   string
		wantKeptReports int
	}{
		{"no report", nil, metav1.ConditionUnknown, v1alpha1.ReasonNoRouterReport, false, "no router", 0},
		{"all healthy", []v1alpha1.RouterReport{report("r1", 10*time.Second), report("r2", 30*time.Second)},
			metav1.ConditionTrue, v1alpha1.ReasonIndexHealthy, false, "2 router(s)", 2},
		{"hash mismatch seen by one router", []v1alpha1.RouterReport{report("r1", 10*time.Second, deg("e-1/0", "hash-mismatch")), report("r2", 5*time.Second)},
			metav1.ConditionFalse, v1alpha1.ReasonIndexUnhealthy, true, "e-1/0 hash-mismatch (1 of 2 routers): why hash-mismatch", 2},
		{"no events: unhealthy, not degraded", []v1alpha1.RouterReport{report("r1", 0, deg("e-0/0", "no-events"))},
			metav1.ConditionFalse, v1alpha1.ReasonIndexUnhealthy, false, "e-0/0 no-events", 1},
		{"known limits stay healthy", []v1alpha1.RouterReport{report("r1", 0, deg("e-0/0", "hybrid-groups-skipped"))},
			metav1.ConditionTrue, v1alpha1.ReasonIndexHealthy, false, "known limits: e-0/0 hybrid-groups-skipped", 1},
		{"stale report ignored, kept while its pod lives", []v1alpha1.RouterReport{report("r1", 3*time.Minute, deg("e-0/0", "keys-wrong"))},
			metav1.ConditionUnknown, v1alpha1.ReasonNoRouterReport, false, "", 1},
		{"report of a gone pod ignored, dropped once stale", []v1alpha1.RouterReport{
			report("gone", 10*time.Second, deg("e-0/0", "keys-wrong")), report("gone2", 5*time.Minute), report("r1", 0)},
			metav1.ConditionTrue, v1alpha1.ReasonIndexHealthy, false, "1 router(s)", 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := model(t)
			m.Status.RouterReports = c.reports
			st := Compute(healthy(m))
			expect(t, st, v1alpha1.ConditionIndexHealthy, c.index, c.indexReason)
			expect(t, st, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReconciled)
			if c.degraded {
				expect(t, st, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonIndexUnhealthy)
			} else {
				expect(t, st, v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.ReasonAsExpected)
			}
			if msg := get(t, st, v1alpha1.ConditionIndexHealthy).Message; !strings.Contains(msg, c.wantInMessage) {
				t.Errorf("message %q lacks %q", msg, c.wantInMessage)
			}
			if len(st.RouterReports) != c.wantKeptReports {
				t.Errorf("%d reports kept, want %d", len(st.RouterReports), c.wantKeptReports)
			}
		})
	}
}

// An IndexHealthy change is an event; turning False is a warning.
func TestIndexHealthyTransitionWarns(t *testing.T) {
	prev := []metav1.Condition{{Type: v1alpha1.ConditionIndexHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonIndexHealthy}}
	next := []metav1.Condition{{Type: v1alpha1.ConditionIndexHealthy, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonIndexUnhealthy}}
	tr := Transitions(prev, next)
	if len(tr) != 1 || !tr[0].Warning {
		t.Fatalf("transitions %+v", tr)
	}
}

// While IndexHealthy stays False, a replica or reason that joins (or leaves) the findings is an
// event of its own; details and router counts that change at every report are not.
func TestIndexHealthyNewFindingIsAnEvent(t *testing.T) {
	unhealthy := func(msg string) []metav1.Condition {
		return []metav1.Condition{{Type: v1alpha1.ConditionIndexHealthy, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonIndexUnhealthy, Message: msg}}
	}
	one := unhealthy("e0/0 no-events (1 of 1 routers): 3 requests of at least a block served with no KV event coming, none received in 5s")
	oneLater := unhealthy("e0/0 no-events (1 of 2 routers): 7 requests of at least a block served with no KV event coming, none received in 15s")
	two := unhealthy("e0/0 no-events (1 of 2 routers): 7 requests; x; e1/0 hash-mismatch (2 of 2 routers): 1 recomputed block hashes differed (hash seed or algorithm); block hashes also differ from replica e0/0")
	if tr := Transitions(one, oneLater); len(tr) != 0 {
		t.Fatalf("details changed only: %+v", tr)
	}
	if tr := Transitions(oneLater, two); len(tr) != 1 || !tr[0].Warning || !strings.Contains(tr[0].Message, "e1/0 hash-mismatch") {
		t.Fatalf("a second replica: %+v", tr)
	}
	if tr := Transitions(two, oneLater); len(tr) != 1 {
		t.Fatalf("a replica recovered: %+v", tr)
	}
}

func TestNextReportExpiry(t *testing.T) {
	m := model(t)
	if d := NextReportExpiry(m, t0); d != 0 {
		t.Fatalf("no reports: %v", d)
	}
	m.Status.RouterReports = []v1alpha1.RouterReport{report("a", 30*time.Second), report("b", 100*time.Second), report("c", time.Hour)}
	if d := NextReportExpiry(m, t0); d != 21*time.Second {
		t.Fatalf("next expiry %v, want 21s", d)
	}
}

// The operator's classes of reasons are router/degraded's (the manager does not import the
// router's packages, so they are kept here as names).
func TestReasonClassesMatchTheRouter(t *testing.T) {
	for _, r := range degraded.Reasons {
		if keyReasons[string(r)] != r.KeyCorrectness() || informationalReasons[string(r)] != r.Informational() {
			t.Errorf("reason %s: operator key %v informational %v, router %v %v", r, keyReasons[string(r)],
				informationalReasons[string(r)], r.KeyCorrectness(), r.Informational())
		}
	}
	for name := range keyReasons {
		if !slices.Contains(degraded.Reasons, degraded.Reason(name)) {
			t.Errorf("operator reason %s unknown to the router", name)
		}
	}
	for name := range informationalReasons {
		if !slices.Contains(degraded.Reasons, degraded.Reason(name)) {
			t.Errorf("operator reason %s unknown to the router", name)
		}
	}
}
