// Package controllers holds the KVRoutedModel reconciler. It only orchestrates: the children
// come from controllers/render, the status from controllers/status, the warm-up annotations
// from controllers/warmup; this package reads, applies, deletes and writes status once.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/controllers/status"
	"github.com/kvroute/kvroute/controllers/warmup"
)

// DefaultRetryInterval is how often a model waiting for a missing API (KEDA, a metrics
// adapter) looks again. There is no watch on an API that does not exist yet.
const DefaultRetryInterval = 30 * time.Second

// KVRoutedModelReconciler reconciles KVRoutedModel objects.
type KVRoutedModelReconciler struct {
	// Client reads from the manager's label-restricted cache and writes to the API server.
	client.Client
	// APIReader reads live: objects the cache does not hold (unlabelled same-named objects,
	// APIServices, ScaledObjects).
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Clock stamps conditions and times the warm-up; tests pass a fake one.
	Clock         clock.PassiveClock
	Render        render.Options
	RetryInterval time.Duration
}

// +kubebuilder:rbac:groups=serving.kvroute.io,resources=kvroutedmodels,verbs=get;list;watch
// +kubebuilder:rbac:groups=serving.kvroute.io,resources=kvroutedmodels/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=serving.kvroute.io,resources=kvroutedmodels/scale,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services;configmaps;serviceaccounts,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=keda.sh,resources=scaledobjects,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=inference.networking.k8s.io,resources=inferencepools,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apiregistration.k8s.io,resources=apiservices,verbs=get;list
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete

// Reconcile runs one pass: render, apply the children, the autoscaler, the warm-up
// annotations, then one status write (deferred, so a failed step still reports).
func (r *KVRoutedModelReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	m := &v1alpha1.KVRoutedModel{}
	if err := r.Get(ctx, req.NamespacedName, m); err != nil {
		// Deleted: garbage collection follows the owner references; nothing to clean up.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	orig := m.DeepCopy()
	obs := status.Observed{Model: m, Suspended: m.Spec.Suspend, Now: r.Clock.Now()}
	obs.RouterPods = r.routerPods(ctx, m)
	defer func() {
		if err := r.writeStatus(ctx, orig, obs); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()

	if m.Status.ObservedGeneration != m.Generation {
		r.warnUntestedEngine(m)
		r.warnUnknownEngineArgs(m)
	}
	objs, err := render.All(m, r.Render)
	if err != nil {
		// A spec the schema let through but the renderers refuse: retrying will not help.
		obs.Problems = append(obs.Problems, status.Problem{Reason: v1alpha1.ReasonInvalidSpec, Message: err.Error()})
		return ctrl.Result{}, nil
	}
	if m.Spec.Suspend {
		return ctrl.Result{}, r.observeOnly(ctx, m, &obs)
	}

	// A model at zero whose routers hold requests is scaled to one before the children are
	// applied, so this pass renders the engine at one.
	woke, err := r.wakeFromZero(ctx, m, &obs)
	if err != nil {
		return ctrl.Result{}, err
	}
	if woke {
		if objs, err = render.All(m, r.Render); err != nil {
			obs.Problems = append(obs.Problems, status.Problem{Reason: v1alpha1.ReasonInvalidSpec, Message: err.Error()})
			return ctrl.Result{}, nil
		}
	}
	retry, err := r.applyChildren(ctx, m, objs, &obs)
	r.observeModelCache(ctx, m, &obs)
	if err != nil {
		return ctrl.Result{}, err
	}
	next, err := r.reconcileWarmup(ctx, m, &obs, true)
	if err != nil {
		obs.Problems = append(obs.Problems, status.Problem{Reason: v1alpha1.ReasonApplyFailed, Message: err.Error()})
		return ctrl.Result{}, err
	}
	if retry {
		next = earliest(next, r.retryInterval())
	}
	// IndexHealthy changes when a router's report goes stale, which no watch sees.
	next = earliest(next, status.NextReportExpiry(m, obs.Now))
	return ctrl.Result{RequeueAfter: next}, nil
}

// ReasonUntestedEngineImage is the reason of the Warning event for an engine image that is not
// a release of its engine kind kvroute is tested with (render.TestedVLLMReleases,
// TestedSGLangReleases, TestedTRTLLMReleases).
const ReasonUntestedEngineImage = "UntestedEngineImage"

// warnUntestedEngine records a Warning event when the model's engine image is not a tested
// release of its kind. It is called once per spec generation, so an unchanged model does not
// repeat it.
func (r *KVRoutedModelReconciler) warnUntestedEngine(m *v1alpha1.KVRoutedModel) {
	kind := render.EngineKind(m)
	image := m.Spec.Engine.Image
	if image == "" {
		image = render.DefaultImageFor(kind, r.Render.DefaultEngineImage)
	}
	if image == "" || r.Recorder == nil {
		return
	}
	if ok, _ := render.EngineImageTestedFor(kind, image); ok {
		return
	}
	r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, ReasonUntestedEngineImage, "Reconcile",
		"engine image %s is not a release of %s kvroute is tested with; its KV-event shape, replay framing, flags or metrics may differ",
		image, render.TestedReleases(kind))
}

// ReasonUnknownEngineArg is the reason of the Warning event for a spec.engine.args entry that
// is not an option of the pinned release's server of its engine kind (render.CheckEngineArgsFor).
const ReasonUnknownEngineArg = "UnknownEngineArg"

// warnUnknownEngineArgs records one Warning event per unknown or misspelt engine argument,
// naming the nearest known flag. Like warnUntestedEngine, once per spec generation. Only a
// warning: vLLM itself refuses an unknown flag at start, and a newer image may know it.
func (r *KVRoutedModelReconciler) warnUnknownEngineArgs(m *v1alpha1.KVRoutedModel) {
	if r.Recorder == nil {
		return
	}
	args := make([]string, len(m.Spec.Engine.Args))
	for i, a := range m.Spec.Engine.Args {
		args[i] = string(a)
	}
	for _, w := range render.CheckEngineArgsFor(render.EngineKind(m), args) {
		r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, ReasonUnknownEngineArg, "Reconcile", "%s", w.String())
	}
}

