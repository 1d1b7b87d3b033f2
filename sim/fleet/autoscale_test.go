package fleet

import "testing"

func TestHPAReplicas(t *testing.T) {
	for _, c := range []struct {
		v, target float64
		cur, want int
	}{
		{0, 1, 4, 0},      // nothing queued: the floor (clamped by the caller)
		{4.3, 1, 4, 4},    // within the 10 % tolerance: unchanged
		{4.5, 1, 4, 5},    // past it: ceil(v / target)
		{30, 2, 2, 15},    // a burst asks for many at once (the caller limits the step)
		{3.5, 1, 4, 4},    // within the tolerance down
		{3.0, 1, 4, 3},    // past it down
		{16, 4, 2, 4},     // queue 16 at target 4
		{0.26, 0.5, 1, 1}, // ratio 0.52: ceil to one
	} {
		if got := hpaReplicas(c.v, c.target, c.cur); got != c.want {
			t.Errorf("hpaReplicas(%v, %v, %d) = %d, want %d", c.v, c.target, c.cur, got, c.want)
		}
	}
}

// A load rising from 2 to 8 replicas' worth: the autoscaler, reading the backlog as kvrouter
// computes it from the model's ledger, scales the fleet past 8 ready replicas; a lower target
// scales no later and holds TTFT lower while scaling, at a cost in replica-seconds.
func TestAutoscaleOnTheBacklog(t *testing.T) {
	w := RampWorkloads["chat"]
	r := Ramp{PerReplicaRate: w.PerReplicaRate, PromptBlocks: w.PromptBlocks, From: 2, To: 8, BeforeS: 60, AfterS: 500, RiseS: 300, Groups: 32, Seed: 1}
	tr := RampTrace(r)
	row := func(a Autoscale) ScaleRow {
		a.MinReplicas, a.SyncSeconds, a.ProvisionSeconds = r.From, 15, 90
		res, err := Run(tr, Config{Replicas: 16, CapacityBlocks: 9600, Autoscale: &a}, "kv")
		if err != nil {
			t.Fatal(err)
		}
		return ScaleFigures("", r, res)
	}
	low, high, queue := row(Autoscale{BacklogTarget: 1}), row(Autoscale{BacklogTarget: 8}), row(Autoscale{QueueTarget: 4})
	t.Logf("backlog 1 s %+v\nbacklog 8 s %+v\nqueue 4 %+v", low, high, queue)
	for _, x := range []ScaleRow{low, high, queue} {
		if x.FirstUpS < 0 || x.ReadyS < 0 || x.Peak < r.To {
			t.Fatalf("did not scale to %d ready: %+v", r.To, x)
		}
	}
	if low.FirstUpS > high.FirstUpS || low.ReadyS > high.ReadyS {
		t.Errorf("backlog 1 s scaled later than 8 s: %+v vs %+v", low, high)
	}
	if low.TTFTP90 >= high.TTFTP90 || low.ReplicaSeconds <= high.ReplicaSeconds {
		t.Errorf("backlog 1 s: TTFT p90 %.2f s, %.0f replica-s; 8 s: %.2f s, %.0f replica-s: want the lower target faster and dearer",
			low.TTFTP90, low.ReplicaSeconds, high.TTFTP90, high.ReplicaSeconds)
	}
}

// With the HPA's default scale-down (the highest recommendation of the last 300 s, all at
// once), a queue-type signal drops the fleet to its floor once no queue has formed for 300 s,
// though the load has not fallen: the run records it.
func TestAutoscaleDefaultScaleDownCollapses(t *testing.T) {
	w := RampWorkloads["chat"]
	r := Ramp{PerReplicaRate: w.PerReplicaRate, PromptBlocks: w.PromptBlocks, From: 2, To: 8, BeforeS: 60, AfterS: 900, Groups: 32, Seed: 1}
	res, err := Run(RampTrace(r), Config{Replicas: 16, CapacityBlocks: 9600,
		Autoscale: &Autoscale{BacklogTarget: 1, MinReplicas: 2, SyncSeconds: 15, ProvisionSeconds: 90, ScaleDown: true}}, "kv")
	if err != nil {
		t.Fatal(err)
	}
	peak, after := 0, 0
	for _, e := range res.Scale.Events {
		if e.Desired > peak {
			peak = e.Desired
		}
		if peak >= r.To && e.Desired < r.To && after == 0 {
			after = int(e.At)
		}
	}
	if after == 0 {
		t.Fatalf("never scaled below %d after reaching %d", r.To, peak)
	}
	t.Logf("peak %d, below %d at %d s under constant load", peak, r.To, after)
}
