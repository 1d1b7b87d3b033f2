package vllmsim

import (
	"testing"
)

// newTestRank builds a rank to be stepped by hand (no goroutine, no clock).
func newTestRank(t *testing.T, mut func(*Config)) *rank {
	t.Helper()
	cfg := fastConfig()
	mut(&cfg)
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h, err := newBlockHasher(cfg.HashAlgo, cfg.HashSeed)
	if err != nil {
		t.Fatal(err)
	}
	return newRank(0, &cfg, h, nil)
}

func testRequest(t *testing.T, rk *rank, id string, prompt []uint32, maxTokens int) *engineRequest {
	t.Helper()
	r := newEngineRequest(id, prompt, maxTokens, 1, simIdentity{})
	if err := r.extendHashes(rk.hasher, rk.cfg.BlockSize); err != nil {
		t.Fatal(err)
	}
	return r
}

// stepOnce runs one schedule+update and returns the tokens scheduled per request id.
func stepOnce(rk *rank) map[string]int {
	step := rk.schedule()
	rk.update(step)
	out := map[string]int{}
	for _, s := range step {
		out[s.r.id] += s.tokens
	}
	return out
}

func TestChunkedPrefillSharesTheBudget(t *testing.T) {
	rk := newTestRank(t, func(c *Config) { c.MaxBatchedTokens = 32 })
	a := testRequest(t, rk, "a", seqTokens(0, 100), 2)
	b := testRequest(t, rk, "b", seqTokens(500, 10), 2)
	rk.submit(a, b)
	want := []map[string]int{{"a": 32}, {"a": 32}, {"a": 32}, {"a": 4, "b": 10}, {"a": 1, "b": 1}}
	for i, w := range want {
		got := stepOnce(rk)
		if len(got) != len(w) || got["a"] != w["a"] || got["b"] != w["b"] {
			t.Fatalf("step %d scheduled %v, want %v", i, got, w)
		}
	}
	if a.state != stateDone || b.state != stateDone || len(a.output) != 2 {
		t.Errorf("states %v %v, outputs %d", a.state, b.state, len(a.output))
	}
	if rk.pool.numFree != rk.pool.capacity() {
		t.Errorf("%d of %d blocks free after both finished", rk.pool.numFree, rk.pool.capacity())
	}
}

func TestMaxNumSeqsQueues(t *testing.T) {
	rk := newTestRank(t, func(c *Config) { c.MaxNumSeqs = 1 })
	a := testRequest(t, rk, "a", seqTokens(0, 5), 3)
	b := testRequest(t, rk, "b", seqTokens(100, 5), 3)
	rk.submit(a, b)
	for i := 0; i < 3; i++ {
		if got := stepOnce(rk); got["b"] != 0 {
			t.Fatalf("step %d scheduled b while a holds the only seat: %v", i, got)
		}
	}
	if got := stepOnce(rk); got["b"] != 5 {
		t.Errorf("b not admitted after a finished: %v", got)
	}
}

func TestPreemptionWhenBlocksRunOut(t *testing.T) {
	// 4 usable blocks of 16; two requests of 17 tokens take 2 each, then decode needs a third.
	rk := newTestRank(t, func(c *Config) { c.NumGPUBlocks = 5 })
	a := testRequest(t, rk, "a", seqTokens(0, 17), 20)
	b := testRequest(t, rk, "b", seqTokens(100, 17), 20)
	rk.submit(a, b)
	for i := 0; i < 200 && (a.state != stateDone || b.state != stateDone); i++ {
		stepOnce(rk)
		if rk.pool.numFree < 0 || rk.pool.numFree > rk.pool.capacity() {
			t.Fatalf("free blocks %d out of range", rk.pool.numFree)
		}
	}
	if a.state != stateDone || b.state != stateDone {
		t.Fatalf("not finished: a %v b %v", a.state, b.state)
	}
	if rk.stats.preemptions == 0 || b.preemptions == 0 || a.preemptions != 0 {
		t.Errorf("preemptions total %d, a %d, b %d; want the later request preempted", rk.stats.preemptions, a.preemptions, b.preemptions)
	}
	// A preempted request is counted once in the prefix-cache queries.
	if rk.stats.prefixQueries != 34 {
		t.Errorf("prefix queries %d, want 34", rk.stats.prefixQueries)
	}
	if len(a.output) != 20 || len(b.output) != 20 {
		t.Errorf("outputs %d, %d", len(a.output), len(b.output))
	}
}

func TestDuplicateBlocksLikeVLLM(t *testing.T) {
	// vLLM caches blocks when it allocates them, so b, scheduled after a in the same step,
	// already hits a's blocks.
	rk := newTestRank(t, func(c *Config) {})
	p := seqTokens(0, 49)
	a := testRequest(t, rk, "a", p, 1)
	b := testRequest(t, rk, "b", p, 1)
	rk.submit(a, b)
	stepOnce(rk)
	if a.cachedTokens != 0 || b.cachedTokens != 48 {
		t.Errorf("cached %d / %d, want 0 / 48", a.cachedTokens, b.cachedTokens)
	}
	// Two requests with the same prompt decode the same tokens (greedy-like): each computes
	// its own generated blocks, so one hash lives in two physical blocks, as in vLLM (block
	// tables are append-only, nothing de-duplicates them).
	rk = newTestRank(t, func(c *Config) {})
	a = testRequest(t, rk, "a", seqTokens(0, 17), 20)
	b = testRequest(t, rk, "b", seqTokens(0, 17), 20)
	rk.submit(a, b)
	for a.state != stateDone || b.state != stateDone {
		stepOnce(rk)
	}
	dups := 0
	for _, bs := range rk.pool.cached {
		if len(bs) > 1 {
			dups++
		}
	}
	if b.cachedTokens != 16 || dups != 1 {
		t.Errorf("b cached %d (want 16), %d duplicated hashes (want the one decode block)", b.cachedTokens, dups)
	}
	// Evicting both copies reports two BlockRemoved for that hash.
	var removed int
	rk.pool.takeEvents()
	c := testRequest(t, rk, "c", seqTokens(1000, 16*rk.pool.capacity()-1), 1)
	rk.submit(c)
	for c.state != stateDone {
		stepOnce(rk)
		for _, ev := range rk.pool.takeEvents() {
			if ev.kind == evRemoved {
				removed++
			}
		}
	}
	if removed != len(a.blockHashes)+len(b.blockHashes)-1 {
		t.Errorf("%d BlockRemoved, want one per physical cached block (%d)", removed, len(a.blockHashes)+len(b.blockHashes)-1)
	}
}
