package replay

import (
	"math"
	"os"
	"testing"
)

// search runs a RateSearch against a latency curve: p99(rate) in seconds.
func search(t *testing.T, p99 func(float64) float64, slo, start float64) (float64, int) {
	t.Helper()
	s := NewRateSearch(start, 0.05, 30)
	for {
		r, ok := s.Next()
		if !ok {
			break
		}
		if r <= 0 || math.IsNaN(r) {
			t.Fatalf("probe at rate %v", r)
		}
		s.Observe(p99(r) <= slo)
	}
	return s.Capacity()
}

// On synthetic curves whose SLO crossing is known, the search lands within 5% under it.
func TestRateSearchFindsTheCrossing(t *testing.T) {
	mm1 := func(capacity, service float64) func(float64) float64 {
		// M/M/1-shaped p99: service·ln(100)/(1−ρ), infinite past capacity.
		return func(r float64) float64 {
			rho := r / capacity
			if rho >= 1 {
				return math.Inf(1)
			}
			return service * math.Log(100) / (1 - rho)
		}
	}
	for _, tc := range []struct {
		name  string
		p99   func(float64) float64
		slo   float64
		start float64
		want  float64
	}{
		// ρ at the crossing: 1 − 0.1·ln100/2 = 0.7697.
		{"ramp up", mm1(40, 0.1), 2, 1, 40 * (1 - 0.1*math.Log(100)/2)},
		{"start above", mm1(40, 0.1), 2, 200, 40 * (1 - 0.1*math.Log(100)/2)},
		{"step", func(r float64) float64 {
			if r > 13 {
				return 5
			}
			return 0.5
		}, 2, 3, 13},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, probes := search(t, tc.p99, tc.slo, tc.start)
			if got > tc.want || got < tc.want/1.05 {
				t.Errorf("capacity %v, want within 5%% under %v (%d probes)", got, tc.want, probes)
			}
			if probes > 15 {
				t.Errorf("%d probes", probes)
			}
		})
	}
	// Never meets the SLO: capacity 0, and the search stops at its floor.
	if got, probes := search(t, func(float64) float64 { return 10 }, 2, 8); got != 0 || probes > 8 {
		t.Errorf("an SLO never met: capacity %v after %d probes, want 0 within 8", got, probes)
	}
}

// Probes that contradict monotonicity (noise) do not make the search loop: it ends within
// MaxProbes with a rate that passed.
func TestRateSearchSurvivesNoise(t *testing.T) {
	s := NewRateSearch(10, 0.05, 12)
	n := 0
	for {
		r, ok := s.Next()
		if !ok {
			break
		}
		n++
		s.Observe(n%3 != 0 && r < 50) // every third probe fails whatever the rate
	}
	got, probes := s.Capacity()
	if probes > 12 || got >= 50 {
		t.Errorf("capacity %v after %d probes", got, probes)
	}
}

func TestMeetsSLO(t *testing.T) {
	ttfts := make([]float64, 100)
	for i := range ttfts {
		ttfts[i] = 1
	}
	if !MeetsSLO(ttfts, 0, 2) {
		t.Error("all at 1 s against 2 s")
	}
	ttfts[98], ttfts[99] = 3, 3 // p99 interpolates between the 99th and 100th: 3
	if MeetsSLO(ttfts, 0, 2) {
		t.Error("p99 3 s against 2 s")
	}
	if MeetsSLO([]float64{0.1}, 1, 2) || MeetsSLO(nil, 0, 2) {
		t.Error("a failed request or an empty run met the SLO")
	}
}

func TestCapacityRatios(t *testing.T) {
	caps := map[string][]float64{
		"kv":          {20, 30, 10},
		"round-robin": {10, 20, 0},
		"load":        {16, 10, 0},
	}
	r, best := CapacityRatios(caps, "kv")
	if r[0] != 20.0/16 || r[1] != 30.0/20 || !math.IsNaN(r[2]) {
		t.Errorf("ratios %v", r)
	}
	if best[0] != "load" || best[1] != "round-robin" {
		t.Errorf("best others %v", best)
	}
	iv := TInterval(r)
	if iv.N != 2 || !iv.Range {
		t.Errorf("interval of two ratios (the NaN left out): %+v", iv)
	}
}

