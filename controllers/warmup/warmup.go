// Package warmup decides which engine pods carry the serving.kvroute.io/warmup-until
// annotation. It is pure: pods, the time the model first became Available, the warm-up
// duration and "now" in; the annotation each pod should carry out. The reconciler applies the
// result and requeues at Plan.NextExpiry.
//
// The rule is stateless, so re-running it on every pass converges:
//   - a pod that is Ready, not terminating, became Ready strictly after the model was first
//     Available, and whose Ready time + duration is still in the future, wants
//     warmup-until = Ready time + duration (RFC 3339);
//   - every other pod wants no annotation (never warmed, expired, not Ready, or Ready before
//     the model was Available: the first replicas are the fleet, there is nothing to favour).
package warmup

import (
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// Change is the annotation one pod should carry; Until is zero when it should carry none.
type Change struct {
	Pod   string
	Until time.Time
}

// Plan is the outcome for one model's engine pods.
type Plan struct {
	// Changes lists the pods whose current annotation differs from the wanted one, by name.
	Changes []Change
	// Warming counts pods that want an annotation (status.warmingReplicas).
	Warming int32
	// NextExpiry is the earliest wanted warmup-until, zero when no pod is warming: the
	// reconciler requeues then to remove it.
	NextExpiry time.Time
}

// Format is how the annotation writes a time: RFC 3339 in UTC, second precision (the
// precision of a condition's lastTransitionTime).
func Format(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// ReadySince is the pod's Ready condition's lastTransitionTime, and false when the pod is
// not Ready (or is terminating, when its readiness no longer means it will serve).
func ReadySince(p *corev1.Pod) (time.Time, bool) {
	if p.DeletionTimestamp != nil {
		return time.Time{}, false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			if c.Status != corev1.ConditionTrue || c.LastTransitionTime.IsZero() {
				return time.Time{}, false
			}
			return c.LastTransitionTime.Time, true
		}
	}
	return time.Time{}, false
}

// Wanted is the warmup-until a pod should carry, or zero for none. firstAvailable zero means
// the model has never been Available, so no pod is warming yet.
func Wanted(p *corev1.Pod, firstAvailable time.Time, d time.Duration, now time.Time) time.Time {
	if firstAvailable.IsZero() || d <= 0 {
		return time.Time{}
	}
	ready, ok := ReadySince(p)
	if !ok || !ready.After(firstAvailable) {
		return time.Time{}
	}
	until := ready.Add(d).Truncate(time.Second)
	if !until.After(now) {
		return time.Time{}
	}
	return until
}

// Compute plans the annotations for pods. A current annotation that does not parse counts as
// different from any wanted value, so it is rewritten or removed.
func Compute(pods []corev1.Pod, firstAvailable time.Time, d time.Duration, now time.Time) Plan {
	var plan Plan
	for i := range pods {
		p := &pods[i]
		want := Wanted(p, firstAvailable, d, now)
		if !want.IsZero() {
			plan.Warming++
			if plan.NextExpiry.IsZero() || want.Before(plan.NextExpiry) {
				plan.NextExpiry = want
			}
		}
		cur, has := p.Annotations[v1alpha1.AnnotationWarmup]
		switch {
		case want.IsZero() && !has:
		case !want.IsZero() && has && cur == Format(want):
		default:
			plan.Changes = append(plan.Changes, Change{Pod: p.Name, Until: want})
		}
	}
	sort.Slice(plan.Changes, func(i, j int) bool { return plan.Changes[i].Pod < plan.Changes[j].Pod })
	return plan
}
