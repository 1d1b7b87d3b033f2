package controllers

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
)

// ControllerName names the controller, its event reporter and its metrics.
const ControllerName = "kvroutedmodel"

// ownedTypes are the children the reconciler watches through their controller reference.
func ownedTypes() []client.Object {
	return []client.Object{
		&appsv1.Deployment{}, &corev1.Service{}, &corev1.ConfigMap{}, &corev1.ServiceAccount{},
		&rbacv1.Role{}, &rbacv1.RoleBinding{}, &policyv1.PodDisruptionBudget{},
		&networkingv1.NetworkPolicy{}, &autoscalingv2.HorizontalPodAutoscaler{},
		&corev1.PersistentVolumeClaim{},
	}
}

// CacheOptions restricts the manager's cache to what the operator made: children by the
// managed-by label, pods by the engine labels. Without it the operator would cache every
// Deployment, ConfigMap and Pod in the cluster.
func CacheOptions() cache.Options {
	children := labels.SelectorFromSet(labels.Set{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue})
	engines := labels.SelectorFromSet(labels.Set{v1alpha1.LabelPartOf: v1alpha1.PartOfValue, v1alpha1.LabelComponent: v1alpha1.ComponentEngine})
	by := map[client.Object]cache.ByObject{&corev1.Pod{}: {Label: engines}}
	for _, o := range ownedTypes() {
		by[o] = cache.ByObject{Label: children}
	}
	return cache.Options{ByObject: by}
}

// SetupWithManager registers the controller: the model (spec changes only: its own status
// writes must not loop), its children, and its engine pods (their readiness drives status
// and warm-up).
func (r *KVRoutedModelReconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1alpha1.KVRoutedModel{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, routerReportsChanged())))
	for _, o := range ownedTypes() {
		b = b.Owns(o)
	}
	return b.Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToModel)).Complete(r)
}

// routerReportsChanged passes a status write that changed status.routerReports: a router's report
// is what the IndexHealthy condition is computed from. The operator's own status writes leave
// the reports alone (except dropping those of gone pods, once), so they do not loop.
func routerReportsChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*v1alpha1.KVRoutedModel)
		n, ok2 := e.ObjectNew.(*v1alpha1.KVRoutedModel)
		return ok1 && ok2 && !equality.Semantic.DeepEqual(o.Status.RouterReports, n.Status.RouterReports)
	}}
}

// podToModel maps an engine pod to its model through the model label (engine pods are owned
// by a ReplicaSet, not by the model).
func podToModel(_ context.Context, o client.Object) []reconcile.Request {
	l := o.GetLabels()
	name := l[v1alpha1.LabelModel]
	if name == "" || l[v1alpha1.LabelComponent] != v1alpha1.ComponentEngine || l[v1alpha1.LabelPartOf] != v1alpha1.PartOfValue {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// NewReconciler builds the reconciler from a manager: its cached client, its live reader and
// an events-API recorder.
func NewReconciler(mgr ctrl.Manager, opts render.Options, clk clock.PassiveClock) *KVRoutedModelReconciler {
	return &KVRoutedModelReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder(ControllerName),
		Clock:     clk,
		Render:    opts,
	}
}
