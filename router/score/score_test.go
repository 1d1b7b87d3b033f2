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
	for _, n := range []string{"kv", "load", "least-loaded", "round-robin", "random", "session",
		"prefix-char", "sglang-cache-aware", "llmd-default", "dynamo-kv"} {
		p := mustNew(t, n)
		if p.Name() != n {
			t.Errorf("New(%q).Name() = %q", n, p.Name())
		}
	}
	if _, err := New("nope", Options{}); err == nil {
		t.Error("unknown policy accepted")
	}
}

func TestNoHealthyCandidateIsAnErrorForEveryPolicy(t *testing.T) {
	req := &Request{Keys: keys(1, 2), Tokens: 32, BlockSize: 16, SessionKey: "s"}
	for _, n := range Names() {
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
	for _, n := range Names() {
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

func TestRandomIsSeededAndSpreads(t *testing.T) {
	seq := func(seed int64) []int {
		p, _ := New("random", Options{Seed: seed})
		var out []int
		for k := 0; k < 50; k++ {
			i, _ := p.Pick(&Request{}, fleetOf(4))
			out = append(out, i)
		}
		return out
	}
	a, b := seq(1), seq(1)
	seen := map[int]bool{}
	for k := range a {
		if a[k] != b[k] {
			t.Fatal("same seed, different choices")
		}
		seen[a[k]] = true
	}
	if len(seen) != 4 {
		t.Errorf("random used only %d of 4 replicas", len(seen))
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

func TestPrefixCharFollowsLongestMatchWithoutLoad(t *testing.T) {
	p := mustNew(t, "prefix-char")
	c := fleetOf(3)
	req := &Request{Text: "system prompt " + string(make([]byte, 300)) + "question one"}
	i, _ := p.Pick(req, c)
	p.OnRouted(req, c, i)
	c[i].Queue, c[i].PrefillTokens = 1000, 1<<20 // no load term: it must not care
	req2 := &Request{Text: "system prompt " + string(make([]byte, 300)) + "question two"}
	if j, _ := p.Pick(req2, c); j != i {
		t.Errorf("prefix-char picked %d, want the replica with the shared 128-char chunks %d", j, i)
	}
	// A prompt shorter than one chunk shares nothing with a different one: random tie-break.
	seen := map[int]bool{}
	for k := 0; k < 40; k++ {
		j, _ := p.Pick(&Request{Text: "x" + string(rune('a'+k%26)) + string(rune('a'+k/26))}, c)
		seen[j] = true
	}
	if len(seen) < 2 {
		t.Error("prefix-char tie-break is not random")
	}
}

func TestSGLangImbalanceSwitchAndSmallestTree(t *testing.T) {
	p := mustNew(t, "sglang-cache-aware")
	req := &Request{Keys: keys(1, 2, 3, 4), Tokens: 64, BlockSize: 16}
	c := fleetOf(3)
	p.OnRouted(req, c, 0) // replica 0's tree holds the prompt
	if i, _ := p.Pick(req, c); i != 0 {
		t.Errorf("balanced fleet: picked %d, want best match 0", i)
	}
	// (max - min) > 64 and max > 1.5 x min: shortest queue wins regardless of cache.
	c[0].Running, c[1].Running, c[2].Running = 100, 20, 30
	if i, _ := p.Pick(req, c); i != 1 {
		t.Errorf("imbalanced fleet: picked %d, want shortest queue 1", i)
	}
	// Imbalance that misses the absolute threshold keeps the cache choice.
	c[0].Running, c[1].Running, c[2].Running = 60, 0, 1
	if i, _ := p.Pick(req, c); i != 0 {
		t.Errorf("abs diff 60 <= 64: picked %d, want 0", i)
	}
	// Low match rate (<= 0.3): the smallest tree.
	c = fleetOf(3)
	p.OnRouted(&Request{Keys: keys(50, 51), Tokens: 32, BlockSize: 16}, c, 1)
	cold := &Request{Keys: keys(90, 91, 92, 93), Tokens: 64, BlockSize: 16}
	if i, _ := p.Pick(cold, c); i != 2 {
		t.Errorf("miss: picked %d, want the empty tree 2", i)
	}
}

func TestLLMDWeights(t *testing.T) {
	p := mustNew(t, "llmd-default")
	req := &Request{Keys: keys(1, 2), Tokens: 128, BlockSize: 64}
	c := fleetOf(2)
	p.OnRouted(req, c, 0)
	// Full prefix match (3) beats the best queue score (2) of an empty replica.
	c[0].Queue, c[1].Queue = 10, 0
	if i, _ := p.Pick(req, c); i != 0 {
		t.Errorf("picked %d, want the prefix holder", i)
	}
	// Full KV (kv 0 vs 2) and longest queue (0 vs 2) together outweigh prefix 3.
	c[0].KVUtil = 1
	if i, _ := p.Pick(req, c); i != 1 {
		t.Errorf("picked %d, want the empty replica", i)
	}
}

func TestDynamoCost(t *testing.T) {
	p := mustNew(t, "dynamo-kv")
	req := &Request{Keys: keys(1, 2, 3, 4), Tokens: 64, BlockSize: 16}
	c := fleetOf(2)
	// a: overlap 4 but 3 blocks of decode; b: idle. cost a = max(0+4-4,0)+3+4 = 7, b = 4+0+4 = 8.
	c[0].ExactBlocks, c[0].DecodeTokens = 4, 48
	if i, _ := p.Pick(req, c); i != 0 {
		t.Errorf("picked %d, want 0 (cost 7 < 8)", i)
	}
	// With 5 blocks of decode a costs 9 > 8.
	c[0].DecodeTokens = 80
	if i, _ := p.Pick(req, c); i != 1 {
		t.Errorf("picked %d, want 1 (cost 9 > 8)", i)
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
