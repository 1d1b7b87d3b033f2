// Package status turns what the reconciler observed (the children it read back, the problems
// its steps hit, the warm-up plan) into a KVRoutedModel's status. It is pure: no API calls and
// no clock of its own, so each condition rule is tested directly.
//
// The conditions follow kstatus and the Kubernetes API conventions:
//   - Degraded: something needs a person (a step failed, KEDA or the metrics API is missing,
//     a rollout ran past its progress deadline).
//   - Available: at least one engine replica is Ready and the router is serving.
//   - Progressing: a rollout, a scale or a warm-up is under way.
//   - Ready: the summary `kubectl wait --for=condition=Ready` reads: Available, not Degraded,
//     and no rollout or scale in flight (warming replicas already serve, so they do not count).
package status

import (
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
)

// Problem is one reason the model is Degraded, with a message a person can act on.
type Problem struct {
	Reason  string
	Message string
}

// Observed is everything one reconcile pass saw.
type Observed struct {
	// Model is the resource as read at the start of the pass; its status holds the previous
	// conditions, whose transition times are kept when nothing changed.
	Model *v1alpha1.KVRoutedModel
	// Engine and Router are the Deployments read back after applying; nil when absent.
	Engine, Router *appsv1.Deployment
	// Prefill is the prefill pool's Deployment (spec.disaggregation); nil when absent.
	Prefill *appsv1.Deployment
	// Autoscaler names the HPA or ScaledObject in place; nil when none.
	Autoscaler *v1alpha1.AutoscalerStatus
	// Warming is the warm-up plan's count.
	Warming int32
	// Scaled is true when this pass changed the engine Deployment's replicas.
	Scaled bool
	// Problems make the model Degraded, first one first.
	Problems []Problem
	// Suspended: spec.suspend is set, nothing was changed.
	Suspended bool
	// Now stamps transitions and lastScaleTime.
	Now time.Time
	// RouterPods are the router pods that exist (nil: not known); reports of other pods are
	// ignored and, once stale, dropped.
	RouterPods map[string]bool
	// ModelCache is the weight cache's claim (ModelCache()); nil without spec.model.cache.
	ModelCache *v1alpha1.ModelCacheStatus
}

// Compute returns the new status. The previous conditions are copied, then each of the four
// types is set, so a condition's lastTransitionTime moves only when its status flips.
func Compute(o Observed) v1alpha1.KVRoutedModelStatus {
	m := o.Model
	st := v1alpha1.KVRoutedModelStatus{
		ObservedGeneration: m.Generation,
		Conditions:         append([]metav1.Condition(nil), m.Status.Conditions...),
		Selector:           render.EngineSelectorString(m),
		WarmingReplicas:    o.Warming,
		Autoscaler:         o.Autoscaler,
		LastScaleTime:      m.Status.LastScaleTime,
	}
	if o.Scaled {
		t := metav1.NewTime(o.Now)
		st.LastScaleTime = &t
	}
	if e := o.Engine; e != nil {
		st.Replicas, st.ReadyReplicas, st.UpdatedReplicas = e.Status.Replicas, e.Status.ReadyReplicas, e.Status.UpdatedReplicas
		p := render.EnginePorts(m)
		st.Engine = &v1alpha1.EngineStatus{DeploymentName: e.Name, KVEventPorts: p.Events, ReplayPorts: p.Replay, ModelCache: o.ModelCache}
	}
	if p := o.Prefill; p != nil && render.Disaggregated(m) {
		dl := m.Spec.Engine.Parallelism.DataLocal
		if pp := m.Spec.Disaggregation.Prefill.Parallelism; pp != nil && pp.DataLocal > 0 {
			dl = pp.DataLocal
		}
		st.Prefill = &v1alpha1.PoolStatus{DeploymentName: p.Name, Replicas: p.Status.Replicas, ReadyReplicas: p.Status.ReadyReplicas,
			UpdatedReplicas: p.Status.UpdatedReplicas, Selector: render.PrefillSelectorString(m), SideChannelPorts: render.SideChannelPorts(m, dl)}
	}
	if o.Router != nil {
		st.Router = &v1alpha1.RouterStatus{DeploymentName: o.Router.Name, ServiceName: render.RouterName(m), Endpoint: render.RouterEndpoint(m),
			Replicas: o.Router.Status.Replicas, ReadyReplicas: o.Router.Status.ReadyReplicas}
		if render.EndpointPicker(m) {
			st.Router.InferencePool = render.InferencePoolName(m)
		}
		if render.RouterReplicas(m) > 1 {
			connected, msg := peersConnected(o)
			st.Router.PeersConnected, st.Router.PeersMessage = &connected, msg
		}
		d := RouterDemand(o)
		st.Router.HeldRequests, st.Router.BacklogSeconds = d.Held, d.BacklogSeconds
	}

	st.RouterReports = keptReports(o)
	// IndexHealthy and its Degraded problem do not affect Ready: routing works by load.
	index, indexProblem := indexCondition(o)
	degraded := degradedCondition(o)
	available := availableCondition(o)
	progressing := progressingCondition(o)
	ready := readyCondition(o, degraded, available, progressing)
	if indexProblem != nil {
		withIndex := o
		withIndex.Problems = append(append([]Problem(nil), o.Problems...), *indexProblem)
		degraded = degradedCondition(withIndex)
	}
	for _, c := range []metav1.Condition{ready, available, progressing, degraded, index} {
		c.ObservedGeneration = m.Generation
		c.LastTransitionTime = metav1.NewTime(o.Now)
		meta.SetStatusCondition(&st.Conditions, c)
	}
	return st
}

