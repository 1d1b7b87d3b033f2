package peers

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
)

// peerDiscoverWait is router/app's: how long a starting router listens for a ready peer.
const peerDiscoverWait = 1500 * time.Millisecond

// With a peer present and one engine dead (its process killed: HTTP, event and replay ports all
// gone), a starting router takes the peer's snapshot and is not ready while the dead engine's
// stream is neither exact nor approximate-from-the-snapshot; /readyz says so, naming that
// stream; peers.readyTimeout after the snapshot it is ready by the single-router rule (the other
// engines are healthy), with the dead engine's stream reported as what it is (not exact, not
// seeded) and the live ones exact from the snapshot.
func TestReadyWithADeadEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvrouter and vllm-sim processes")
	}
	es := startEngines(t, 3, "--decode-ms-per-token", "1")
	ca := cluster(t)
	a := startRouter(t, "ra", es, ca)
	testkit.WaitFor(t, 20*time.Second, "ra ready", a.ready)
	// Every engine publishes a batch, so the peer's snapshot holds the dead engine's stream at a
	// seq too (the harder case: a seed the new router must not trust). How the policy spreads
	// prefixes decides where they go, so rounds go on (at most 5) until each engine has a seq.
	for round := 0; ; round++ {
		if n := burst(t, []*router{a}, 12, 4, func(i int) []uint32 { return prompt(round*12+i, i, 32, 64) }, 1); n > 0 {
			t.Fatalf("%d warm-up requests failed", n)
		}
		missing := ""
		for _, e := range a.engines().Engines {
			if e.Ranks[0].LastSeq == nil {
				missing = e.Name
			}
		}
		if missing == "" {
			break
		}
		if round == 4 {
			t.Fatalf("engine %s published no batch in 60 requests", missing)
		}
	}
	dead := es[2]
	dead.sim.Kill()

	const readyTimeout = 3 * time.Second
	t0 := time.Now()
	c := startRouterOpts(t, "rc", es, cluster(t), routerOpts{readyTimeout: readyTimeout}, ca)
	// The bound: the peer is found within peerDiscoverWait, the snapshot is taken, readiness
	// follows readyTimeout later; 5 s more for process start and a loaded machine (measured:
	// 0.5-0.6 s past the timeout at load average 2-5).
	bound := peerDiscoverWait + readyTimeout + 5*time.Second
	var reasons []string
	ready := testkit.Until(bound-time.Since(t0), func() bool {
		code, why := c.readyz()
		if code != 200 && !slices.Contains(reasons, why) {
			reasons = append(reasons, why)
		}
		return code == 200
	})
	took := time.Since(t0)
	if !ready {
		t.Fatalf("not ready %v after start (bound %v); reasons seen %q", took.Round(time.Millisecond), bound, reasons)
	}
	t.Logf("ready %v after process start with engine %s dead (readyTimeout %v); /readyz said meanwhile %q",
		took.Round(time.Millisecond), dead.name, readyTimeout, reasons)
	named := false
	for _, why := range reasons {
		named = named || strings.Contains(why, "stream "+dead.name+"/")
	}
	if !named {
		t.Fatalf("/readyz never named the dead engine's stream while not ready: %q", reasons)
	}
	if took < readyTimeout {
		t.Fatalf("ready %v after start, before readyTimeout %v: the dead engine's stream did not hold the peer rule", took, readyTimeout)
	}
	d := c.engines()
	if d.RouterPeers == nil || d.RouterPeers.SeededFrom != "ra" {
		t.Fatalf("rc did not start from ra's snapshot: %+v", d.RouterPeers)
	}
	var states []string
	for _, e := range d.Engines {
		rk := e.Ranks[0]
		states = append(states, fmt.Sprintf("%s %s seeded=%v scoring=%s", e.Name, rk.Stream, rk.Seeded, rk.Scoring))
		if e.Name == dead.name {
			if rk.Stream == "exact" || rk.Seeded || rk.Scoring == "exact" {
				t.Fatalf("dead engine %s reported %s seeded=%v scoring=%s; want neither exact nor seeded", e.Name, rk.Stream, rk.Seeded, rk.Scoring)
			}
			continue
		}
		if rk.Stream != "exact" || !rk.Seeded {
			t.Fatalf("live engine %s: %s seeded=%v; want exact from the snapshot", e.Name, rk.Stream, rk.Seeded)
		}
	}
	if !strings.Contains(c.p.logs(), "peer readiness timed out") {
		t.Fatalf("rc did not log that the peer readiness timed out")
	}
	t.Logf("rc's streams once ready: %v", states)
	// And it routes, around the dead engine.
	if n := burst(t, []*router{c}, 6, 2, func(i int) []uint32 { return prompt(500+i, i, 32, 64) }, 1); n > 0 {
		t.Fatalf("%d requests failed through rc", n)
	}
}

