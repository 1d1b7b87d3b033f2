package score

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
)

func keys(ids ...uint64) []blockkey.Key {
	out := make([]blockkey.Key, len(ids))
	for i, id := range ids {
		out[i] = blockkey.Key(id)
	}
	return out
}

func fleetOf(n int) []Candidate {
	c := make([]Candidate, n)
	for i := range c {
		c[i] = Candidate{ID: string(rune('a' + i)), Healthy: true}
	}
	return c
}

func mustNew(t *testing.T, name string) Policy {
	t.Helper()
	p, err := New(name, Options{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRegistryHasEveryContractName(t *testing.T) {
	for _, n := range ProductionPolicies {
		p := mustNew(t, n)
		if p.Name() != n {
			t.Errorf("New(%q).Name() = %q", n, p.Name())
		}
	}
	for _, n := range []string{"nope", "prefix-char", "kv-ttft", "random"} {
		if _, err := New(n, Options{}); err == nil {
			t.Errorf("%q accepted: only production policies are built without a registry that adds them", n)
		}
	}
}

func TestNoHealthyCandidateIsAnErrorForEveryPolicy(t *testing.T) {
	req := &Request{Keys: keys(1, 2), Tokens: 32, BlockSize: 16, SessionKey: "s"}
	for _, n := range ProductionPolicies {
		c := fleetOf(3)
		for i := range c {
			c[i].Healthy = false
		}
		if _, err := mustNew(t, n).Pick(req, c); !errors.Is(err, ErrNoCandidate) {
			t.Errorf("%s: err = %v, want ErrNoCandidate", n, err)
		}
		if _, err := mustNew(t, n).Pick(req, nil); !errors.Is(err, ErrNoCandidate) {
			t.Errorf("%s with no candidates: err = %v", n, err)
		}
	}
}

func TestUnhealthyNeverPicked(t *testing.T) {
	for _, n := range ProductionPolicies {
		p := mustNew(t, n)
		c := fleetOf(3)
		c[1].Healthy = false
		c[1].ExactBlocks = 4 // tempting, but unhealthy
		for k := 0; k < 20; k++ {
			req := &Request{Keys: keys(1, 2, 3, 4), Tokens: 64, BlockSize: 16, SessionKey: "s"}
			i, err := p.Pick(req, c)
			if err != nil || i == 1 {
				t.Fatalf("%s picked %d err %v", n, i, err)
			}
			p.OnRouted(req, c, i)
		}
	}
}

func TestKVPrefersCacheAndFallsBackToLeastLoaded(t *testing.T) {
	p := mustNew(t, "kv")
	req := &Request{Keys: keys(1, 2, 3, 4), Tokens: 64, BlockSize: 16}
	c := fleetOf(3)
	c[0].PrefillTokens = 10
	c[2].ExactBlocks = 4
	if i, _ := p.Pick(req, c); i != 2 {
		t.Errorf("kv picked %d, want the replica holding the prompt (2)", i)
	}
	// No overlap anywhere: least loaded.
	c = fleetOf(3)
	c[0].PrefillTokens, c[1].PrefillTokens, c[2].PrefillTokens = 500, 100, 300
	if i, _ := p.Pick(req, c); i != 1 {
		t.Errorf("kv without overlap picked %d, want least loaded (1)", i)
	}
	// Predicted overlap counts like exact overlap.
	c = fleetOf(3)
	c[0].PredictedBlocks = 4
	if i, _ := p.Pick(req, c); i != 0 {
		t.Errorf("kv ignored predicted overlap: picked %d", i)
	}
	// Warm-up credit is virtual overlap: a fully credited replica beats an idle cold one.
	c = fleetOf(2)
	c[0].PrefillTokens = 20
	c[1].PrefillTokens = 20
	c[1].WarmupCredit = 1
	if i, _ := p.Pick(req, c); i != 1 {
		t.Errorf("kv ignored warm-up credit: picked %d", i)
	}
}

func TestKVCPUOverlapWorthLessThanGPU(t *testing.T) {
	p := mustNew(t, "kv")
	req := &Request{Keys: keys(1, 2, 3, 4), Tokens: 64, BlockSize: 16}
	c := fleetOf(2)
	c[0].ExactBlocks, c[0].TierBlocks = 4, [NumTiers]int{0, 4, 0}
	c[1].ExactBlocks, c[1].TierBlocks = 4, [NumTiers]int{4, 0, 0}
	if i, _ := p.Pick(req, c); i != 1 {
		t.Errorf("picked %d, want the GPU holder", i)
	}
}

func TestKVImbalanceGuardSpreadsAHotPrefix(t *testing.T) {
	// Every request shares a prefix held by replica 0 but has a long uncached tail: the guard
	// must keep replica 0 from taking everything.
	p := newKVRig(Options{}) // the ledger's windows: the guard reads them
	work := make([]float64, 4)
	counts := make([]int, 4)
	for k := 0; k < 400; k++ {
		req := &Request{Keys: keys(1, uint64(100+k), uint64(10000+k)), Tokens: 48, BlockSize: 16, NowNs: int64(k) * 1e8}
		c := fleetOf(4)
		c[0].ExactBlocks = 1
		i, err := p.Pick(req, c)
		if err != nil {
			t.Fatal(err)
		}
		p.OnRouted(req, c, i)
		counts[i]++
		work[i] += float64(req.Tokens - c[i].ExactBlocks*16)
	}
	mean := (work[0] + work[1] + work[2] + work[3]) / 4
	// The bound: (1+Slack) x the mean, plus the one request that may cross it.
	for i, w := range work {
		if w > (1+DefaultKV.Slack)*mean+48 {
			t.Errorf("replica %d did %.0f prefill tokens, over the bound of mean %.0f (%v)", i, w, mean, work)
		}
	}
	// The prefix holder gets more requests (its work per request is smaller), not all of them.
	if counts[0] <= counts[1] || counts[0] > 200 {
		t.Errorf("request counts %v: want the holder favoured but bounded", counts)
	}
}

func TestRoundRobinCycles(t *testing.T) {
	p := mustNew(t, "round-robin")
	c := fleetOf(3)
	var got []int
	for k := 0; k < 6; k++ {
		i, _ := p.Pick(&Request{}, c)
		p.OnRouted(&Request{}, c, i)
		got = append(got, i)
	}
	want := []int{0, 1, 2, 0, 1, 2}
	for k := range want {
		if got[k] != want[k] {
			t.Fatalf("round-robin order %v, want %v", got, want)
		}
	}
}

func TestSessionIsStickyUnderTheCap(t *testing.T) {
	p := mustNew(t, "session")
	c := fleetOf(5)
	first, _ := p.Pick(&Request{SessionKey: "user-42"}, c)
	for k := 0; k < 10; k++ {
		if i, _ := p.Pick(&Request{SessionKey: "user-42"}, c); i != first {
			t.Fatalf("session moved from %d to %d", first, i)
		}
	}
	// Overload the sticky replica: the cap moves the session on.
	c[first].Queue = 100
	if i, _ := p.Pick(&Request{SessionKey: "user-42"}, c); i == first {
		t.Error("session ignored the load cap")
	}
	// No session key: least loaded.
	c = fleetOf(3)
	c[0].PrefillTokens, c[1].PrefillTokens = 50, 50
	if i, _ := p.Pick(&Request{}, c); i != 2 {
		t.Errorf("no session key picked %d, want least loaded 2", i)
	}
}

// load weighs a request still in prefill by its whole prompt: "a" was just sent a 7,680-token
// prompt whose 6,144-token prefix it holds (1,536 uncached), "b" runs one such request past its
// first token. a has the same context coming and its prefill still to do, so load picks b; by
// uncached tokens alone a (1,536) looked lighter than b (7,680) and took every request of a hot
// prefix in turn.
func TestLoadCountsWhatARequestInPrefillHolds(t *testing.T) {
	for _, name := range []string{"load", "least-loaded"} {
		p := mustNew(t, name)
		c := fleetOf(2)
		c[0].PrefillTokens, c[0].PrefillHeldTokens = 1536, 7680
		c[1].DecodeTokens = 7680
		if i, err := p.Pick(&Request{Tokens: 7680}, c); err != nil || i != 1 {
			t.Errorf("%s picked %d (%v), want b: a's request in prefill holds as much as b's and has prefill left", name, i, err)
		}
	}
}
