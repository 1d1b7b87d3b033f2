package render

import (
	"fmt"
	"strconv"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// QueueMetric is the default scaling signal: requests waiting in vLLM's scheduler.
const QueueMetric = "vllm:num_requests_waiting"

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
// operator sees every scale event. Default metric: QueueMetric per pod (custom metrics API).
func HorizontalPodAutoscaler(m *v1alpha1.KVRoutedModel) *autoscalingv2.HorizontalPodAutoscaler {
	a := m.Spec.Autoscaling
	var metrics []autoscalingv2.MetricSpec
	if a.HPA != nil && len(a.HPA.Metrics) > 0 {
		for i := range a.HPA.Metrics {
			metrics = append(metrics, *a.HPA.Metrics[i].DeepCopy())
		}
	} else {
		metrics = []autoscalingv2.MetricSpec{{
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
			MinReplicas:    ptr(*a.MinReplicas),
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

// ScaledObject renders KEDA's ScaledObject with one Prometheus trigger.
func ScaledObject(m *v1alpha1.KVRoutedModel) (*unstructured.Unstructured, error) {
	a := m.Spec.Autoscaling
	if a.KEDA == nil || a.KEDA.Prometheus == nil {
		return nil, fmt.Errorf("spec.autoscaling.keda.prometheus.serverAddress is required when spec.autoscaling.provider is KEDA")
	}
	k := a.KEDA
	query := k.Prometheus.Query
	if query == "" {
		query = DefaultKEDAQuery(m)
	}
	trigger := map[string]interface{}{
		"type":       "prometheus",
		"metricType": "AverageValue",
		"metadata": map[string]interface{}{
			"serverAddress": k.Prometheus.ServerAddress,
			"query":         query,
			// KEDA parses thresholds as floats; a Quantity like 500m must become 0.5.
			"threshold":           strconv.FormatFloat(a.TargetQueuePerReplica.AsApproximateFloat64(), 'f', -1, 64),
			"activationThreshold": "0",
		},
	}
	if k.Prometheus.AuthenticationRef != "" {
		trigger["authenticationRef"] = map[string]interface{}{"name": k.Prometheus.AuthenticationRef}
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
			"triggers": []interface{}{trigger},
		},
	}}
	u.SetGroupVersionKind(ScaledObjectGVK)
	return u, nil
}
