package controllers

import (
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
)

// A disaggregated model reconciles into a decode pool (the engine Deployment, on /scale), a
// prefill Deployment with its own HPA, policies admitting each pool from the other, and a
// status per pool; removing spec.disaggregation removes the prefill children.
func TestDisaggregatedModelReconciles(t *testing.T) {
	ns := namespace(t, "pd")
	m := newModel(t, ns, "pd", func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Replicas = ptrTo(int32(2))
		m.Spec.Disaggregation = &v1alpha1.DisaggregationSpec{Prefill: v1alpha1.PrefillPoolSpec{
			Replicas:    ptrTo(int32(3)),
			Parallelism: &v1alpha1.ParallelismSpec{DataLocal: 2},
		}}
	})
	dec := engine(t, m)
	if *dec.Spec.Replicas != 2 || dec.Spec.Template.Labels[v1alpha1.LabelRole] != v1alpha1.RoleDecode {
		t.Fatalf("decode pool: replicas %d, labels %v", *dec.Spec.Replicas, dec.Spec.Template.Labels)
	}
	pre := &appsv1.Deployment{}
	eventually(t, 20*time.Second, func() error { return k8s.Get(ctx, key(ns, render.PrefillName(m)), pre) })
	ctr := pre.Spec.Template.Spec.Containers[0]
	if *pre.Spec.Replicas != 3 || pre.Spec.Template.Labels[v1alpha1.LabelRole] != v1alpha1.RolePrefill ||
		!slices.Contains(ctr.Args, `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`) {
		t.Fatalf("prefill pool: replicas %d, labels %v, args %q", *pre.Spec.Replicas, pre.Spec.Template.Labels, ctr.Args)
	}
	for _, name := range []string{render.EngineName(m), render.PrefillName(m)} {
		eventually(t, 20*time.Second, func() error { return k8s.Get(ctx, key(ns, name), &networkingv1.NetworkPolicy{}) })
	}

	setDeploymentStatus(t, ns, render.PrefillName(m), 3, 3, 2)
	eventually(t, 20*time.Second, func() error {
		p := getModel(t, m).Status.Prefill
		if p == nil || p.ReadyReplicas != 2 || p.DeploymentName != render.PrefillName(m) ||
			!slices.Equal(p.SideChannelPorts, []int32{5700, 5701}) || p.Selector == "" {
			return fmt.Errorf("status.prefill = %+v", p)
		}
		return nil
	})

	// /scale moves the decode pool only.
	scaleTo(t, m, 4)
	waitEngineReplicas(t, m, 4)
	if err := k8s.Get(ctx, key(ns, render.PrefillName(m)), pre); err != nil || *pre.Spec.Replicas != 3 {
		t.Fatalf("prefill replicas after /scale: %v %v", pre.Spec.Replicas, err)
	}

	// An HPA on the prefill Deployment itself, then no split at all.
	update(t, m, func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Disaggregation.Prefill.Autoscaling = &v1alpha1.PoolAutoscaling{MaxReplicas: 6}
	})
	hpa := &autoscalingv2.HorizontalPodAutoscaler{}
	eventually(t, 20*time.Second, func() error { return k8s.Get(ctx, key(ns, render.PrefillName(m)), hpa) })
	if hpa.Spec.ScaleTargetRef.Kind != "Deployment" || hpa.Spec.ScaleTargetRef.Name != render.PrefillName(m) || hpa.Spec.MaxReplicas != 6 {
		t.Fatalf("prefill HPA target %+v max %d", hpa.Spec.ScaleTargetRef, hpa.Spec.MaxReplicas)
	}
	update(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.Disaggregation = nil })
	eventually(t, 20*time.Second, func() error {
		err := k8s.Get(ctx, key(ns, render.PrefillName(m)), &appsv1.Deployment{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("prefill Deployment still there (%v)", err)
		}
		if getModel(t, m).Status.Prefill != nil {
			return fmt.Errorf("status.prefill still set")
		}
		return nil
	})
}

func update(t *testing.T, m *v1alpha1.KVRoutedModel, edit func(*v1alpha1.KVRoutedModel)) {
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
