package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/router/degraded"
	"github.com/kvroute/kvroute/router/report"
)

// degradedFaults gives each degraded reason counters that make the router's own tracker
// (router/degraded) raise it, after a healthy minute, the way TestEveryReasonFiresOnEvidence
// does there. A reason added to degraded.Reasons without a row here fails
// TestEveryDegradedReasonReachesTheModel.
var degradedFaults = map[degraded.Reason]func(*degraded.Sample){
	degraded.Undecodable: func(s *degraded.Sample) { s.Received += 2; s.DecodeErrors += 2 },
	degraded.Unchained: func(s *degraded.Sample) {
		healthyFlow(s)
		s.BlocksStored -= 2
		s.UnknownParent += 8
	},
	degraded.NoEvents: func(s *degraded.Sample) { s.Routed += 2; s.QuietRequests += 2 },
	degraded.Stalled:  func(s *degraded.Sample) { s.Received += 3 },
	degraded.Inexact:  func(s *degraded.Sample) { s.State = "inexact"; s.Received++; s.Applied++ },
	// The longest detail a router writes: an engine's error text past the CRD's 256 characters,
	// which the reporter must cut for the API server to accept the report.
	degraded.TokenizerFailing: func(s *degraded.Sample) {
		healthyFlow(s)
		s.TokenizerFailures++
		s.TokenizerError = "POST http://m-engine-x:8000/v1/completions/render: 503 Service Unavailable: " + strings.Repeat("upstream connect error or disconnect/reset before headers; ", 5)
	},
	// Both findings at once, naming the peer replica: the longest hash-mismatch detail.
	degraded.HashMismatch: func(s *degraded.Sample) {
		healthyFlow(s)
		s.ParityMismatch++
		s.PeerMismatches++
		s.PeerMismatch = "m-engine-y/0"
	},
	degraded.KeysWrong:           func(s *degraded.Sample) { healthyFlow(s); s.RekeyErrors += 10 },
	degraded.MultimodalUnkeyed:   func(s *degraded.Sample) { healthyFlow(s); s.MultimodalRouted++ },
	degraded.HybridGroupsSkipped: func(s *degraded.Sample) { healthyFlow(s); s.SkippedGroups++ },
	degraded.Partial:             func(s *degraded.Sample) { healthyFlow(s); s.State = "approximate"; s.Partial = true },
}

// healthyFlow is one healthy sample interval: batches applied, blocks indexed, requests routed
// and the cached tokens the exact index predicted served.
func healthyFlow(s *degraded.Sample) {
	s.Received++
	s.Applied++
	s.BlocksStored += 4
	s.Routed++
	s.QuietRequests = 0
	s.ExactPredicted += 2048
	s.ExactActual += 2048
}

// raise runs the router's tracker over a healthy minute and then the fault, on its own clock
// from start, until the reason is in force, and returns what the router's Degraded() then
// holds for the replica: the reason alone, with the detail the tracker wrote.
func raise(t *testing.T, replica string, reason degraded.Reason, fault func(*degraded.Sample), start time.Time) []degraded.Status {
	t.Helper()
	const interval = 5 * time.Second
	tr := degraded.NewTracker(interval)
	s := degraded.Sample{Events: true, State: "exact"}
	now := start
	step := func(f func(*degraded.Sample)) {
		now = now.Add(interval)
		f(&s)
		tr.Update(now, map[string]degraded.Sample{replica: s})
	}
	for range int(degraded.Window/interval) + 2 {
		step(healthyFlow)
	}
	if got := tr.Get(replica).Degraded; len(got) != 0 {
		t.Fatalf("healthy minute: %+v", got)
	}
	faultStart := now
	for len(tr.Get(replica).Degraded) == 0 {
		if now.Sub(faultStart) > degraded.Window {
			t.Fatalf("the tracker did not raise %s a minute into the fault", reason)
		}
		step(fault)
	}
	got := tr.Get(replica).Degraded
	if len(got) != 1 || got[0].Reason != reason {
		t.Fatalf("the fault raised %+v, want %s alone", got, reason)
	}
	return got
}

