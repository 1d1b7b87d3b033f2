package controllers

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// Field owners. Children have one; the warm-up annotation has its own, so applying a pod's
// annotation never touches, or is touched by, anything else on the pod.
const (
	FieldOwner       = "kvroute-operator"
	WarmupFieldOwner = "kvroute-warmup"
)

// applyObject server-side applies one rendered child and returns what the server holds.
//
// The renderers return typed objects (so `kvroutectl render` and the tests read them as
// such); they are applied as unstructured because client-go has no typed-object ->
// ApplyConfiguration conversion. controller-runtime warns that unstructured made from typed
// objects cannot tell a zero value from an unset one; the renderers only set what they mean
// (pointers for meaningful zeros) and toApplyContent drops the zero status and null
// timestamps that typed objects always carry, so nothing unintended is claimed.
func (r *KVRoutedModelReconciler) applyObject(ctx context.Context, obj client.Object) (*unstructured.Unstructured, error) {
	u, err := toApplyContent(obj)
	if err != nil {
		return nil, err
	}
	if err := r.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return nil, fmt.Errorf("apply %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return u, nil
}

func toApplyContent(obj client.Object) (*unstructured.Unstructured, error) {
	gvk := obj.GetObjectKind().GroupVersionKind()
	if gvk.Kind == "" {
		return nil, fmt.Errorf("rendered %T %s has no TypeMeta", obj, obj.GetName())
	}
	var content map[string]interface{}
	if u, ok := obj.(*unstructured.Unstructured); ok {
		content = runtime.DeepCopyJSON(u.Object)
	} else {
		c, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return nil, fmt.Errorf("convert %T %s: %w", obj, obj.GetName(), err)
		}
		content = c
	}
	delete(content, "status")
	for _, path := range [][]string{{"metadata", "creationTimestamp"}, {"spec", "template", "metadata", "creationTimestamp"}} {
		if v, found, _ := unstructured.NestedFieldNoCopy(content, path...); found && v == nil {
			unstructured.RemoveNestedField(content, path...)
		}
	}
	u := &unstructured.Unstructured{Object: content}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

// deleteIfOwned removes a child the spec no longer wants (NetworkPolicy switched off, the
// other autoscaler), but only one this model controls: a same-named object someone else
// made is left alone. A kind the server does not know (KEDA absent) has nothing to delete.
func (r *KVRoutedModelReconciler) deleteIfOwned(ctx context.Context, m *v1alpha1.KVRoutedModel, gvk schema.GroupVersionKind, name string) error {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	// Live read (the APIReader): the object may carry none of the labels the cache filters on.
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: name}, u)
	switch {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return nil
	case err != nil:
		return fmt.Errorf("get %s %s: %w", gvk.Kind, name, err)
	}
	if !metav1.IsControlledBy(u, m) {
		return nil
	}
	if err := r.Delete(ctx, u, client.Preconditions{UID: ptrTo(u.GetUID())}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s: %w", gvk.Kind, name, err)
	}
	return nil
}

func ptrTo[T any](v T) *T { return &v }
