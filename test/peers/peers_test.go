package peers

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
)

func cluster(t *testing.T) string { return fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t)) }

// threeRouters starts three clustered routers in front of es and waits until each sees the
// other two and is ready.
func threeRouters(t *testing.T, es []engine) []*router {
	t.Helper()
	ca, cb, cc := cluster(t), cluster(t), cluster(t)
	a := startRouter(t, "ra", es, ca)
	b := startRouter(t, "rb", es, cb, ca)
	c := startRouter(t, "rc", es, cc, ca, cb)
	rs := []*router{a, b, c}
	for _, r := range rs {
		testkit.WaitFor(t, 20*time.Second, r.id+" sees two peers and is ready", func() bool { return r.peers() == 2 && r.ready() })
	}
	return rs
}

// Through three routers: requests in flight on router A are in the load a decision on router B
// reads; killing A drops its share on the others within the peer timeout, and B and C keep
// routing, sharing their own load, with their index untouched.
func TestLoadSharedAndRouterKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvrouter and vllm-sim processes")
	}
	es := startEngines(t, 3, "--decode-ms-per-token", "20")
	rs := threeRouters(t, es)
	a, b, c := rs[0], rs[1], rs[2]

	// Six long requests on A (200 tokens at 20ms: 4s each).
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := a.completion(prompt(i, i, 64, 128), 200); err != nil {
				failed.Add(1)
			}
		}()
	}
	testkit.WaitFor(t, 5*time.Second, "A has six requests in flight", func() bool { own, _ := a.running(); return own == 6 })
	testkit.WaitFor(t, 2*time.Second, "B and C see A's six requests", func() bool {
		_, pb := b.running()
		_, pc := c.running()
		return pb == 6 && pc == 6
	})
	t.Logf("A's 6 requests seen by B and C as peer load")
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of A's requests failed", failed.Load())
	}
	testkit.WaitFor(t, 2*time.Second, "the share goes back to 0 when A's requests end", func() bool { _, pb := b.running(); return pb == 0 })

	// Keep two requests in flight on A and kill it: its share must go within the peer timeout.
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _, _ = a.completion(prompt(10+i, i, 64, 128), 400) }()
	}
	testkit.WaitFor(t, 5*time.Second, "B sees A's two requests", func() bool { _, pb := b.running(); return pb == 2 })
	before := b.index()
	a.p.kill()
	wg.Wait()
	killed := time.Now()
	testkit.WaitFor(t, 5*time.Second, "B and C drop the killed router's share", func() bool {
		_, pb := b.running()
		_, pc := c.running()
		return pb == 0 && pc == 0 && b.peers() == 1 && c.peers() == 1
	})
	t.Logf("killed router's share dropped by its peers %v after the kill (peer timeout 1s)", time.Since(killed).Round(10*time.Millisecond))
	after := b.index()
	for name, st := range before {
		if st[:5] != "exact" || after[name][:5] != "exact" {
			t.Fatalf("B's stream %s: before the kill %q, after %q; want exact throughout", name, st, after[name])
		}
	}
	// B and C still route, and still share with each other.
	if n := burst(t, []*router{b, c}, 20, 4, func(i int) []uint32 { return prompt(20+i%3, i, 64, 128) }, 4); n > 0 {
		t.Fatalf("%d requests failed through B and C after A was killed", n)
	}
	for i := range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _, _ = c.completion(prompt(30+i, i, 64, 128), 200) }()
	}
	testkit.WaitFor(t, 5*time.Second, "B sees C's requests", func() bool { _, pb := b.running(); return pb == 3 })
	wg.Wait()
}

