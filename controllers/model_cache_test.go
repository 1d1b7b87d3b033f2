package controllers

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
)

// eventsWithReason lists the events about m with the given reason.
func eventsWithReason(t *testing.T, m *v1alpha1.KVRoutedModel, reason string) []eventsv1.Event {
	t.Helper()
	evs := &eventsv1.EventList{}
	if err := k8s.List(ctx, evs, client.InNamespace(m.Namespace)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range evs.Items {
		if e.Regarding.UID == m.UID && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// A model asking for a cache of its own gets a claim, mounted by the engine pods, reported in
// status; onDelete decides whether the model owns it.
func TestManagedModelCacheIsCreatedMountedAndReported(t *testing.T) {
	ns := namespace(t, "model-cache")
	size := resource.MustParse("20Gi")
	m := newModel(t, ns, "cached", func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Model.Cache = &v1alpha1.ModelCacheSpec{Size: &size, OnDelete: v1alpha1.CacheDelete}
	})
	m = getModel(t, m)
	pvc := &corev1.PersistentVolumeClaim{}
	key := client.ObjectKey{Namespace: ns, Name: "cached-model-cache"}
	eventually(t, 20*time.Second, func() error {
		if err := k8s.Get(ctx, key, pvc); err != nil {
			return err
		}
		if err := ownedBy(pvc, m); err != nil {
			return err
		}
		if q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; !q.Equal(size) || pvc.Spec.AccessModes[0] != corev1.ReadWriteOnce {
			return fmt.Errorf("claim spec %+v", pvc.Spec)
		}
		return nil
	})
	eventually(t, 20*time.Second, func() error {
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cached-engine"}, d); err != nil {
			return err
		}
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			return fmt.Errorf("strategy %s with a ReadWriteOnce cache", d.Spec.Strategy.Type)
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == key.Name {
				return nil
			}
		}
		return fmt.Errorf("engine pods do not mount %s", key.Name)
	})
	eventually(t, 20*time.Second, func() error {
		st := getModel(t, m).Status.Engine
		if st == nil || st.ModelCache == nil {
			return fmt.Errorf("no status.engine.modelCache")
		}
		c := st.ModelCache
		// envtest has no provisioner: the claim stays Pending, which is not a fault.
		if c.ClaimName != key.Name || !c.Managed || c.Phase != string(corev1.ClaimPending) || c.Message != "" {
			return fmt.Errorf("modelCache %+v", c)
		}
		return nil
	})

	// Retain: the owner reference goes, so deleting the model leaves the claim.
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.Model.Cache.OnDelete = v1alpha1.CacheRetain })
	eventually(t, 20*time.Second, func() error {
		if err := k8s.Get(ctx, key, pvc); err != nil {
			return err
		}
		if refs := pvc.OwnerReferences; len(refs) != 0 {
			return fmt.Errorf("retained claim still owned: %+v", refs)
		}
		return nil
	})
	if err := k8s.Delete(ctx, getModel(t, m)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(m), &v1alpha1.KVRoutedModel{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("model still there: %v", err)
		}
		return nil
	})
	if err := k8s.Get(ctx, key, pvc); err != nil || pvc.DeletionTimestamp != nil {
		t.Errorf("retained claim after the model's delete: %v %v", err, pvc.DeletionTimestamp)
	}
}

// Dropping spec.model.cache deletes a claim the model owns (onDelete: Delete).
func TestOwnedModelCacheGoesWhenTheSpecDropsIt(t *testing.T) {
	ns := namespace(t, "model-cache-drop")
	size := resource.MustParse("1Gi")
	m := newModel(t, ns, "dropped", func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Model.Cache = &v1alpha1.ModelCacheSpec{Size: &size, OnDelete: v1alpha1.CacheDelete}
	})
	key := client.ObjectKey{Namespace: ns, Name: "dropped-model-cache"}
	eventually(t, 20*time.Second, func() error { return k8s.Get(ctx, key, &corev1.PersistentVolumeClaim{}) })
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.Model.Cache = nil })
	eventually(t, 20*time.Second, func() error {
		pvc := &corev1.PersistentVolumeClaim{}
		err := k8s.Get(ctx, key, pvc)
		if apierrors.IsNotFound(err) || (err == nil && pvc.DeletionTimestamp != nil) {
			return nil // envtest has no GC of the pvc-protection finalizer; being deleted is enough
		}
		return fmt.Errorf("claim still there: %v", err)
	})
}

// An existing claim that is missing, or of another access mode than the spec says, is named in
// status.engine.modelCache.message and in a Warning event.
func TestExistingModelCacheClaimIsChecked(t *testing.T) {
	ns := namespace(t, "model-cache-existing")
	m := newModel(t, ns, "shared", func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Replicas = ptrTo(int32(2))
		m.Spec.Model.Cache = &v1alpha1.ModelCacheSpec{ClaimName: "weights", AccessMode: corev1.ReadWriteMany}
	})
	m = getModel(t, m)
	eventually(t, 20*time.Second, func() error {
		st := getModel(t, m).Status.Engine
		if st == nil || st.ModelCache == nil || !strings.Contains(st.ModelCache.Message, ns+"/weights not found") || st.ModelCache.Managed {
			return fmt.Errorf("status %+v", st)
		}
		if len(eventsWithReason(t, m, ReasonModelCache)) == 0 {
			return fmt.Errorf("no %s event", ReasonModelCache)
		}
		return nil
	})

	// The claim appears, but ReadWriteOnce: two replicas cannot share it.
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "weights"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if err := k8s.Create(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	// Nothing watches an unlabelled claim: a spec change makes the next pass.
	updateModel(t, m, func(m *v1alpha1.KVRoutedModel) { m.Spec.Engine.Args = []v1alpha1.EngineArg{"--max-model-len", "4096"} })
	eventually(t, 20*time.Second, func() error {
		c := getModel(t, m).Status.Engine.ModelCache
		if c.Phase != string(corev1.ClaimPending) || !strings.Contains(c.Message, "not spec.model.cache.accessMode ReadWriteMany") {
			return fmt.Errorf("modelCache %+v", c)
		}
		return nil
	})
	if got := render.ModelCacheClaimName(m); got != "weights" {
		t.Errorf("claim name %q", got)
	}
}

// A misspelt engine argument draws a Warning event naming the nearest vLLM flag.
func TestUnknownEngineArgWarns(t *testing.T) {
	ns := namespace(t, "engine-args")
	m := newModel(t, ns, "typo", func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Engine.Args = []v1alpha1.EngineArg{"--max-model-len", "4096", "--gpu-memory-utilisation", "0.9"}
	})
	m = getModel(t, m)
	eventually(t, 20*time.Second, func() error {
		evs := eventsWithReason(t, m, ReasonUnknownEngineArg)
		if len(evs) != 1 {
			return fmt.Errorf("%d %s events", len(evs), ReasonUnknownEngineArg)
		}
		if e := evs[0]; e.Type != corev1.EventTypeWarning || !strings.Contains(e.Note, `spec.engine.args[2] "--gpu-memory-utilisation"`) ||
			!strings.Contains(e.Note, "did you mean --gpu-memory-utilization?") {
			return fmt.Errorf("event %s %q", e.Type, e.Note)
		}
		return nil
	})
}
