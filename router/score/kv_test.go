package score

import (
	"math"
	"testing"
	"time"
)

const sec = int64(time.Second)

func TestTokenWindowIsExact(t *testing.T) {
	var w tokenWindow
	span := 60 * sec
	w.add(0, 100)
	w.add(30*sec, 50)
	sum := func(now, span int64) float64 { w.prune(now, span); t, _ := w.read(now, span); return t }
	if got, _ := w.read(60*sec, span); got != 50 {
		t.Errorf("read once the first entry is 60 s old = %v, want 50 (before any prune)", got)
	}
	if got := sum(60*sec-1, span); got != 150 {
		t.Errorf("sum just before the first entry leaves = %v, want 150", got)
	}
	if got := sum(60*sec, span); got != 50 {
		t.Errorf("sum once the first entry is 60 s old = %v, want 50", got)
	}
	if got := sum(90*sec, span); got != 0 {
		t.Errorf("sum of an empty window = %v, want 0", got)
	}
	// Many entries: the ring grows and wraps, and the sum stays the sum of the last 60 s.
	for i := int64(0); i < 1000; i++ {
		w.add(100*sec+i*sec, float64(i))
		want := 0.0
		for j := max(i-59, 0); j <= i; j++ {
			want += float64(j)
		}
		if got := sum(100*sec+i*sec, span); got != want {
			t.Fatalf("after %d entries sum = %v, want %v", i+1, got, want)
		}
	}
}