func cond(t string, ok bool, reason, msg string) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg}
}

func degradedCondition(o Observed) metav1.Condition {
	problems := append([]Problem(nil), o.Problems...)
	for _, d := range []struct {
		what string
		dep  *appsv1.Deployment
	}{{"engine", o.Engine}, {"router", o.Router}} {
		if c := deploymentCondition(d.dep, appsv1.DeploymentProgressing); c != nil &&
			c.Status == corev1.ConditionFalse && c.Reason == "ProgressDeadlineExceeded" {
			problems = append(problems, Problem{v1alpha1.ReasonProgressDeadline,
				fmt.Sprintf("the %s Deployment %s made no progress within its deadline: %s", d.what, d.dep.Name, c.Message)})
		}
	}
	if len(problems) == 0 {
		return cond(v1alpha1.ConditionDegraded, false, v1alpha1.ReasonAsExpected, "no problems seen")
	}
	msgs := make([]string, len(problems))
	for i, p := range problems {
		msgs[i] = p.Message
	}
	return cond(v1alpha1.ConditionDegraded, true, problems[0].Reason, strings.Join(msgs, "; "))
}

func availableCondition(o Observed) metav1.Condition {
	e, r := o.Engine, o.Router
	switch {
	case e == nil || e.Status.ReadyReplicas < 1:
		msg := "no engine replica is Ready"
		if e == nil {
			msg = "the engine Deployment does not exist yet"
		} else if e.Spec.Replicas != nil && *e.Spec.Replicas == 0 {
			msg = "the engine is scaled to zero"
		}
		// Requests wait in the routers' hold for a replica: said apart, so the event says a
		// model at zero has demand (the operator wakes it: Wakes).
		if d := RouterDemand(o); d.Held > 0 {
			return cond(v1alpha1.ConditionAvailable, false, v1alpha1.ReasonRequestsHeld,
				fmt.Sprintf("%s; %d request(s) held by %d router(s) until one is Ready", msg, d.Held, d.Routers))
		}
		return cond(v1alpha1.ConditionAvailable, false, v1alpha1.ReasonNoReplicasReady, msg)
	case r == nil || r.Status.ReadyReplicas < 1:
		msg := "no router replica is Ready"
		if r == nil {
			msg = "the router Deployment does not exist yet"
		}
		return cond(v1alpha1.ConditionAvailable, false, v1alpha1.ReasonRouterNotReady, msg)
	}
	return cond(v1alpha1.ConditionAvailable, true, v1alpha1.ReasonMinimumReplicasReady,
		fmt.Sprintf("%d engine replica(s) and %d router replica(s) Ready", e.Status.ReadyReplicas, r.Status.ReadyReplicas))
}