// Engines without event streams are scored from the approximate index, which each router learns
// from its own decisions. A router that starts beside a peer takes that index from the peer's
// snapshot: it sends a prefix the peer already sent to the replica the peer sent it to, predicting
// the same cached blocks there, where a router on its own predicts none.
func TestApproximateIndexFromPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvrouter and vllm-sim processes")
	}
	es := startEngines(t, 3, "--decode-ms-per-token", "1")
	o := routerOpts{noEvents: true}
	ca := cluster(t)
	a := startRouterOpts(t, "ra", es, ca, o)
	testkit.WaitFor(t, 20*time.Second, "ra ready", a.ready)

	// Six prefixes of 128 tokens (8 blocks), one request each through ra, one at a time: ra
	// learns where each went.
	const groups, shared, n = 6, 128, 160
	where := map[int]string{}
	for g := range groups {
		eng, _, err := a.completion(prompt(g, g, shared, n), 1)
		if err != nil {
			t.Fatal(err)
		}
		where[g] = eng
	}
	probe := func(g int) []uint32 { return prompt(g, 1000+g, shared, n) }
	want := map[int]routeAnswer{}
	for g := range groups {
		ans := a.debugRoute(probe(g))
		if p := ans.cached()[where[g]+"/0"]; ans.Chosen != where[g]+"/0" || p < shared {
			t.Fatalf("premise: ra would send group %d to %s expecting cached %v; it sent the first to %s", g, ans.Chosen, ans.cached(), where[g])
		}
		want[g] = ans
	}

	alone := startRouterOpts(t, "alone", es, "", o)
	c := startRouterOpts(t, "rc", es, cluster(t), o, ca)
	testkit.WaitFor(t, 10*time.Second, "rc ready", c.ready)
	testkit.WaitFor(t, 20*time.Second, "the lone router ready", alone.ready)
	if d := c.engines(); d.RouterPeers == nil || d.RouterPeers.SeededFrom != "ra" {
		t.Fatalf("rc did not start from ra's snapshot: %+v", d.RouterPeers)
	}
	// The approximate index itself: the same keys per replica in rc as in ra.
	approxKeys := func(r *router) (keys map[string]string, counts map[string]int) {
		keys, counts = map[string]string{}, map[string]int{}
		for _, ap := range r.snapshot().Approx {
			var ks []string
			for _, e := range ap.Entries {
				ks = append(ks, fmt.Sprintf("%x", e.Key))
			}
			slices.Sort(ks)
			name := fmt.Sprintf("%s/%d", ap.Engine, ap.Rank)
			keys[name], counts[name] = strings.Join(ks, ","), len(ks)
		}
		return keys, counts
	}
	ka, na := approxKeys(a)
	kc, nc := approxKeys(c)
	if len(ka) != len(es) || fmt.Sprint(ka) != fmt.Sprint(kc) {
		t.Fatalf("approximate index: ra holds %v keys per replica, rc %v; want the same keys for each of %d replicas", na, nc, len(es))
	}
	for g := range groups {
		got := c.debugRoute(probe(g))
		if got.Chosen != want[g].Chosen || fmt.Sprint(got.cached()) != fmt.Sprint(want[g].cached()) {
			t.Fatalf("group %d: rc would send it to %s expecting cached %v; ra to %s expecting cached %v", g, got.Chosen, got.cached(), want[g].Chosen, want[g].cached())
		}
		for _, cd := range got.Candidates {
			if !cd.Approximate {
				t.Fatalf("rc scores %s exactly; it has no events", cd.Replica)
			}
		}
		// The control: the same binary and engines without the peer predict nothing.
		if lone := alone.debugRoute(probe(g)).cached(); lone[where[g]+"/0"] != 0 {
			t.Fatalf("the lone router expects cached %v for group %d; the prediction must come from the snapshot", lone, g)
		}
	}
	// Sent for real through rc, each prefix goes where ra sent it, with cached tokens predicted.
	for g := range groups {
		eng, cached, err := c.completion(probe(g), 1)
		if err != nil {
			t.Fatal(err)
		}
		if eng != where[g] {
			t.Fatalf("group %d: rc sent it to %s, ra to %s", g, eng, where[g])
		}
		if cached < shared {
			t.Fatalf("group %d on %s: engine reports %d cached tokens; want the %d-token prefix", g, eng, cached, shared)
		}
	}
	t.Logf("rc routed %d prefixes as ra did, from ra's approximate index: %v", groups, where)
}
