package status

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
)

// ModelCache reports the weight cache's claim as read from the API server (pvc nil: not
// found); nil without spec.model.cache. Message says what keeps the cache from working as
// the spec says: a missing or lost claim, or access modes other than spec.model.cache.accessMode.
func ModelCache(m *v1alpha1.KVRoutedModel, pvc *corev1.PersistentVolumeClaim) *v1alpha1.ModelCacheStatus {
	c := m.Spec.Model.Cache
	if c == nil {
		return nil
	}
	st := &v1alpha1.ModelCacheStatus{ClaimName: render.ModelCacheClaimName(m), Managed: c.Size != nil}
	if pvc == nil {
		st.Message = fmt.Sprintf("PersistentVolumeClaim %s/%s not found: the engine pods stay Pending until it exists", m.Namespace, st.ClaimName)
		return st
	}
	st.Phase = string(pvc.Status.Phase)
	st.AccessModes = slices.Clone(pvc.Spec.AccessModes)
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		st.Capacity = q.String()
	}
	switch {
	case pvc.Status.Phase == corev1.ClaimLost:
		st.Message = fmt.Sprintf("PersistentVolumeClaim %s lost its volume: the cached weights are gone and the engine pods cannot start", st.ClaimName)
	case !slices.Contains(pvc.Spec.AccessModes, c.AccessMode):
		st.Message = fmt.Sprintf("PersistentVolumeClaim %s has access modes %v, not spec.model.cache.accessMode %s: set accessMode to the claim's mode (ReadWriteOnce allows one engine replica), or use a claim with that mode",
			st.ClaimName, pvc.Spec.AccessModes, c.AccessMode)
	}
	return st
}