// ReasonModelCache is the reason of the Warning event for a model cache claim that is missing,
// lost, or of another access mode than the spec says (status.engine.modelCache.message).
const ReasonModelCache = "ModelCacheUnusable"

// observeModelCache reads the cache's claim live (an existing claim carries none of the labels
// the cache filters on) into the status, and records a Warning event when its message changes.
func (r *KVRoutedModelReconciler) observeModelCache(ctx context.Context, m *v1alpha1.KVRoutedModel, obs *status.Observed) {
	if m.Spec.Model.Cache == nil || r.APIReader == nil {
		return
	}
	pvc := &corev1.PersistentVolumeClaim{}
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: render.ModelCacheClaimName(m)}, pvc)
	switch {
	case apierrors.IsNotFound(err):
		pvc = nil
	case err != nil:
		log.FromContext(ctx).Error(err, "read the model cache claim; status.engine.modelCache keeps its last value")
		if m.Status.Engine != nil {
			obs.ModelCache = m.Status.Engine.ModelCache
		}
		return
	}
	obs.ModelCache = status.ModelCache(m, pvc)
	var prev string
	if e := m.Status.Engine; e != nil && e.ModelCache != nil {
		prev = e.ModelCache.Message
	}
	if msg := obs.ModelCache.Message; msg != "" && msg != prev && r.Recorder != nil {
		r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, ReasonModelCache, "Reconcile", "%s", msg)
	}
}

// routerPods names the model's router pods, read live (the cache holds engine pods only), when
// there are router reports to check against; nil when there are none or the list failed.
func (r *KVRoutedModelReconciler) routerPods(ctx context.Context, m *v1alpha1.KVRoutedModel) map[string]bool {
	if len(m.Status.RouterReports) == 0 || r.APIReader == nil {
		return nil
	}
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, client.InNamespace(m.Namespace), client.MatchingLabels(render.RouterSelector(m))); err != nil {
		log.FromContext(ctx).Error(err, "list router pods; router reports are not filtered by pod")
		return nil
	}
	out := make(map[string]bool, len(pods.Items))
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = true
		}
	}
	return out
}

