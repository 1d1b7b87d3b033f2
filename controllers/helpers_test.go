package controllers

import (
	"reflect"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

func TestMetricsGroups(t *testing.T) {
	hpa := func(ms ...autoscalingv2.MetricSpec) *v1alpha1.KVRoutedModel {
		m := &v1alpha1.KVRoutedModel{}
		m.Spec.Autoscaling = &v1alpha1.AutoscalingSpec{Provider: "HPA", MaxReplicas: 3}
		if len(ms) > 0 {
			m.Spec.Autoscaling.HPA = &v1alpha1.HPASpec{Metrics: ms}
		}
		return m
	}
	for name, tc := range map[string]struct {
		m    *v1alpha1.KVRoutedModel
		want []string
	}{
		"no autoscaling":  {&v1alpha1.KVRoutedModel{}, nil},
		"keda":            {&v1alpha1.KVRoutedModel{Spec: v1alpha1.KVRoutedModelSpec{Autoscaling: &v1alpha1.AutoscalingSpec{Provider: "KEDA"}}}, nil},
		"default metrics": {hpa(), []string{customMetricsGroup, externalMetricsGroup}},
		"external and resource": {hpa(autoscalingv2.MetricSpec{Type: autoscalingv2.ExternalMetricSourceType}, autoscalingv2.MetricSpec{Type: autoscalingv2.ResourceMetricSourceType}),
			[]string{externalMetricsGroup, resourceMetricsGroup}},
		"object": {hpa(autoscalingv2.MetricSpec{Type: autoscalingv2.ObjectMetricSourceType}), []string{customMetricsGroup}},
	} {
		if got := MetricsGroups(tc.m); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}

func TestToApplyContentDropsStatusAndNullTimestamps(t *testing.T) {
	d := &appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"}, ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	u, err := toApplyContent(d)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := u.Object["status"]; ok {
		t.Errorf("status kept: %v", u.Object["status"])
	}
	for _, path := range [][]string{{"metadata", "creationTimestamp"}, {"spec", "template", "metadata", "creationTimestamp"}} {
		if _, found, _ := unstructured.NestedFieldNoCopy(u.Object, path...); found {
			t.Errorf("%v kept", path)
		}
	}
	if u.GetKind() != "Deployment" || u.GetName() != "x" {
		t.Errorf("identity lost: %s %s", u.GetKind(), u.GetName())
	}
	if _, err := toApplyContent(&appsv1.Deployment{}); err == nil {
		t.Error("an object without TypeMeta was accepted")
	}
}

func TestEarliest(t *testing.T) {
	if earliest(0, time.Second) != time.Second || earliest(time.Second, 0) != time.Second || earliest(2*time.Second, time.Second) != time.Second {
		t.Error("earliest picks wrong")
	}
}

func TestPodToModel(t *testing.T) {
	p := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{
		v1alpha1.LabelModel: "m", v1alpha1.LabelComponent: v1alpha1.ComponentEngine, v1alpha1.LabelPartOf: v1alpha1.PartOfValue}}}
	reqs := podToModel(ctx, p)
	if len(reqs) != 1 || reqs[0].Namespace != "ns" || reqs[0].Name != "m" {
		t.Errorf("requests %v", reqs)
	}
	p.Labels[v1alpha1.LabelComponent] = v1alpha1.ComponentRouter
	if reqs := podToModel(ctx, p); len(reqs) != 0 {
		t.Errorf("router pod mapped to %v", reqs)
	}
}
