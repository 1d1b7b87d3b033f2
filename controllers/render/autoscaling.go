package render

import (
	"fmt"
	"strconv"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// QueueMetric is the fallback scaling signal: requests waiting in vLLM's scheduler. It scales
// the model while the routers' backlog is absent, and beside it otherwise.
const QueueMetric = "vllm:num_requests_waiting"

// BacklogMetric is the default scaling signal: the prefill queued on the model's replicas in
// seconds of their measured drain, as the routers count it (router/backlog). Every router
// reports the fleet's figure, so queries take the max over router pods.
const BacklogMetric = "kvroute_router_backlog_seconds"

// HeldMetric is the demand a model at zero replicas shows: the requests its routers hold for
// want of a ready replica (router/admission). It is summed over router pods (each holds its own).
const HeldMetric = "kvroute_router_held_requests"

// ModelLabel is the label the operator's PodMonitors put on the router's and the engines' series:
// the KVRoutedModel's name (config/prometheus/monitor.yaml). The HPA's External metric selects
// on it: a served model name (model_name) may hold a '/', which a label selector refuses.
const ModelLabel = "model"

// ScaledObjectGVK is KEDA's ScaledObject; rendered unstructured so the operator does not
// import KEDA's module (and its pinned Kubernetes libraries).
var ScaledObjectGVK = schema.GroupVersionKind{Group: "keda.sh", Version: "v1alpha1", Kind: "ScaledObject"}

// DefaultBehavior scales up at once (cold starts take minutes) and down slowly.
func DefaultBehavior() *autoscalingv2.HorizontalPodAutoscalerBehavior {
	return &autoscalingv2.HorizontalPodAutoscalerBehavior{
		ScaleUp: &autoscalingv2.HPAScalingRules{
			StabilizationWindowSeconds: ptr(int32(0)),
			SelectPolicy:               ptr(autoscalingv2.MaxChangePolicySelect),
			Policies:                   []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PodsScalingPolicy, Value: 4, PeriodSeconds: 60}},
		},
		ScaleDown: &autoscalingv2.HPAScalingRules{
			StabilizationWindowSeconds: ptr(int32(300)),
			SelectPolicy:               ptr(autoscalingv2.MaxChangePolicySelect),
			Policies:                   []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PodsScalingPolicy, Value: 1, PeriodSeconds: 120}},
		},
	}
}

func behavior(a *v1alpha1.AutoscalingSpec) *autoscalingv2.HorizontalPodAutoscalerBehavior {
	if a.Behavior != nil {
		return a.Behavior.DeepCopy()
	}
	return DefaultBehavior()
}

func scaleTarget(m *v1alpha1.KVRoutedModel) autoscalingv2.CrossVersionObjectReference {
	return autoscalingv2.CrossVersionObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.Kind, Name: m.Name}
}

// HorizontalPodAutoscaler targets the KVRoutedModel's /scale, never the Deployment, so the
// operator sees every scale event. Default metrics: BacklogMetric per replica (external metrics
// API) and QueueMetric per pod (custom metrics API). The HPA never goes below one replica (its
// scale to zero is an alpha feature gate), so minReplicas 0 is KEDA's only (the CRD refuses it
// with HPA); a model set to spec.replicas 0 by hand is left there by the HPA, which does not
// act on a target at zero, and by the operator's wake (controllers/wake.go), which needs
// minReplicas 0.
func HorizontalPodAutoscaler(m *v1alpha1.KVRoutedModel) *autoscalingv2.HorizontalPodAutoscaler {
	a := m.Spec.Autoscaling
	var metrics []autoscalingv2.MetricSpec
	if a.HPA != nil && len(a.HPA.Metrics) > 0 {
		for i := range a.HPA.Metrics {
			metrics = append(metrics, *a.HPA.Metrics[i].DeepCopy())
		}
	} else {
		// The HPA takes the largest replica count its metrics ask for, and scales up on the
		// metrics it can read when one is missing: the queue scales the model while the
		// backlog is absent (no adapter rule, no router metrics, no drain rate measured yet).
		metrics = []autoscalingv2.MetricSpec{{
			Type: autoscalingv2.ExternalMetricSourceType,
			External: &autoscalingv2.ExternalMetricSource{
				Metric: autoscalingv2.MetricIdentifier{Name: BacklogMetric,
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{ModelLabel: m.Name}}},
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptr(a.TargetBacklogPerReplica.DeepCopy())},
			},
		}, {
			Type: autoscalingv2.PodsMetricSourceType,
			Pods: &autoscalingv2.PodsMetricSource{
				Metric: autoscalingv2.MetricIdentifier{Name: QueueMetric},
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptr(a.TargetQueuePerReplica.DeepCopy())},
			},
		}}
	}
	return &autoscalingv2.HorizontalPodAutoscaler{
		TypeMeta:   metav1.TypeMeta{APIVersion: "autoscaling/v2", Kind: "HorizontalPodAutoscaler"},
		ObjectMeta: objectMeta(m, AutoscalerName(m), ""),
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: scaleTarget(m),
			MinReplicas:    ptr(max(*a.MinReplicas, 1)),
			MaxReplicas:    a.MaxReplicas,
			Metrics:        metrics,
			Behavior:       behavior(a),
		},
	}
}