// asReport flattens one replica's statuses the way the kvrouter binary does for its reporter
// (cmd/kvrouter degradedReport: replica, reason, since and detail carried as they are).
func asReport(replica string, sts []degraded.Status) []report.Degraded {
	var out []report.Degraded
	for _, s := range sts {
		out = append(out, report.Degraded{Replica: replica, Reason: string(s.Reason), Since: s.Since, Detail: s.Detail})
	}
	return out
}

// Every reason the router knows (the list itself, so a new reason needs a row) reaches the
// KVRoutedModel through the API server: raised by the router's tracker, written by the
// router's reporter under the router ServiceAccount with nothing but the Role the operator
// renders, and aggregated by the operator. Read back, the model carries the reason and its
// detail in the router's entry of status.routerReports, and in its conditions:
//   - a key-correctness reason (degraded.Reason.KeyCorrectness): IndexHealthy=False and
//     Degraded=True, both IndexUnhealthy, each naming the replica, reason and detail;
//   - an informational one (Informational): IndexHealthy stays True (IndexHealthy), its message
//     listing it among the known limits, and Degraded stays False;
//   - any other: IndexHealthy=False (IndexUnhealthy) naming it, Degraded stays False.
//
// Ready is never touched (routing goes on by load). A report without the reason clears all of
// it.
func TestEveryDegradedReasonReachesTheModel(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "reasons")
	m := newModel(t, ns, "m", nil)
	eventually(t, 20*time.Second, func() error { // the operator's Role for the router
		return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: render.RouterName(m)}, &rbacv1.Role{})
	})
	const pod, replica = "m-router-a", "m-engine-x/0"
	routerPod(t, m, pod)
	var cur []report.Degraded
	rep, err := report.New(asRouter(m), report.Options{Namespace: ns, Model: m.Name, Pod: pod, Now: testClock.Now,
		Source: func() []report.Degraded { return cur }})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error { return rep.Sync(ctx) }) // RBAC caches settle
	healthy := waitCondition(t, m, v1alpha1.ConditionIndexHealthy, "True/"+v1alpha1.ReasonIndexHealthy)
	ready := condition(healthy, v1alpha1.ConditionReady)
	healthyMsg := conditionMessage(healthy, v1alpha1.ConditionIndexHealthy)

	for _, reason := range degraded.Reasons {
		t.Run(string(reason), func(t *testing.T) {
			fault, ok := degradedFaults[reason]
			if !ok {
				t.Fatalf("degraded.Reasons has %s but degradedFaults no row for it", reason)
			}
			sts := raise(t, replica, reason, fault, testClock.Now().Truncate(time.Second))
			cur = asReport(replica, sts)
			if err := rep.Sync(ctx); err != nil {
				t.Fatalf("report of %s not written: %v", reason, err)
			}

			// What the router's entry must carry: the detail as written, or cut to the CRD's
			// 256 characters with "..." when longer.
			full := sts[0].Detail
			wantDetail := full
			if len(full) > 256 {
				wantDetail = full[:253] + "..."
			}
			line := fmt.Sprintf("%s %s (1 of 1 routers): %s", replica, reason, wantDetail)
			wantIndex, wantDegraded := "False/"+v1alpha1.ReasonIndexUnhealthy, "False/"+v1alpha1.ReasonAsExpected
			switch {
			case reason.Informational():
				wantIndex = "True/" + v1alpha1.ReasonIndexHealthy
			case reason.KeyCorrectness():
				wantDegraded = "True/" + v1alpha1.ReasonIndexUnhealthy
			}
			eventually(t, 20*time.Second, func() error {
				got := getModel(t, m)
				if got.Status.ObservedGeneration != got.Generation {
					return fmt.Errorf("observedGeneration %d, generation %d", got.Status.ObservedGeneration, got.Generation)
				}
				ds, err := routerDegraded(got, pod)
				if err != nil {
					return err
				}
				if len(ds) != 1 {
					return fmt.Errorf("router entry degraded %+v, want %s on %s alone", ds, reason, replica)
				}
				d := ds[0]
				if d.Replica != replica || d.Reason != string(reason) || !d.Since.Time.Equal(sts[0].Since) || d.Detail != wantDetail {
					return fmt.Errorf("router entry %+v, want replica %s reason %s since %s detail %q", d, replica, reason, sts[0].Since, wantDetail)
				}
				if c := condition(got, v1alpha1.ConditionIndexHealthy); c != wantIndex {
					return fmt.Errorf("IndexHealthy %s, want %s (%s)", c, wantIndex, describe(got.Status.Conditions))
				}
				msg := conditionMessage(got, v1alpha1.ConditionIndexHealthy)
				if reason.Informational() {
					if want := "known limits: " + line; !strings.Contains(msg, want) {
						return fmt.Errorf("IndexHealthy message %q does not name %q", msg, want)
					}
				} else if msg != line {
					return fmt.Errorf("IndexHealthy message %q, want %q", msg, line)
				}
				if c := condition(got, v1alpha1.ConditionDegraded); c != wantDegraded {
					return fmt.Errorf("Degraded %s, want %s (%s)", c, wantDegraded, describe(got.Status.Conditions))
				}
				if dm := conditionMessage(got, v1alpha1.ConditionDegraded); reason.KeyCorrectness() != strings.Contains(dm, line) {
					return fmt.Errorf("Degraded message %q naming %q: %v, want %v", dm, line, !reason.KeyCorrectness(), reason.KeyCorrectness())
				}
				if c := condition(got, v1alpha1.ConditionReady); c != ready {
					return fmt.Errorf("Ready %s, was %s before the report: the index must not touch it", c, ready)
				}
				return nil
			})

			// A report without it clears it.
			cur = nil
			if err := rep.Sync(ctx); err != nil {
				t.Fatalf("clearing report not written: %v", err)
			}
			eventually(t, 20*time.Second, func() error {
				got := getModel(t, m)
				ds, err := routerDegraded(got, pod)
				if err != nil {
					return err
				}
				if len(ds) != 0 {
					return fmt.Errorf("router entry still degraded: %+v", ds)
				}
				if c := condition(got, v1alpha1.ConditionIndexHealthy); c != "True/"+v1alpha1.ReasonIndexHealthy {
					return fmt.Errorf("IndexHealthy %s after the clear (%s)", c, describe(got.Status.Conditions))
				}
				if msg := conditionMessage(got, v1alpha1.ConditionIndexHealthy); msg != healthyMsg {
					return fmt.Errorf("IndexHealthy message %q after the clear, want %q", msg, healthyMsg)
				}
				if c := condition(got, v1alpha1.ConditionDegraded); c != "False/"+v1alpha1.ReasonAsExpected {
					return fmt.Errorf("Degraded %s after the clear (%s)", c, describe(got.Status.Conditions))
				}
				if c := condition(got, v1alpha1.ConditionReady); c != ready {
					return fmt.Errorf("Ready %s after the clear, was %s", c, ready)
				}
				return nil
			})
		})
	}
}

// routerDegraded is the degraded list of the pod's entry in status.routerReports.
func routerDegraded(m *v1alpha1.KVRoutedModel, pod string) ([]v1alpha1.DegradedReplica, error) {
	for _, r := range m.Status.RouterReports {
		if r.Pod == pod {
			return r.Degraded, nil
		}
	}
	return nil, fmt.Errorf("no report of %s among %+v", pod, m.Status.RouterReports)
}

// conditionMessage is the message of a condition ("" when absent).
func conditionMessage(m *v1alpha1.KVRoutedModel, typ string) string {
	for _, c := range m.Status.Conditions {
		if c.Type == typ {
			return c.Message
		}
	}
	return ""
}
