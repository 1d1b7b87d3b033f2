package controllers

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/status"
)

// ScaledFromZero counts the models the operator scaled from zero to one replica because their
// routers held requests, on the manager's /metrics.
var ScaledFromZero = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvroute_operator_scaled_from_zero_total",
	Help: "Times the operator scaled a KVRoutedModel at zero replicas (spec.autoscaling.minReplicas 0) to one because its routers held requests (status.router.heldRequests > 0).",
}, []string{"namespace", "name"})

func init() { ctrlmetrics.Registry.MustRegister(ScaledFromZero) }

// wakeFromZero scales a model at zero replicas to one through its own /scale when its routers
// hold requests (status.Wakes says when). It writes spec.replicas as an autoscaler does, on the
// resourceVersion it read: if KEDA (or a person) scaled the model meanwhile the write conflicts
// and the next pass decides on the new value, so the two never overwrite each other. On
// success m carries the new replicas, so this pass already renders the engine at one.
func (r *KVRoutedModelReconciler) wakeFromZero(ctx context.Context, m *v1alpha1.KVRoutedModel, obs *status.Observed) (bool, error) {
	d := status.RouterDemand(*obs)
	if !status.Wakes(m, d) {
		return false, nil
	}
	sc := &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion},
		Spec:       autoscalingv1.ScaleSpec{Replicas: 1},
	}
	if err := r.SubResource("scale").Update(ctx, m, client.WithSubResourceBody(sc)); err != nil {
		if apierrors.IsConflict(err) {
			// The model changed since it was read (the autoscaler scaled it, a router
			// reported): the pass is requeued and decides again on what is there now.
			return false, fmt.Errorf("scale from zero: %w", err)
		}
		obs.Problems = append(obs.Problems, status.Problem{Reason: v1alpha1.ReasonApplyFailed,
			Message: fmt.Sprintf("%d request(s) are held but scaling the model from zero to one failed: %v", d.Held, err)})
		return false, fmt.Errorf("scale from zero: %w", err)
	}
	one := int32(1)
	m.Spec.Replicas = &one
	ScaledFromZero.WithLabelValues(m.Namespace, m.Name).Inc()
	log.FromContext(ctx).Info("scaled from zero: routers hold requests", "held", d.Held, "routers", d.Routers)
	if r.Recorder != nil {
		r.Recorder.Eventf(m, nil, corev1.EventTypeNormal, v1alpha1.ReasonScaledFromZero, "Scale",
			"%d request(s) held by %d router(s) at zero replicas: spec.replicas 0 -> 1 through /scale", d.Held, d.Routers)
	}
	return true, nil
}
