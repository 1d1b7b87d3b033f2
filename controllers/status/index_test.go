package status

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"

	"github.com/kvroute/kvroute/router/degraded"
	routerreport "github.com/kvroute/kvroute/router/report"
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
		{"a report 51 s old is stale", []v1alpha1.RouterReport{report("r1", 51*time.Second, deg("e-0/0", "keys-wrong"))},
			metav1.ConditionUnknown, v1alpha1.ReasonNoRouterReport, false, "in the last 50s", 1},
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
	// Issue 19: a router that stops is shown within 60 s of its last write. Its report, just
	// written, expires ReportTTL later and the reconciler looks again a second after that.
	m.Status.RouterReports = []v1alpha1.RouterReport{report("a", 0)}
	if d := NextReportExpiry(m, t0); d != 51*time.Second {
		t.Fatalf("next expiry of a report just written %v, want 51s (within 60 s)", d)
	}
}

// The report's timing: routers confirm every routerreport.DefaultHeartbeat, the operator counts a
// report for ReportTTL, so two missed confirmations in a row are tolerated (with a few seconds
// for a slow API call), and a router that stops shows within 60 s of its last write.
func TestReportTimingBound(t *testing.T) {
	if ReportTTL < 2*routerreport.DefaultHeartbeat+5*time.Second {
		t.Errorf("ReportTTL %v: fewer than two missed confirmations (every %v) tolerated", ReportTTL, routerreport.DefaultHeartbeat)
	}
	if ReportTTL+time.Second > 60*time.Second {
		t.Errorf("ReportTTL %v: a router that stops shows after 60 s", ReportTTL)
	}
}

// With several routers reporting, IndexHealthy does not depend on the order of their entries
// (each router applies its own entry; the list order moves as routers come and go): the same
// reports in any order give the same condition, details included.
func TestIndexHealthyStableAcrossReportOrder(t *testing.T) {
	mk := func(pod, detail string) v1alpha1.RouterReport {
		d := deg("e-0/0", "stalled")
		d.Detail = detail
		return report(pod, 0, d)
	}
	a, b, c := mk("r1", "no batch for 7s"), mk("r2", "no batch for 9s"), mk("r3", "no batch for 8s")
	var first metav1.Condition
	for i, order := range [][]v1alpha1.RouterReport{{a, b, c}, {c, b, a}, {b, c, a}} {
		m := &v1alpha1.KVRoutedModel{}
		m.Status.RouterReports = order
		got, _ := indexCondition(Observed{Model: m, Now: t0})
		if i == 0 {
			first = got
			if !strings.Contains(got.Message, "(3 of 3 routers): no batch for 7s") {
				t.Fatalf("message %q: want r1's detail, the first pod by name", got.Message)
			}
			continue
		}
		if got.Status != first.Status || got.Reason != first.Reason || got.Message != first.Message {
			t.Fatalf("order %d: %+v, first order gave %+v", i, got, first)
		}
	}
}

// status.router.peersConnected: every fresh report lists every other reporting router.
func TestPeersConnected(t *testing.T) {
	withPeers := func(pod string, peers ...string) v1alpha1.RouterReport {
		r := report(pod, 0)
		r.Peers = peers
		return r
	}
	for _, tc := range []struct {
		name    string
		reports []v1alpha1.RouterReport
		want    bool
		msg     string
	}{
		{"all see each other", []v1alpha1.RouterReport{withPeers("r1", "r2", "r3"), withPeers("r2", "r1", "r3"), withPeers("r3", "r1", "r2")}, true, "3 routers see each other"},
		{"partitioned", []v1alpha1.RouterReport{withPeers("r1", "r2"), withPeers("r2", "r1"), withPeers("r3")}, false, "r1 does not see r3; r2 does not see r3; r3 does not see r1; r3 does not see r2"},
		{"one reporting", []v1alpha1.RouterReport{withPeers("r1")}, false, "1 router(s) reporting"},
	} {
		m := &v1alpha1.KVRoutedModel{}
		m.Status.RouterReports = tc.reports
		got, msg := peersConnected(Observed{Model: m, Now: t0})
		if got != tc.want || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: %v %q, want %v %q", tc.name, got, msg, tc.want, tc.msg)
		}
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