// The stopping rule on per-seed ratios: a tight spread stops at 3 seeds, a wide one runs to the
// cap.
func TestEnoughSeeds(t *testing.T) {
	tight := []float64{1.20, 1.21, 1.19}
	// mean 1.2, sd 0.01, half-width 4.303·0.01/√3 = 0.0248: 2.1% of the mean.
	if w := RelativeHalfWidth(TInterval(tight)); math.Abs(w-4.303*0.01/math.Sqrt(3)/1.2) > 1e-9 {
		t.Errorf("relative half-width %v", w)
	}
	if !EnoughSeeds(tight, 10, 0.03) {
		t.Error("a 2.1% half-width did not stop at 3 seeds")
	}
	wide := []float64{1.0, 1.3, 1.1, 0.9}
	if EnoughSeeds(wide, 10, 0.03) {
		t.Error("a wide spread stopped")
	}
	if !EnoughSeeds(append(wide, 1, 1, 1, 1, 1, 1), 10, 0.03) {
		t.Error("10 seeds did not stop")
	}
	if EnoughSeeds([]float64{1, 1}, 10, 0.03) {
		t.Error("two seeds stopped: no interval yet")
	}
}

func TestCPUParsing(t *testing.T) {
	busy, total, err := parseHostStat("cpu  100 5 50 800 45 0 0 0 0 0\ncpu0 50 2 25 400 20 0 0 0 0 0\n")
	if err != nil || total != 1000 || busy != 155 {
		t.Errorf("host: busy %d total %d err %v, want 155 / 1000", busy, total, err)
	}
	if _, _, err := parseHostStat("intr 1 2 3\n"); err == nil {
		t.Error("no cpu line accepted")
	}
	ticks, err := parseProcStat("4242 (vllm sim) S 1 4242 4242 0 -1 4194560 100 0 0 0 300 45 0 0 20 0 8 0 123 0 0")
	if err != nil || ticks != 345 {
		t.Errorf("process ticks %d err %v, want 345 (a name with a space)", ticks, err)
	}
	a := cpuSnapshot{busy: 1000, total: 4000, procs: 100}
	b := cpuSnapshot{busy: 1700, total: 5000, procs: 200} // 70% busy; 100 ticks over 2 s on 2 cores
	u := cpuUse(a, b, 2, 2)
	if math.Abs(u.Host-0.7) > 1e-12 || math.Abs(u.Replay-0.25) > 1e-12 || !u.Invalid {
		t.Errorf("use %+v, want host 0.7, replay 0.25, invalid", u)
	}
	if u := cpuUse(a, cpuSnapshot{busy: 1500, total: 5000, procs: 100}, 2, 2); u.Invalid {
		t.Errorf("50%% host marked invalid: %+v", u)
	}
}

// The machine this test runs on can be read (Linux).
func TestSnapshotCPUReadsThisMachine(t *testing.T) {
	s, err := snapshotCPU([]int{os.Getpid()})
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	if s.total == 0 || s.busy > s.total {
		t.Errorf("snapshot %+v", s)
	}
}

// A probe counts each request's TTFT from its arrival: the time the concurrency cap held it
// counts against the SLO (the held request's user waited too), and the summary counts it.
func TestProbeCountsTimeHeldByTheCap(t *testing.T) {
	r := &RunResult{Policy: "kv", Seed: 1, Outcomes: []Outcome{{TTFT: 0.5}, {TTFT: 0.5, Held: 1}}}
	c := CapacityOptions{SLO: 2, TimeScale: 2}
	p := probeOf(r, 1, c)
	if p.P99 < 2.9 || p.Met { // interpolated between 1 and 3 trace seconds
		t.Fatalf("probe %+v: want p99 (1 s held + 0.5 s) x time scale 2 = 3 trace seconds, SLO not met", p)
	}
	if s := Summarize([]*RunResult{r}); s[0].Held != 1 {
		t.Fatalf("summary counts %d held requests, want 1", s[0].Held)
	}
}
