package render

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// The model cache (spec.model.cache): a claim mounted read-write in every engine pod, with
// HF_HOME on it, so weights downloaded once are loaded from it by every later pod.
const (
	ModelCacheVolume    = "model-cache"
	ModelCacheMountPath = "/var/lib/kvroute/model-cache"
)

// ModelCacheClaimName is the claim the engines cache weights on: the user's claimName, or
// <name>-model-cache for one the operator creates; "" without spec.model.cache.
func ModelCacheClaimName(m *v1alpha1.KVRoutedModel) string {
	c := m.Spec.Model.Cache
	switch {
	case c == nil:
		return ""
	case c.ClaimName != "":
		return c.ClaimName
	default:
		return ManagedModelCacheName(m)
	}
}

// ManagedModelCacheName is the name of the claim the operator creates for spec.model.cache.size.
func ManagedModelCacheName(m *v1alpha1.KVRoutedModel) string { return m.Name + "-model-cache" }

// cacheSingleNode reports whether the cache's access mode attaches it to one node (or one
// pod), which rules out a second engine pod next to the first, even during a rollout.
func cacheSingleNode(m *v1alpha1.KVRoutedModel) bool {
	c := m.Spec.Model.Cache
	return c != nil && c.AccessMode != corev1.ReadWriteMany
}

// ModelCachePVC renders the claim the operator creates (spec.model.cache.size); nil for an
// existing claim or no cache. With onDelete Retain it carries no owner reference, so
// garbage collection leaves it when the model is deleted and a model re-created under the
// same name mounts it again; with Delete the model owns it.
func ModelCachePVC(m *v1alpha1.KVRoutedModel) *corev1.PersistentVolumeClaim {
	c := m.Spec.Model.Cache
	if c == nil || c.Size == nil {
		return nil
	}
	om := objectMeta(m, ManagedModelCacheName(m), v1alpha1.ComponentEngine)
	if c.OnDelete != v1alpha1.CacheDelete {
		om.OwnerReferences = nil
	}
	mode := c.AccessMode
	if mode == "" {
		mode = corev1.ReadWriteOnce
	}
	return &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: om,
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{mode},
			StorageClassName: copyPtr(c.StorageClassName),
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: c.Size.DeepCopy()},
			},
		},
	}
}
