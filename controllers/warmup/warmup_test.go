package warmup

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func pod(name string, ready *time.Time, annotation string) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if annotation != "" {
		p.Annotations = map[string]string{v1alpha1.AnnotationWarmup: annotation}
	}
	if ready != nil {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(*ready)}}
	} else {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(t0)}}
	}
	return p
}

func at(d time.Duration) *time.Time { t := t0.Add(d); return &t }

func TestComputeLifecycle(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0.Add(10 * time.Second))
	firstAvailable := t0.Add(5 * time.Second)
	const d = 2 * time.Minute
	pods := []corev1.Pod{
		pod("original", at(0), ""),               // Ready before the model was Available: the fleet
		pod("scaled-up", at(30*time.Second), ""), // Ready later: warms
		pod("loading", nil, ""),                  // not Ready yet
	}
	clk.SetTime(t0.Add(40 * time.Second))
	plan := Compute(pods, firstAvailable, d, clk.Now())
	wantUntil := t0.Add(30*time.Second + d)
	if plan.Warming != 1 || !plan.NextExpiry.Equal(wantUntil) {
		t.Fatalf("warming %d next %v, want 1 and %v", plan.Warming, plan.NextExpiry, wantUntil)
	}
	if len(plan.Changes) != 1 || plan.Changes[0].Pod != "scaled-up" || !plan.Changes[0].Until.Equal(wantUntil) {
		t.Fatalf("changes %+v", plan.Changes)
	}

	// Applied: the same pass again changes nothing.
	pods[1].Annotations = map[string]string{v1alpha1.AnnotationWarmup: Format(wantUntil)}
	if again := Compute(pods, firstAvailable, d, clk.Now()); len(again.Changes) != 0 || again.Warming != 1 {
		t.Fatalf("second pass not idempotent: %+v", again)
	}

	// After expiry the annotation goes, and is not added back.
	clk.SetTime(wantUntil)
	expired := Compute(pods, firstAvailable, d, clk.Now())
	if expired.Warming != 0 || !expired.NextExpiry.IsZero() {
		t.Fatalf("after expiry: %+v", expired)
	}
	if len(expired.Changes) != 1 || expired.Changes[0].Pod != "scaled-up" || !expired.Changes[0].Until.IsZero() {
		t.Fatalf("expired annotation not removed: %+v", expired.Changes)
	}
	pods[1].Annotations = nil
	if c := Compute(pods, firstAvailable, d, clk.Now()).Changes; len(c) != 0 {
		t.Fatalf("expired pod re-annotated: %+v", c)
	}
}

func TestComputeNeverAvailable(t *testing.T) {
	pods := []corev1.Pod{pod("a", at(time.Second), "")}
	if p := Compute(pods, time.Time{}, time.Minute, t0.Add(2*time.Second)); p.Warming != 0 || len(p.Changes) != 0 {
		t.Fatalf("model never Available, yet %+v", p)
	}
}

func TestComputeZeroDuration(t *testing.T) {
	pods := []corev1.Pod{pod("a", at(time.Minute), "")}
	if p := Compute(pods, t0, 0, t0.Add(time.Minute)); p.Warming != 0 || len(p.Changes) != 0 {
		t.Fatalf("zero duration, yet %+v", p)
	}
}

func TestComputeRewritesBadAndStale(t *testing.T) {
	const d = time.Minute
	pods := []corev1.Pod{
		pod("garbage", at(10*time.Second), "not-a-time"),
		pod("restarted", at(20*time.Second), Format(t0.Add(-time.Hour))), // old window, Ready again since
		pod("unready", nil, Format(t0.Add(time.Hour))),                   // lost readiness: no credit
	}
	p := Compute(pods, t0, d, t0.Add(30*time.Second))
	if p.Warming != 2 || len(p.Changes) != 3 {
		t.Fatalf("plan %+v", p)
	}
	want := map[string]time.Time{"garbage": t0.Add(10*time.Second + d), "restarted": t0.Add(20*time.Second + d), "unready": {}}
	for _, c := range p.Changes {
		if !c.Until.Equal(want[c.Pod]) {
			t.Errorf("%s: until %v, want %v", c.Pod, c.Until, want[c.Pod])
		}
	}
	if !p.NextExpiry.Equal(t0.Add(10*time.Second + d)) {
		t.Errorf("next expiry %v", p.NextExpiry)
	}
}

func TestTerminatingPodIsNotWarming(t *testing.T) {
	p := pod("going", at(10*time.Second), "")
	now := metav1.NewTime(t0)
	p.DeletionTimestamp = &now
	if w := Wanted(&p, t0, time.Minute, t0.Add(20*time.Second)); !w.IsZero() {
		t.Fatalf("terminating pod wants %v", w)
	}
}

func TestReadyExactlyAtFirstAvailableGetsNone(t *testing.T) {
	p := pod("edge", at(0), "")
	if w := Wanted(&p, t0, time.Minute, t0.Add(time.Second)); !w.IsZero() {
		t.Fatalf("pod Ready when the model became Available wants %v", w)
	}
}

func TestFormatIsRFC3339UTC(t *testing.T) {
	got := Format(time.Date(2026, 3, 1, 13, 0, 0, 0, time.FixedZone("x", 3600)))
	if got != "2026-03-01T12:00:00Z" {
		t.Fatalf("Format = %q", got)
	}
}
