package controllers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/controllers/status"
)

var (
	hpaGVK        = autoscalingv2.SchemeGroupVersion.WithKind("HorizontalPodAutoscaler")
	apiServiceGVK = schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIServiceList"}
)

// Metrics API groups an HPA metric is served by.
const (
	customMetricsGroup   = "custom.metrics.k8s.io"
	externalMetricsGroup = "external.metrics.k8s.io"
	resourceMetricsGroup = "metrics.k8s.io"
)

// autoscalerResult is what the autoscaler step leaves for the status.
type autoscalerResult struct {
	current  *v1alpha1.AutoscalerStatus
	problems []status.Problem
	// retry is true when a missing API (KEDA, a metrics adapter) should be looked for again.
	retry bool
	// err is an apply or delete that failed: returned from the pass so controller-runtime
	// requeues it with backoff. Recorded only as a problem, a transient failure would leave the
	// model Degraded until some unrelated event happened to reconcile it again.
	err error
}

// reconcileAutoscaler applies the HPA or ScaledObject spec.autoscaling asks for and deletes
// the other one. Neither a missing KEDA nor a missing metrics API stops the rest of the
// reconcile: they only make the model Degraded until they appear.
func (r *KVRoutedModelReconciler) reconcileAutoscaler(ctx context.Context, m *v1alpha1.KVRoutedModel, wanted client.Object) (res autoscalerResult) {
	provider := ""
	if m.Spec.Autoscaling != nil {
		provider = m.Spec.Autoscaling.Provider
	}
	var errs []error
	if provider != "HPA" {
		if err := r.deleteIfOwned(ctx, m, hpaGVK, render.AutoscalerName(m)); err != nil {
			errs = append(errs, err)
		}
	}
	if provider != "KEDA" {
		if err := r.deleteIfOwned(ctx, m, render.ScaledObjectGVK, render.AutoscalerName(m)); err != nil {
			errs = append(errs, err)
		}
	}
	defer func() { res.err = errors.Join(errs...) }()
	if wanted == nil {
		return res
	}
	_, err := r.applyObject(ctx, wanted)
	switch {
	// NoMatch: the kind is unknown. NotFound: it was known, but the CRD is gone since (an
	// apply otherwise creates), which is KEDA uninstalled under a warm RESTMapper.
	case err != nil && provider == "KEDA" && apiMissing(err):
		res.retry = true
		res.problems = append(res.problems, status.Problem{Reason: v1alpha1.ReasonKEDANotInstalled,
			Message: "spec.autoscaling.provider is KEDA but the ScaledObject API (keda.sh/v1alpha1) is not installed; install KEDA or switch to HPA (everything else is reconciled)"})
		return res
	case err != nil:
		errs = append(errs, err)
		return res
	}
	kind := wanted.GetObjectKind().GroupVersionKind().Kind
	res.current = &v1alpha1.AutoscalerStatus{Kind: kind, Name: wanted.GetName()}
	if provider == "HPA" {
		if missing, err := r.missingMetricsAPIs(ctx, m); err != nil {
			res.problems = append(res.problems, status.Problem{Reason: v1alpha1.ReasonMetricsAPIUnavailable, Message: "checking the metrics APIs: " + err.Error()})
			res.retry = true
		} else if len(missing) > 0 {
			res.retry = true
			res.problems = append(res.problems, status.Problem{Reason: v1alpha1.ReasonMetricsAPIUnavailable,
				Message: fmt.Sprintf("the HPA's metrics need %s, which no APIService serves (or it is not Available); install an adapter such as prometheus-adapter (see docs/operator.md)", strings.Join(missing, ", "))})
		}
	}
	return res
}

// MetricsGroups are the metrics API groups an HPA for m reads: the default metrics are the
// routers' backlog, an External metric (external metrics API), and the engines' queue, a Pods
// metric (custom metrics API). The HPA scales down only when it reads every metric, so both
// are needed (docs/autoscaling.md has the adapter rules).
func MetricsGroups(m *v1alpha1.KVRoutedModel) []string {
	a := m.Spec.Autoscaling
	if a == nil || a.Provider != "HPA" {
		return nil
	}
	if a.HPA == nil || len(a.HPA.Metrics) == 0 {
		return []string{customMetricsGroup, externalMetricsGroup}
	}
	set := map[string]bool{}
	for _, ms := range a.HPA.Metrics {
		switch ms.Type {
		case autoscalingv2.PodsMetricSourceType, autoscalingv2.ObjectMetricSourceType:
			set[customMetricsGroup] = true
		case autoscalingv2.ExternalMetricSourceType:
			set[externalMetricsGroup] = true
		case autoscalingv2.ResourceMetricSourceType, autoscalingv2.ContainerResourceMetricSourceType:
			set[resourceMetricsGroup] = true
		}
	}
	out := make([]string, 0, len(set))
	for g := range set {
		out = append(out, g)
	}
	sort.Strings(out)
	return out
}

// missingMetricsAPIs lists the groups m's HPA needs that no Available APIService serves.
// It reads APIServices rather than discovery because an aggregated API that is registered but
// down still appears in discovery on some servers; the APIService's Available condition is
// what the HPA controller's own client depends on.
func (r *KVRoutedModelReconciler) missingMetricsAPIs(ctx context.Context, m *v1alpha1.KVRoutedModel) ([]string, error) {
	need := MetricsGroups(m)
	if len(need) == 0 {
		return nil, nil
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(apiServiceGVK)
	if err := r.APIReader.List(ctx, list); err != nil {
		return nil, err
	}
	served := map[string]bool{}
	for _, s := range list.Items {
		group, _, _ := unstructured.NestedString(s.Object, "spec", "group")
		if group == "" || !apiServiceAvailable(&s) {
			continue
		}
		served[group] = true
	}
	var missing []string
	for _, g := range need {
		if !served[g] {
			missing = append(missing, g)
		}
	}
	return missing, nil
}

// apiServiceAvailable is false only when the aggregator says the API is not Available; an
// APIService it has not judged yet counts as available, so a fresh adapter is not flagged.
func apiServiceAvailable(s *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(s.Object, "status", "conditions")
	for _, c := range conds {
		cm, ok := c.(map[string]interface{})
		if ok && cm["type"] == "Available" {
			return cm["status"] != "False"
		}
	}
	return true
}
