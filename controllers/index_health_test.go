package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/controllers/status"
	"github.com/kvroute/kvroute/router/report"
)

// asRouter is the API config of the model's router ServiceAccount: what a router pod has.
func asRouter(m *v1alpha1.KVRoutedModel) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: fmt.Sprintf("system:serviceaccount:%s:%s", m.Namespace, render.RouterName(m)),
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + m.Namespace, "system:authenticated"}}
	return c
}

func routerPod(t *testing.T, m *v1alpha1.KVRoutedModel, name string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.Namespace, Labels: render.RouterSelector(m)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kvrouter", Image: "example.com/kvrouter:test"}}}}
	if err := k8s.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

// Two router pods write their own reports into the model's status with nothing but the Role the
// operator renders; the operator aggregates them into IndexHealthy (with an Event) and, for a
// hash mismatch, Degraded/IndexUnhealthy, while Ready is left to the children. A router may not
// write another model's status.
func TestRouterReportsBecomeIndexHealthy(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "index")
	m := newModel(t, ns, "m", nil)
	other := newModel(t, ns, "other", nil)
	waitCondition(t, m, v1alpha1.ConditionIndexHealthy, "Unknown/"+v1alpha1.ReasonNoRouterReport)
	eventually(t, 20*time.Second, func() error { // the operator's Role for the router
		return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: render.RouterName(m)}, &rbacv1.Role{})
	})
	routerPod(t, m, "m-router-a")
	routerPod(t, m, "m-router-b")

	var degraded []report.Degraded
	newReporter := func(pod, model string) *report.Reporter {
		r, err := report.New(asRouter(m), report.Options{Namespace: ns, Model: model, Pod: pod, Now: testClock.Now,
			Source: func() []report.Degraded { return degraded }})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := newReporter("m-router-a", m.Name), newReporter("m-router-b", m.Name)
	eventually(t, 20*time.Second, func() error { return errors.Join(a.Sync(ctx), b.Sync(ctx)) }) // RBAC caches settle
	got := waitCondition(t, m, v1alpha1.ConditionIndexHealthy, "True/"+v1alpha1.ReasonIndexHealthy)
	if len(got.Status.RouterReports) != 2 {
		t.Fatalf("reports %+v", got.Status.RouterReports)
	}

	degraded = []report.Degraded{{Replica: "m-engine-x/0", Reason: "hash-mismatch", Since: testClock.Now(), Detail: "3 recomputed block hashes differed"}}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	got = waitCondition(t, m, v1alpha1.ConditionIndexHealthy, "False/"+v1alpha1.ReasonIndexUnhealthy)
	if c := condition(got, v1alpha1.ConditionDegraded); c != "True/"+v1alpha1.ReasonIndexUnhealthy {
		t.Fatalf("Degraded %s: %s", c, describe(got.Status.Conditions))
	}
	if len(got.Status.RouterReports) != 2 {
		t.Fatalf("router b's report lost: %+v", got.Status.RouterReports)
	}
	eventually(t, 20*time.Second, func() error {
		evs := &eventsv1.EventList{}
		if err := k8s.List(ctx, evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == m.Name && e.Reason == v1alpha1.ReasonIndexUnhealthy && e.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("no IndexUnhealthy warning event among %d", len(evs.Items))
	})
	// Another replica and reason instead: a Warning Event whose note names them. client-go's
	// events recorder folds Events of one type, reason, action and regarding object into a
	// series that keeps the first note; the regarding reference carries the model's
	// resourceVersion, which every report and status write changes, so a new set of findings
	// is never folded into the first. This keeps it so.
	degraded = []report.Degraded{{Replica: "m-engine-y/0", Reason: "keys-wrong", Since: testClock.Now(), Detail: "exact index predicted 4096 cached tokens, the engine reported 0"}}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		evs := &eventsv1.EventList{}
		if err := k8s.List(ctx, evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == m.Name && e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "m-engine-y/0 keys-wrong") {
				return nil
			}
		}
		return fmt.Errorf("no Warning Event names m-engine-y/0 keys-wrong among %d", len(evs.Items))
	})

	// The fault clears: healthy again, Degraded off.
	degraded = nil
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, m, v1alpha1.ConditionIndexHealthy, "True/"+v1alpha1.ReasonIndexHealthy)
	waitCondition(t, m, v1alpha1.ConditionDegraded, "False/"+v1alpha1.ReasonAsExpected)

	// Least privilege: the router's Role names its own model only.
	if err := newReporter("m-router-a", other.Name).Sync(ctx); !apierrors.IsForbidden(err) {
		t.Fatalf("writing another model's status: %v, want forbidden", err)
	}

	// Both routers stop reporting; the model must show it within 60 s of their last write
	// (a TTL of two minutes would fail the first check). Their last writes are stamped
	// ReportTTL-3s ago on the operator's clock, router a's naming a fault so that the reconcile
	// that read them shows (IndexHealthy=False); then the clock moves 4 s, past the expiry,
	// with no write at all: only the reconciler's own look at the expiry (NextReportExpiry)
	// can turn the model Unknown/NoRouterReport.
	if status.ReportTTL+time.Second > 60*time.Second {
		t.Fatalf("ReportTTL %v: a router that stops would show after 60 s", status.ReportTTL)
	}
	lastWrite := testClock.Now().Add(-(status.ReportTTL - 3*time.Second))
	stopped := func(pod string, d []report.Degraded) *report.Reporter {
		r, err := report.New(asRouter(m), report.Options{Namespace: ns, Model: m.Name, Pod: pod,
			Now: func() time.Time { return lastWrite }, Source: func() []report.Degraded { return d }})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if err := stopped("m-router-b", nil).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	fault := []report.Degraded{{Replica: "m-engine-x/0", Reason: "stalled", Since: lastWrite, Detail: "5 messages received and none applied in 5s"}}
	if err := stopped("m-router-a", fault).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	got = waitCondition(t, m, v1alpha1.ConditionIndexHealthy, "False/"+v1alpha1.ReasonIndexUnhealthy)
	for _, r := range got.Status.RouterReports {
		if !r.ObservedAt.Time.Equal(lastWrite.Truncate(time.Second)) {
			t.Fatalf("report %s observed at %v, want the last write %v", r.Pod, r.ObservedAt, lastWrite)
		}
	}
	testClock.SetTime(testClock.Now().Add(4 * time.Second))
	waitCondition(t, m, v1alpha1.ConditionIndexHealthy, "Unknown/"+v1alpha1.ReasonNoRouterReport)
}