func TestKVWindowRefusesARecentlyBusyReplicaUntilItsWorkLeaves(t *testing.T) {
	p := newKVRig(Options{Seed: 1})
	c := fleetOf(2)
	big := &Request{Keys: keys(seq(100)...), Tokens: 1600, BlockSize: 16}
	p.OnRouted(big, c, 0) // a miss of 1600 tokens on replica a at t=0
	half := func(now int64) int {
		req := &Request{Keys: keys(seq(100)...), Tokens: 1600, BlockSize: 16, NowNs: now}
		c := fleetOf(2)
		c[0].ExactBlocks = 50 // a holds half the prompt
		i, err := p.Pick(req, c)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	if i := half(59 * sec); i != 1 {
		t.Errorf("at 59 s kv picked %d; replica a still has 1,600 tokens in its window, want b", i)
	}
	if i := half(61 * sec); i != 0 {
		t.Errorf("at 61 s kv picked %d; a's window is empty again, want its cache", i)
	}
}

func TestKVFullHitIgnoresTheBound(t *testing.T) {
	p := newKVRig(Options{Seed: 1})
	c := fleetOf(2)
	p.OnRouted(&Request{Keys: keys(seq(100)...), Tokens: 100000, BlockSize: 16}, c, 0)
	req := &Request{Keys: keys(seq(10)...), Tokens: 160, BlockSize: 16, NowNs: sec}
	c[0].ExactBlocks = 10
	if i, _ := p.Pick(req, c); i != 0 {
		t.Errorf("a full hit went to %d; it adds no prefill work, want the holder", i)
	}
	c[0].ExactBlocks = 5
	if i, _ := p.Pick(req, c); i != 1 {
		t.Errorf("a half hit went to %d on a replica far over the bound, want the other", i)
	}
}

func TestKVKeepsAPrefixGroupDespiteQueuedPrefill(t *testing.T) {
	pick := func(o Options) int {
		p := newKVRig(o)
		c := fleetOf(2)
		// Both replicas have recent work, so both are under the bound and cost decides.
		p.OnRouted(&Request{Tokens: 100000, BlockSize: 16}, c, 0)
		p.OnRouted(&Request{Tokens: 100000, BlockSize: 16}, c, 1)
		c[0].ExactBlocks = 375 // 6,000 of 7,200 tokens cached
		c[0].PrefillTokens = 10000
		i, err := p.Pick(&Request{Keys: keys(seq(450)...), Tokens: 7200, BlockSize: 16, NowNs: sec}, c)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	if i := pick(Options{Seed: 1}); i != 0 {
		t.Errorf("default kv picked %d: 1,200 uncached behind 10,000 queued, want the holder over 7,200 on an idle replica", i)
	}
	// At full weight the queued prefill outweighs the saved 6,000 tokens and the group scatters.
	full := DefaultKV
	full.QueuedPrefillWeight = 1
	if i := pick(Options{Seed: 1, KV: &full}); i != 1 {
		t.Errorf("kv with QueuedPrefillWeight 1 picked %d, want the idle replica", i)
	}
}

func TestKVPickDoesNotAllocate(t *testing.T) {
	p := newKVRig(Options{Seed: 1})
	c := fleetOf(16)
	req := &Request{Keys: keys(seq(64)...), Tokens: 1024, BlockSize: 16}
	for k := range c {
		c[k].ExactBlocks = k * 4
		c[k].PrefillTokens = 100 * k
	}
	for k := 0; k < 64; k++ { // fill every replica's window ring past its first growth
		req.NowNs = int64(k) * 1e6
		p.OnRouted(req, c, k%16)
	}
	allocs := testing.AllocsPerRun(200, func() {
		req.NowNs += 1e6
		if _, err := p.Pick(req, c); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Pick allocates %v times per call, want 0", allocs)
	}
}

func BenchmarkKVPick16(b *testing.B) {
	p := newKVRig(Options{Seed: 1})
	c := fleetOf(16)
	req := &Request{Keys: keys(seq(64)...), Tokens: 1024, BlockSize: 16}
	for k := range c {
		c[k].ExactBlocks = k * 4
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req.NowNs = int64(i) * 1e6
		j, _ := p.Pick(req, c)
		p.OnRouted(req, c, j)
	}
}

func seq(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

func TestKVTemperatureSamplesOnlyEligibleReplicas(t *testing.T) {
	o := DefaultKV
	o.Temperature = 1
	p := newKVRig(Options{Seed: 3, KV: &o})
	c := fleetOf(4)
	c[3].Healthy = false
	// Replica 0 is far over the bound; 1 and 2 are alike, so both should be drawn.
	p.OnRouted(&Request{Tokens: 100000, BlockSize: 16}, c, 0)
	seen := map[int]int{}
	for k := 0; k < 200; k++ {
		i, err := p.Pick(&Request{Keys: keys(seq(4)...), Tokens: 64, BlockSize: 16, NowNs: sec}, c)
		if err != nil {
			t.Fatal(err)
		}
		seen[i]++
	}
	if seen[0] > 0 || seen[3] > 0 || seen[1] == 0 || seen[2] == 0 {
		t.Errorf("picks %v: want only replicas 1 and 2, both drawn", seen)
	}
}

func TestKVRequestBoundSpillsAHotPrefix(t *testing.T) {
	p := newKVRig(Options{Seed: 1})
	const n = 4
	got := make([]int, n)
	// 200 requests inside one window, each a full hit on replica 0 only (the others missed the
	// first copy): the token bound never applies to a full hit, so only the request bound
	// keeps replica 0 from taking them all.
	for r := 0; r < 200; r++ {
		c := fleetOf(n)
		c[0].ExactBlocks = 10
		req := &Request{Keys: keys(seq(10)...), Tokens: 160, BlockSize: 16, NowNs: int64(r) * sec / 10}
		i, err := p.Pick(req, c)
		if err != nil {
			t.Fatal(err)
		}
		p.OnRouted(req, c, i)
		got[i]++
	}
	// The bound is 2 x the running mean + 4 (the +1 is the request being placed).
	if limit := 2*200/n + 4 + 1; got[0] > limit {
		t.Errorf("replica 0 took %d of 200 hot requests, over the request bound %d", got[0], limit)
	}
	if got[0] < 200/n {
		t.Errorf("replica 0 took %d of 200; holding the prefix it should take at least a fair share", got[0])
	}
	for i := 1; i < n; i++ {
		if got[i] == 0 {
			t.Errorf("replica %d got no request: the hot prefix never spilled to it (%v)", i, got)
		}
	}
	// With the bound (and the floor) switched off the holder takes every request: the test
	// can fail.
	off := DefaultKV
	off.RequestSlack, off.RequestHeadroom, off.StarvedShare = math.Inf(1), 0, 0
	q := newKVRig(Options{Seed: 1, KV: &off})
	for r := 0; r < 50; r++ {
		c := fleetOf(n)
		c[0].ExactBlocks = 10
		req := &Request{Keys: keys(seq(10)...), Tokens: 160, BlockSize: 16, NowNs: int64(r) * sec / 10}
		if i, _ := q.Pick(req, c); i != 0 {
			t.Fatalf("without the request bound a full hit went to %d, want the holder", i)
		}
		q.OnRouted(req, c, 0)
	}
}

func TestKVFloorFeedsAReplicaAHotPrefixMissed(t *testing.T) {
	// Three of four replicas hold the hot prefix (full hits); each carries some load, so the
	// request bound (2x the mean) never fires. Only the floor sends the fourth a request.
	route := func(p KVParams) []int {
		k := newKVRig(Options{Seed: 1, KV: &p})
		got := make([]int, 4)
		for r := 0; r < 120; r++ {
			c := fleetOf(4)
			for i := 0; i < 3; i++ {
				c[i].ExactBlocks = 10
				c[i].PrefillTokens = 96
			}
			req := &Request{Keys: keys(seq(11)...), Tokens: 176, BlockSize: 16, NowNs: int64(r) * sec / 25}
			i, err := k.Pick(req, c)
			if err != nil {
				t.Fatal(err)
			}
			k.OnRouted(req, c, i)
			got[i]++
		}
		return got
	}
	off := DefaultKV
	off.StarvedShare = 0
	if got := route(off); got[3] != 0 {
		t.Fatalf("without the floor the replica without the prefix got %d requests (%v); the case does not test the floor", got[3], got)
	}
	got := route(DefaultKV)
	// Floor after k requests: 0.25 x k/4 - 1, so at least 120/16 - 1 = 6.5 requests.
	if got[3] < 6 {
		t.Errorf("the replica without the prefix got %d of 120 requests (%v); the floor wants at least 6", got[3], got)
	}
	if got[3] > 120/4 {
		t.Errorf("the floor gave the starved replica %d of 120 (%v), more than a fair share", got[3], got)
	}
}

func TestKVDoesNotFloodANewReplica(t *testing.T) {
	// Read raw, the newcomer's empty window is far below a busy fleet's: the token bound
	// would make it the only eligible replica and the floor would call it starved. Windows
	// are compared as rates over each replica's time in the fleet, and the floor stops at a
	// share of the requests in flight.
	k := newKVRig(Options{Seed: 1})
	// A busy fleet of three with full windows, then a fourth joins with an empty one.
	for r := 0; r < 300; r++ {
		c := fleetOf(3)
		req := &Request{Keys: keys(seq(10)...), Tokens: 160, BlockSize: 16, NowNs: int64(r) * sec / 10}
		i, _ := k.Pick(req, c)
		k.OnRouted(req, c, i)
	}
	got := 0
	running := [4]int{5, 5, 5, 0}
	for r := 0; r < 20; r++ {
		c := fleetOf(4)
		for i := range c {
			c[i].Running = running[i]
		}
		req := &Request{Keys: keys(seq(10)...), Tokens: 160, BlockSize: 16, NowNs: 30*sec + int64(r)*sec/10}
		i, _ := k.Pick(req, c)
		k.OnRouted(req, c, i)
		running[i]++
		if i == 3 {
			got++
		}
	}
	// The floor wants ~18 requests in its window; in-flight share stops it at the fleet's mean.
	if got == 0 || got > 12 {
		t.Errorf("the new replica took %d of the next 20 requests; want some, not a flood (in flight: %v)", got, running)
	}
}

// A retracted routing leaves no trace in the replica's window.
func TestKVRetractAndForget(t *testing.T) {
	p := newKVRig(Options{Seed: 1})
	c := fleetOf(2)
	req := &Request{Keys: keys(seq(100)...), Tokens: 1600, BlockSize: 16, NowNs: 5 * sec}
	p.OnRouted(req, c, 0)
	other := &Request{Keys: keys(seq(10)...), Tokens: 160, BlockSize: 16, NowNs: 5 * sec}
	p.OnRouted(other, c, 0)
	if w, _ := p.windowed(c[0].ID, 6*sec); w != 1760 {
		t.Fatalf("window %v before", w)
	}
	p.Retract(req, c, 0)
	if w, _ := p.windowed(c[0].ID, 6*sec); w != 160 {
		t.Fatalf("window %v after the retraction, want the other request's 160", w)
	}
	p.Forget(c[0].ID)
	if p.w.Read(c[0].ID, 6*sec).Seen {
		t.Fatal("forgotten replica keeps its window")
	}
}

// Warm-up credit shapes the choice, never the accounting: a fully credited replica wins the
// pick, but its balance window records the whole prefill it will really do, and a retraction
// takes back exactly that. A window that recorded the credited 0 tokens would make a warming
// replica look idle to the bound while it prefilled everything it was sent.
func TestKVWarmupCreditIsNotSubtractedFromRealWork(t *testing.T) {
	p := newKVRig(Options{Seed: 1})
	c := fleetOf(2)
	c[0].PrefillTokens, c[1].PrefillTokens = 20, 20
	c[1].WarmupCredit = 1
	req := &Request{Keys: keys(seq(10)...), Tokens: 160, BlockSize: 16, NowNs: 5 * sec}
	i, _ := p.Pick(req, c)
	if i != 1 {
		t.Fatalf("picked %d; the credited replica should win", i)
	}
	if got := p.uncached(req, &c[1]); got != 0 {
		t.Fatalf("the choice's cost %v, want 0 with full credit", got)
	}
	p.OnRouted(req, c, i)
	if w, _ := p.windowed(c[1].ID, 6*sec); w != 160 {
		t.Fatalf("window %v after routing to the warming replica, want the 160 tokens it will prefill", w)
	}
	p.Retract(req, c, i)
	if w, _ := p.windowed(c[1].ID, 6*sec); w != 0 {
		t.Fatalf("window %v after the retraction, want 0", w)
	}
}

// The engine's waiting-request gauge (Candidate.Queue, scraped once a second) is not part of
// kv's cost: the requests it counts are already in the ledger's prefill ahead, exactly, and a
// stale sample kept a replica whose queue had gone out of the running until the next scrape.
func TestKVIgnoresTheScrapedWaitingGauge(t *testing.T) {
	p := newKVRig(Options{Seed: 1})
	req := &Request{Keys: keys(seq(6)...), Tokens: 96, BlockSize: 16, NowNs: sec}
	c := fleetOf(2)
	c[0].Queue = 10 // a stale sample: the ledger says a has nothing ahead
	c[1].PrefillTokens = 64
	if i, _ := p.Pick(req, c); i != 0 {
		t.Errorf("kv picked %d; b has 64 prefill tokens ahead and a none, whatever a's last scrape said", i)
	}
	ex := p.Explain(req, c)
	for _, term := range ex[0].Terms {
		if term.Name == "queue" {
			t.Errorf("kv explains a queue term %+v: the gauge is not part of its cost", term)
		}
	}
}