// applyChildren applies every rendered child, deletes those no longer wanted and reads the
// two Deployments back for the status. Apply failures become Degraded/ApplyFailed and are
// returned so the pass is retried with backoff; a missing KEDA or metrics API is not an
// error, only a reason to look again later (retry).
func (r *KVRoutedModelReconciler) applyChildren(ctx context.Context, m *v1alpha1.KVRoutedModel, objs []client.Object, obs *status.Observed) (retry bool, err error) {
	prev := &appsv1.Deployment{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: render.EngineName(m)}, prev); err == nil {
		obs.Scaled = prev.Spec.Replicas == nil || *prev.Spec.Replicas != *m.Spec.Replicas
	}

	var errs []error
	var autoscaler client.Object
	poolMissing := false
	rendered := map[optionalChild]bool{}
	for _, o := range objs {
		switch o.GetObjectKind().GroupVersionKind().Kind {
		case "HorizontalPodAutoscaler", "ScaledObject":
			if o.GetName() != render.PrefillName(m) { // the prefill pool's HPA is a plain child
				autoscaler = o
				continue
			}
		}
		rendered[optionalChild{o.GetObjectKind().GroupVersionKind(), o.GetName()}] = true
		u, err := r.applyObject(ctx, o)
		if err != nil && o.GetObjectKind().GroupVersionKind() == render.InferencePoolGVK && apiMissing(err) {
			// As a missing KEDA: everything else is reconciled, and the pool is looked for
			// again every retry interval (no watch can wait for an API that does not exist).
			poolMissing = true
			obs.Problems = append(obs.Problems, status.Problem{Reason: v1alpha1.ReasonInferencePoolCRDMissing,
				Message: "spec.router.mode is EndpointPicker but the InferencePool API (inference.networking.k8s.io/v1) is not installed; install the Gateway API Inference Extension's CRDs (v1.0.0 or later) or set spec.router.mode to Proxy (everything else is reconciled)"})
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if u.GetKind() == "Deployment" {
			d := &appsv1.Deployment{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, d); err != nil {
				errs = append(errs, fmt.Errorf("read back Deployment %s: %w", u.GetName(), err))
				continue
			}
			switch d.Name {
			case render.EngineName(m):
				obs.Engine = d
			case render.PrefillName(m):
				obs.Prefill = d
			default:
				obs.Router = d
			}
		}
	}
	for _, c := range optionalChildren(m) {
		if rendered[c] {
			continue
		}
		if err := r.deleteIfOwned(ctx, m, c.gvk, c.name); err != nil {
			errs = append(errs, err)
		}
	}
	as := r.reconcileAutoscaler(ctx, m, autoscaler)
	obs.Autoscaler = as.current
	if as.err != nil {
		errs = append(errs, as.err)
	}
	for _, e := range errs {
		obs.Problems = append(obs.Problems, status.Problem{Reason: v1alpha1.ReasonApplyFailed, Message: e.Error()})
	}
	obs.Problems = append(obs.Problems, as.problems...)
	return as.retry || poolMissing, errors.Join(errs...)
}

// apiMissing is an apply's error for a kind the server does not serve. NoMatch: the kind is
// unknown. NotFound: it was known, but its CRD is gone since (an apply otherwise creates), an
// uninstall under a warm RESTMapper.
func apiMissing(err error) bool {
	return meta.IsNoMatchError(err) || apierrors.IsNotFound(err)
}

// observeOnly fills the status from the children as they are, for a suspended model.
func (r *KVRoutedModelReconciler) observeOnly(ctx context.Context, m *v1alpha1.KVRoutedModel, obs *status.Observed) error {
	deps := map[string]**appsv1.Deployment{render.EngineName(m): &obs.Engine, render.RouterName(m): &obs.Router}
	if render.Disaggregated(m) {
		deps[render.PrefillName(m)] = &obs.Prefill
	}
	for name, dst := range deps {
		d := &appsv1.Deployment{}
		err := r.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: name}, d)
		switch {
		case err == nil:
			*dst = d
		case !apierrors.IsNotFound(err):
			return err
		}
	}
	obs.Autoscaler = m.Status.Autoscaler
	_, err := r.reconcileWarmup(ctx, m, obs, false)
	return err
}