// rollout says why a Deployment has not finished rolling out, the way `kubectl rollout
// status` does; reason is empty when it has.
func rollout(what string, d *appsv1.Deployment) (reason, msg string) {
	if d == nil {
		return v1alpha1.ReasonRollingOut, fmt.Sprintf("the %s Deployment is being created", what)
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	switch {
	case d.Generation > s.ObservedGeneration:
		return v1alpha1.ReasonRollingOut, fmt.Sprintf("waiting for the %s Deployment's new spec to be observed", what)
	case s.UpdatedReplicas < want:
		return v1alpha1.ReasonRollingOut, fmt.Sprintf("%d of %d %s replicas updated", s.UpdatedReplicas, want, what)
	case s.Replicas > s.UpdatedReplicas:
		return v1alpha1.ReasonRollingOut, fmt.Sprintf("%d old %s replica(s) pending termination", s.Replicas-s.UpdatedReplicas, what)
	case s.ReadyReplicas != want || s.Replicas != want:
		return v1alpha1.ReasonScaling, fmt.Sprintf("%d of %d %s replicas Ready", s.ReadyReplicas, want, what)
	}
	return "", ""
}

func progressingCondition(o Observed) metav1.Condition {
	if o.Suspended {
		return cond(v1alpha1.ConditionProgressing, false, v1alpha1.ReasonSuspended, "spec.suspend is set: children are not changed")
	}
	deps := []struct {
		what string
		dep  *appsv1.Deployment
	}{{"engine", o.Engine}, {"router", o.Router}}
	if render.Disaggregated(o.Model) {
		deps = append(deps, struct {
			what string
			dep  *appsv1.Deployment
		}{"prefill", o.Prefill})
	}
	for _, d := range deps {
		if reason, msg := rollout(d.what, d.dep); reason != "" {
			return cond(v1alpha1.ConditionProgressing, true, reason, msg)
		}
	}
	if o.Warming > 0 {
		return cond(v1alpha1.ConditionProgressing, true, v1alpha1.ReasonWarmingUp,
			fmt.Sprintf("%d engine replica(s) inside their warm-up window", o.Warming))
	}
	return cond(v1alpha1.ConditionProgressing, false, v1alpha1.ReasonReconciled, "all replicas updated and Ready")
}

func readyCondition(o Observed, degraded, available, progressing metav1.Condition) metav1.Condition {
	switch {
	case degraded.Status == metav1.ConditionTrue:
		return cond(v1alpha1.ConditionReady, false, degraded.Reason, degraded.Message)
	case available.Status != metav1.ConditionTrue:
		return cond(v1alpha1.ConditionReady, false, available.Reason, available.Message)
	case progressing.Status == metav1.ConditionTrue && progressing.Reason != v1alpha1.ReasonWarmingUp:
		return cond(v1alpha1.ConditionReady, false, progressing.Reason, progressing.Message)
	case o.Suspended:
		return cond(v1alpha1.ConditionReady, true, v1alpha1.ReasonSuspended, "serving; spec.suspend is set, so spec changes are not applied")
	}
	return cond(v1alpha1.ConditionReady, true, v1alpha1.ReasonReconciled, available.Message)
}

func deploymentCondition(d *appsv1.Deployment, t appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	if d == nil {
		return nil
	}
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == t {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

// Transition is a condition whose status or reason changed in a pass: what an event reports.
type Transition struct {
	Type, Reason, Message string
	Status                metav1.ConditionStatus
	// Warning is true for transitions a person should look at (Degraded on, Ready or
	// Available off).
	Warning bool
}

// Transitions lists the conditions of next whose status or reason differs from prev, in
// next's order, and an unhealthy IndexHealthy whose replicas or reasons changed (a second
// replica going wrong is news even though the condition was already False). A pass that
// changes nothing yields none, so events fire on transitions only.
func Transitions(prev, next []metav1.Condition) []Transition {
	var out []Transition
	for _, c := range next {
		old := meta.FindStatusCondition(prev, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason && !indexFindingsChanged(*old, c) {
			continue
		}
		warn := (c.Type == v1alpha1.ConditionDegraded && c.Status == metav1.ConditionTrue) ||
			(c.Type == v1alpha1.ConditionIndexHealthy && c.Status == metav1.ConditionFalse) ||
			((c.Type == v1alpha1.ConditionReady || c.Type == v1alpha1.ConditionAvailable) && c.Status == metav1.ConditionFalse && old != nil)
		out = append(out, Transition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message, Warning: warn})
	}
	return out
}

// FirstAvailable is when the model became Available, from its Available condition; zero when
// it is not Available. The warm-up rule measures "Ready later than the fleet" from here.
func FirstAvailable(conds []metav1.Condition) time.Time {
	c := meta.FindStatusCondition(conds, v1alpha1.ConditionAvailable)
	if c == nil || c.Status != metav1.ConditionTrue {
		return time.Time{}
	}
	return c.LastTransitionTime.Time
}