// A router started after the engines' rings wrapped is ready, from a peer's snapshot, with an
// index equal to its peers' in under 5 s (the same blocks per replica and tier, compared through
// the snapshots the routers serve); without a peer it would be approximate (partial).
func TestStartAfterRingsWrapped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvrouter and vllm-sim processes")
	}
	es := startEngines(t, 3, "--kv-buffer-steps", "40", "--decode-ms-per-token", "1")
	ca, cb := cluster(t), cluster(t)
	a := startRouter(t, "ra", es, ca)
	b := startRouter(t, "rb", es, cb, ca)
	for _, r := range []*router{a, b} {
		testkit.WaitFor(t, 20*time.Second, r.id+" ready with a peer", func() bool { return r.peers() == 1 && r.ready() })
	}
	// Well over 40 batches per engine: every request stores blocks, evictions follow. How the
	// policy spreads the 12 prefixes decides how many batches each engine publishes, so rounds
	// of 240 requests go on (at most 4) until every engine is past seq 60.
	wrapped := func() (bool, string) {
		for _, e := range a.engines().Engines {
			if seq := e.Ranks[0].LastSeq; seq == nil || *seq < 60 {
				last := "none"
				if seq != nil {
					last = strconv.FormatUint(*seq, 10)
				}
				return false, e.Name + " at seq " + last
			}
		}
		return true, ""
	}
	for round := 0; ; round++ {
		if n := burst(t, []*router{a, b}, 240, 8, func(i int) []uint32 { return prompt(i%12, round*240+i, 48, 96) }, 1); n > 0 {
			t.Fatalf("%d warm-up requests failed", n)
		}
		ok, why := wrapped()
		if ok {
			break
		}
		if round == 3 {
			t.Fatalf("after %d requests, engine %s; the ring (40) has not wrapped", (round+1)*240, why)
		}
	}

	// Alone: the rings have wrapped, so the new router's streams are approximate (partial).
	alone := startRouter(t, "alone", es, "")
	testkit.WaitFor(t, 20*time.Second, "the lone router's streams settle", func() bool {
		for _, e := range alone.engines().Engines {
			if s := e.Ranks[0].Stream; s == "replaying" {
				return false
			}
		}
		return true
	})
	for _, e := range alone.engines().Engines {
		if rk := e.Ranks[0]; rk.Stream != "approximate" || !rk.Partial {
			t.Fatalf("lone router, engine %s: %s partial=%v; want approximate partial (the ring wrapped)", e.Name, rk.Stream, rk.Partial)
		}
	}

	t0 := time.Now()
	c := startRouter(t, "rc", es, cluster(t), ca, cb)
	testkit.WaitFor(t, 5*time.Second, "the new router is ready", c.ready)
	took := time.Since(t0)
	d := c.engines()
	if d.RouterPeers == nil || d.RouterPeers.SeededFrom == "" {
		t.Fatalf("new router did not start from a peer's snapshot: %+v", d.RouterPeers)
	}
	for _, e := range d.Engines {
		if rk := e.Ranks[0]; rk.Stream != "exact" || !rk.Seeded {
			t.Fatalf("new router, engine %s: %s seeded=%v; want exact from the snapshot", e.Name, rk.Stream, rk.Seeded)
		}
	}
	want, got := a.index(), c.index()
	for name := range want {
		if got[name] != want[name] {
			t.Fatalf("engine %s: new router %q, peer %q", name, got[name], want[name])
		}
	}
	// The same content, not only the same counts: each router's index as it exports it (the
	// snapshot it would serve a third), every replica's blocks per tier, at one seq.
	sa, sc := a.snapshot(), c.snapshot()
	if len(sa.Streams) != len(es) || sa.Blocks() == 0 {
		t.Fatalf("peer's snapshot holds %d streams, %d blocks; want %d streams with blocks", len(sa.Streams), sa.Blocks(), len(es))
	}
	if diff := indexDiff(sa, sc); diff != "" {
		t.Fatalf("new router's index differs from its peer's: %s", diff)
	}
	if diff := indexDiff(sa, b.snapshot()); diff != "" {
		t.Fatalf("the two first routers' indexes differ (the comparison's premise): %s", diff)
	}
	t.Logf("router started after the rings wrapped: ready with its peer's index in %v (from process start); index %v, %d blocks equal in content to both peers'",
		took.Round(time.Millisecond), got, sc.Blocks())
	if took > 5*time.Second {
		t.Fatalf("ready in %v, want under 5s", took)
	}
}

// tcpProxy relays to target until cut; while cut it closes every connection and refuses new
// ones, like a partition that resets connections.
type tcpProxy struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); p.partition() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if p.cut.Load() {
				c.Close()
				continue
			}
			u, err := net.DialTimeout("tcp", target, time.Second)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *tcpProxy) partition() {
	p.cut.Store(true)
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
}

func (p *tcpProxy) heal() { p.cut.Store(false) }

// A partition between two routers (their NATS route through a proxy that the test cuts): each
// drops the other's share after the peer timeout and keeps routing alone; when the network is
// back the route and the shared load return by themselves.
func TestPartitionBetweenRoutersHeals(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvrouter and vllm-sim processes")
	}
	es := startEngines(t, 2, "--decode-ms-per-token", "20")
	ca := cluster(t)
	a := startRouter(t, "ra", es, ca)
	px := newTCPProxy(t, ca)
	b := startRouter(t, "rb", es, cluster(t), px.ln.Addr().String())
	testkit.WaitFor(t, 20*time.Second, "the routers see each other", func() bool { return a.peers() == 1 && b.peers() == 1 })

	var wg sync.WaitGroup
	defer wg.Wait()
	inflight := func(n int) {
		for i := range n {
			wg.Add(1)
			go func() { defer wg.Done(); _, _, _ = a.completion(prompt(i, i, 32, 64), 300) }()
		}
	}
	inflight(2)
	testkit.WaitFor(t, 5*time.Second, "B sees A's requests", func() bool { _, pb := b.running(); return pb == 2 })

	px.partition()
	cut := time.Now()
	testkit.WaitFor(t, 5*time.Second, "both sides drop the other", func() bool {
		_, pb := b.running()
		return a.peers() == 0 && b.peers() == 0 && pb == 0
	})
	t.Logf("partition seen on both sides %v after the cut", time.Since(cut).Round(10*time.Millisecond))
	if n := burst(t, []*router{a, b}, 10, 2, func(i int) []uint32 { return prompt(40, i, 32, 64) }, 2); n > 0 {
		t.Fatalf("%d requests failed during the partition", n)
	}

	px.heal()
	healed := time.Now()
	testkit.WaitFor(t, 15*time.Second, "the route comes back", func() bool { return a.peers() == 1 && b.peers() == 1 })
	inflight(2)
	testkit.WaitFor(t, 5*time.Second, "B sees A's load again", func() bool { _, pb := b.running(); return pb >= 2 })
	t.Logf("partition healed: peers back %v after the network", time.Since(healed).Round(10*time.Millisecond))
}
