package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/router/report"
)

// A model at zero replicas that opted into it (KEDA, minReplicas 0): its router reports held
// requests through the Role the operator renders; the status shows them (heldRequests, the
// backlog, Available/RequestsHeld), and the operator scales the model to one through its /scale
// (spec.replicas, then the engine Deployment) with a Normal ScaledFromZero Event, counted once.
// A model at zero by hand (no autoscaling) shows its held requests but is left at zero.
func TestHeldRequestsWakeModelAtZero(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "wake")
	zero := int32(0)
	m := newModel(t, ns, "m", func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Replicas = &zero
		m.Spec.Autoscaling = &v1alpha1.AutoscalingSpec{Provider: "KEDA", MinReplicas: &zero, MaxReplicas: 3,
			KEDA: &v1alpha1.KEDASpec{Prometheus: &v1alpha1.KEDAPrometheus{ServerAddress: "http://prometheus.monitoring:9090"}}}
	})
	byHand := newModel(t, ns, "by-hand", func(m *v1alpha1.KVRoutedModel) { m.Spec.Replicas = &zero })
	for _, x := range []*v1alpha1.KVRoutedModel{m, byHand} {
		eventually(t, 20*time.Second, func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: render.RouterName(x)}, &rbacv1.Role{})
		})
		routerPod(t, x, x.Name+"-router-a")
	}
	var held atomic.Int32
	newReporter := func(x *v1alpha1.KVRoutedModel) *report.Reporter {
		r, err := report.New(asRouter(x), report.Options{Namespace: ns, Model: x.Name, Pod: x.Name + "-router-a", Now: testClock.Now,
			Source: func() []report.Degraded { return nil }, Held: func() int { return int(held.Load()) },
			Backlog: func() (float64, bool) { return 1.5, true }})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, h := newReporter(m), newReporter(byHand)
	eventually(t, 20*time.Second, func() error { return errors.Join(a.Sync(ctx), h.Sync(ctx)) }) // RBAC caches settle

	// Nothing held: the report is read (the backlog shows) and the model stays at zero.
	eventually(t, 20*time.Second, func() error {
		got := getModel(t, m)
		if r := got.Status.Router; r == nil || r.BacklogSeconds == nil || r.BacklogSeconds.String() != "1500m" || r.HeldRequests != 0 {
			return fmt.Errorf("status.router %+v", got.Status.Router)
		}
		return nil
	})
	if got := getModel(t, m); *got.Spec.Replicas != 0 {
		t.Fatalf("spec.replicas %d with nothing held, want 0", *got.Spec.Replicas)
	}
	woken := testutil.ToFloat64(ScaledFromZero.WithLabelValues(ns, m.Name))

	// Two requests held: written at once (no heartbeat wait), shown, and the model woken.
	held.Store(2)
	if err := errors.Join(a.Sync(ctx), h.Sync(ctx)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		got := getModel(t, m)
		if *got.Spec.Replicas != 1 {
			return fmt.Errorf("spec.replicas %d, want 1", *got.Spec.Replicas)
		}
		if got.Status.Router == nil || got.Status.Router.HeldRequests != 2 {
			return fmt.Errorf("status.router %+v", got.Status.Router)
		}
		if c := condition(got, v1alpha1.ConditionAvailable); c != "False/"+v1alpha1.ReasonRequestsHeld {
			return fmt.Errorf("Available %s: %s", c, describe(got.Status.Conditions))
		}
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: render.EngineName(m)}, d); err != nil {
			return err
		}
		if *d.Spec.Replicas != 1 {
			return fmt.Errorf("engine Deployment replicas %d, want 1", *d.Spec.Replicas)
		}
		return nil
	})
	eventually(t, 20*time.Second, func() error {
		evs := &eventsv1.EventList{}
		if err := k8s.List(ctx, evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == m.Name && e.Type == corev1.EventTypeNormal && e.Reason == v1alpha1.ReasonScaledFromZero &&
				strings.Contains(e.Note, "2 request(s) held by 1 router(s)") {
				return nil
			}
		}
		return fmt.Errorf("no ScaledFromZero Event among %d", len(evs.Items))
	})
	if got := testutil.ToFloat64(ScaledFromZero.WithLabelValues(ns, m.Name)) - woken; got != 1 {
		t.Fatalf("scaled_from_zero_total rose by %v, want 1", got)
	}

	// The model at zero by hand shows its demand and is left alone.
	eventually(t, 20*time.Second, func() error {
		got := getModel(t, byHand)
		if got.Status.Router == nil || got.Status.Router.HeldRequests != 2 {
			return fmt.Errorf("status.router %+v", got.Status.Router)
		}
		return nil
	})
	if got := getModel(t, byHand); *got.Spec.Replicas != 0 {
		t.Fatalf("a model at zero without spec.autoscaling.minReplicas 0 was scaled to %d", *got.Spec.Replicas)
	}
	if got := testutil.ToFloat64(ScaledFromZero.WithLabelValues(ns, byHand.Name)); got != 0 {
		t.Fatalf("by-hand model counted %v wakes", got)
	}

	// Released: the report says so at once and the count goes back to zero.
	held.Store(0)
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		if r := getModel(t, m).Status.Router; r == nil || r.HeldRequests != 0 {
			return fmt.Errorf("status.router %+v", r)
		}
		return nil
	})
	if got := testutil.ToFloat64(ScaledFromZero.WithLabelValues(ns, m.Name)) - woken; got != 1 {
		t.Fatalf("scaled_from_zero_total rose by %v, want 1 (woken once)", got)
	}
}