// reconcileWarmup plans the warm-up annotations of the engine pods and, when apply is set,
// applies them. It returns how long until the earliest window closes (0: none open).
func (r *KVRoutedModelReconciler) reconcileWarmup(ctx context.Context, m *v1alpha1.KVRoutedModel, obs *status.Observed, apply bool) (time.Duration, error) {
	pods := &corev1.PodList{}
	if err := r.List(ctx, pods, client.InNamespace(m.Namespace), client.MatchingLabels(render.EngineSelector(m))); err != nil {
		return 0, fmt.Errorf("list engine pods: %w", err)
	}
	now := obs.Now
	plan := warmup.Compute(pods.Items, status.FirstAvailable(m.Status.Conditions), m.Spec.Router.Warmup.Duration.Duration, now)
	obs.Warming = plan.Warming
	if !apply {
		return 0, nil
	}
	var errs []error
	for _, c := range plan.Changes {
		// Only metadata.annotations, under the warm-up's own field owner: an empty apply
		// drops the annotation this owner set and nothing else.
		ac := corev1ac.Pod(c.Pod, m.Namespace)
		if !c.Until.IsZero() {
			ac.WithAnnotations(map[string]string{v1alpha1.AnnotationWarmup: warmup.Format(c.Until)})
		}
		if err := r.Apply(ctx, ac, client.FieldOwner(WarmupFieldOwner), client.ForceOwnership); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("annotate pod %s: %w", c.Pod, err))
		}
	}
	if plan.NextExpiry.IsZero() {
		return 0, errors.Join(errs...)
	}
	// A second's slack: the annotation has second precision, and requeueing just before the
	// expiry would only find the window still open.
	return plan.NextExpiry.Sub(now) + time.Second, errors.Join(errs...)
}

// writeStatus computes the status and writes it if it changed: the pass's only status write.
// Condition transitions become events.
func (r *KVRoutedModelReconciler) writeStatus(ctx context.Context, orig *v1alpha1.KVRoutedModel, obs status.Observed) error {
	next := orig.DeepCopy()
	next.Status = status.Compute(obs)
	if equality.Semantic.DeepEqual(orig.Status, next.Status) {
		return nil
	}
	for _, t := range status.Transitions(orig.Status.Conditions, next.Status.Conditions) {
		typ := corev1.EventTypeNormal
		if t.Warning {
			typ = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(next, nil, typ, t.Reason, "Reconcile", "%s=%s: %s", t.Type, t.Status, t.Message)
	}
	if err := r.Status().Patch(ctx, next, client.MergeFrom(orig)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		log.FromContext(ctx).Error(err, "status write failed")
		return fmt.Errorf("write status: %w", err)
	}
	return nil
}

func (r *KVRoutedModelReconciler) retryInterval() time.Duration {
	if r.RetryInterval > 0 {
		return r.RetryInterval
	}
	return DefaultRetryInterval
}

// earliest is the sooner of two requeue delays, 0 meaning none.
func earliest(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// optionalChild is a child the spec may switch off.
type optionalChild struct {
	gvk  schema.GroupVersionKind
	name string
}

// optionalChildren are the children that exist for some specs only (besides the autoscaler,
// handled on its own): deleted when the spec stops wanting them — the network policies when
// spec.networkPolicy.enabled turns false, the events Service and the router's policy when
// spec.engine.kvEvents.mode goes back to RouterConnects, the router peers' headless Service and
// disruption budget when spec.router.replicas goes back to 1, the model cache's claim when
// spec.model.cache no longer asks the operator for one, the InferencePool when spec.router.mode
// goes back to Proxy.
func optionalChildren(m *v1alpha1.KVRoutedModel) []optionalChild {
	np := networkingv1.SchemeGroupVersion.WithKind("NetworkPolicy")
	return []optionalChild{
		{np, render.EngineName(m)},
		{np, render.RouterName(m)},
		{corev1.SchemeGroupVersion.WithKind("Service"), render.EventsServiceName(m)},
		{corev1.SchemeGroupVersion.WithKind("Service"), render.RouterPeersName(m)},
		{policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget"), render.RouterName(m)},
		// Only a claim the model controls (onDelete: Delete) is deleted when spec.model.cache
		// stops asking for it; a retained one is left, as it is when the model goes.
		{corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"), render.ManagedModelCacheName(m)},
		// The prefill pool and its policy, budget and HPA, when spec.disaggregation goes (or
		// its autoscaling does).
		{appsv1.SchemeGroupVersion.WithKind("Deployment"), render.PrefillName(m)},
		// The InferencePool, when spec.router.mode goes back to Proxy.
		{render.InferencePoolGVK, render.InferencePoolName(m)},
		{np, render.PrefillName(m)},
		{policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget"), render.PrefillName(m)},
		{autoscalingv2.SchemeGroupVersion.WithKind("HorizontalPodAutoscaler"), render.PrefillName(m)},
	}
}
