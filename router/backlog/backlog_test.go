package backlog

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/router/score"
)

const sec = int64(1e9)

func TestComputeSecondsAreDrainCreditedPendingOverRate(t *testing.T) {
	cal := score.Calibration{DrainTokensPerS: 10000}
	now := 100 * sec
	f := Compute([]Replica{
		// 30,000 pending since 1 s ago: 10,000 drained, 20,000 ahead, 2 s.
		{Name: "a/0", Ready: true, PrefillTokens: 30000, PrefillSince: now - sec, WindowTokens: 600000},
		// Nothing pending.
		{Name: "b/0", Ready: true, WindowTokens: 0},
		// Pending on a replica that is not ready: still work queued, not capacity.
		{Name: "c/0", Ready: false, PrefillTokens: 5000, PrefillSince: now},
	}, cal, 60, now)
	if !f.Measured || f.Ready != 2 {
		t.Fatalf("measured %v ready %d, want true 2", f.Measured, f.Ready)
	}
	want := []float64{2, 0, 0.5}
	for i, w := range want {
		if got := f.Replicas[i].Seconds; math.Abs(got-w) > 1e-9 {
			t.Errorf("%s: %v s, want %v", f.Replicas[i].Name, got, w)
		}
	}
	if math.Abs(f.Seconds-2.5) > 1e-9 || math.Abs(f.PendingTokens-25000) > 1e-6 {
		t.Errorf("fleet %v s %v tokens, want 2.5 s 25000", f.Seconds, f.PendingTokens)
	}
	// 600,000 tokens over 60 s is 10,000/s against 2 x 10,000/s of capacity.
	if math.Abs(f.Utilisation-0.5) > 1e-9 {
		t.Errorf("utilisation %v, want 0.5", f.Utilisation)
	}
}

func TestComputeSharesTheKVPolicysDrainCredit(t *testing.T) {
	// The attention weight adds to what is ahead exactly as it does in kv's cost.
	cal := score.Calibration{DrainTokensPerS: 1000, DrainAttentionWeight: 0.001}
	now := 10 * sec
	r := Replica{Name: "a/0", Ready: true, PrefillTokens: 4000, PrefillAttention: 2_000_000, PrefillSince: now - sec/2}
	c := score.Candidate{PrefillTokens: 4000, PrefillAttention: 2_000_000, PrefillSince: now - sec/2, Calib: cal}
	f := Compute([]Replica{r}, cal, 60, now)
	if got, want := f.Replicas[0].PendingTokens, score.PrefillAhead(&c, now); got != want || want != 5500 {
		t.Errorf("pending %v, kv reads %v (want 5500)", got, want)
	}
}

func TestComputeUnmeasuredLeavesSecondsUnknown(t *testing.T) {
	f := Compute([]Replica{{Name: "a/0", Ready: true, PrefillTokens: 8000, WindowTokens: 8000}}, score.Calibration{}, 60, sec)
	if f.Measured || f.Seconds != 0 || f.Utilisation != 0 {
		t.Errorf("before any first token: measured %v seconds %v utilisation %v, want false 0 0", f.Measured, f.Seconds, f.Utilisation)
	}
	if f.PendingTokens != 8000 {
		t.Errorf("pending %v, want 8000 (tokens are known without a rate)", f.PendingTokens)
	}
}

func TestComputeNoReadyReplicaHasNoUtilisation(t *testing.T) {
	f := Compute([]Replica{{Name: "a/0", WindowTokens: 1000}}, score.Calibration{DrainTokensPerS: 100}, 60, sec)
	if f.Ready != 0 || f.Utilisation != 0 || math.IsInf(f.Utilisation, 0) {
		t.Errorf("ready %d utilisation %v, want 0 0", f.Ready, f.Utilisation)
	}
}