// DefaultKEDAQuery sums the queue over this model's engines; with metricType AverageValue
// KEDA's HPA divides it by the replica count, giving queue per replica.
func DefaultKEDAQuery(m *v1alpha1.KVRoutedModel) string {
	return fmt.Sprintf(`sum(%s{namespace=%q,model_name=%q})`, QueueMetric, m.Namespace, m.Spec.Model.Name)
}

// KEDABacklogQuery is the routers' backlog: the max over router pods, each reporting the fleet's.
func KEDABacklogQuery(m *v1alpha1.KVRoutedModel) string {
	return fmt.Sprintf(`max(%s{namespace=%q,model_name=%q})`, BacklogMetric, m.Namespace, m.Spec.Model.Name)
}

// KEDAHeldQuery is the requests the routers hold for want of a ready replica, summed.
func KEDAHeldQuery(m *v1alpha1.KVRoutedModel) string {
	return fmt.Sprintf(`sum(%s{namespace=%q,model_name=%q})`, HeldMetric, m.Namespace, m.Spec.Model.Name)
}

// kedaThreshold is a Quantity as KEDA parses thresholds, a float: 500m must become 0.5.
func kedaThreshold(q *resource.Quantity) string {
	return strconv.FormatFloat(q.AsApproximateFloat64(), 'f', -1, 64)
}

// kedaTriggers are the ScaledObject's Prometheus triggers: the routers' backlog and the
// engines' queue (KEDA's HPA takes the larger; an empty result reads 0, so the queue alone
// scales while the backlog is absent), or the query spec.autoscaling.keda.prometheus.query
// names instead of both; and with minReplicas 0 the requests the routers hold, whose
// activation threshold 0 brings a model at zero to one replica.
func kedaTriggers(m *v1alpha1.KVRoutedModel) []map[string]interface{} {
	a := m.Spec.Autoscaling
	trigger := func(name, query, threshold string) map[string]interface{} {
		return map[string]interface{}{"type": "prometheus", "name": name, "metricType": "AverageValue",
			"metadata": map[string]interface{}{"serverAddress": a.KEDA.Prometheus.ServerAddress, "query": query,
				"threshold": threshold, "activationThreshold": "0"}}
	}
	var out []map[string]interface{}
	if q := a.KEDA.Prometheus.Query; q != "" {
		out = append(out, trigger("query", q, kedaThreshold(a.TargetQueuePerReplica)))
	} else {
		out = append(out, trigger("backlog", KEDABacklogQuery(m), kedaThreshold(a.TargetBacklogPerReplica)),
			trigger("queue", DefaultKEDAQuery(m), kedaThreshold(a.TargetQueuePerReplica)))
	}
	if *a.MinReplicas == 0 {
		// Held requests are requests no engine has yet: counted against the queue's target.
		out = append(out, trigger("held", KEDAHeldQuery(m), kedaThreshold(a.TargetQueuePerReplica)))
	}
	return out
}

// ScaledObject renders KEDA's ScaledObject (kedaTriggers).
func ScaledObject(m *v1alpha1.KVRoutedModel) (*unstructured.Unstructured, error) {
	a := m.Spec.Autoscaling
	if a.KEDA == nil || a.KEDA.Prometheus == nil {
		return nil, fmt.Errorf("spec.autoscaling.keda.prometheus.serverAddress is required when spec.autoscaling.provider is KEDA")
	}
	k := a.KEDA
	var triggers []interface{}
	for _, trigger := range kedaTriggers(m) {
		if k.Prometheus.AuthenticationRef != "" {
			trigger["authenticationRef"] = map[string]interface{}{"name": k.Prometheus.AuthenticationRef}
		}
		triggers = append(triggers, trigger)
	}
	b, err := runtime.DefaultUnstructuredConverter.ToUnstructured(behavior(a))
	if err != nil {
		return nil, err
	}
	om, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ptr(objectMeta(m, AutoscalerName(m), "")))
	if err != nil {
		return nil, err
	}
	delete(om, "creationTimestamp")
	u := &unstructured.Unstructured{Object: map[string]interface{}{
		"metadata": om,
		"spec": map[string]interface{}{
			"scaleTargetRef": map[string]interface{}{
				"apiVersion": v1alpha1.GroupVersion.String(), "kind": v1alpha1.Kind, "name": m.Name,
			},
			"minReplicaCount": int64(*a.MinReplicas),
			"maxReplicaCount": int64(a.MaxReplicas),
			"pollingInterval": int64(*k.PollingInterval),
			"cooldownPeriod":  int64(*k.CooldownPeriod),
			"advanced": map[string]interface{}{
				"horizontalPodAutoscalerConfig": map[string]interface{}{"behavior": b},
			},
			"triggers": triggers,
		},
	}}
	u.SetGroupVersionKind(ScaledObjectGVK)
	return u, nil
}
