package status

import (
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// Demand is what the routers' fresh reports say about requests waiting for the model.
type Demand struct {
	// Held is the requests the routers hold for want of a ready replica, summed: each router
	// holds its own.
	Held int32
	// Routers is how many fresh reports hold at least one.
	Routers int
	// BacklogSeconds is the largest reported backlog (each router reports the fleet's); nil
	// when none is measured.
	BacklogSeconds *resource.Quantity
}

// RouterDemand reads the held requests and the backlog from the fresh router reports: a
// router that stopped reporting (gone, or cut off for more than ReportTTL) holds nothing.
func RouterDemand(o Observed) Demand {
	var d Demand
	for _, r := range freshReports(o) {
		if r.Held > 0 {
			d.Held += r.Held
			d.Routers++
		}
		if b := r.BacklogSeconds; b != nil && (d.BacklogSeconds == nil || b.Cmp(*d.BacklogSeconds) > 0) {
			d.BacklogSeconds = b
		}
	}
	if d.BacklogSeconds != nil {
		c := d.BacklogSeconds.DeepCopy()
		d.BacklogSeconds = &c
	}
	return d
}

// Wakes reports whether the operator scales the model from zero to one replica now: the model
// opted into scaling to zero (spec.autoscaling.minReplicas 0), spec.replicas is 0, it is not
// suspended, and the routers hold requests. It acts at zero replicas only, so it never
// contends with the autoscaler's own decisions above zero; at zero it agrees with KEDA's
// activation on the same held requests (docs/autoscaling.md "Scale from zero").
func Wakes(m *v1alpha1.KVRoutedModel, d Demand) bool {
	a := m.Spec.Autoscaling
	if m.Spec.Suspend || a == nil || a.MinReplicas == nil || *a.MinReplicas != 0 {
		return false
	}
	if m.Spec.Replicas == nil || *m.Spec.Replicas != 0 || d.Held == 0 {
		return false
	}
	// A disaggregated model whose prefill pool is pinned at zero (not autoscaled) would be
	// refused by the spec's rule that both pools are zero or neither: left to the person.
	if dg := m.Spec.Disaggregation; dg != nil && dg.Prefill.Replicas != nil && *dg.Prefill.Replicas == 0 {
		return false
	}
	return true
}
