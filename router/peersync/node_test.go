package peersync

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/blockkey"
)

// waitBound bounds every wait on a condition in this package's tests (a bound, not a wait).
const waitBound = 15 * time.Second

// testRouter is one router's load picture: local counters it publishes and the share of its
// peers it applies.
type testRouter struct {
	node  *Node
	share *Share
	mu    sync.Mutex
	local map[string]Load
}

func (r *testRouter) totals() []Total {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Total
	for rep, l := range r.local {
		out = append(out, Total{Replica: rep, Load: l})
	}
	return out
}

func (r *testRouter) route(req uint64, replica string, prefill int64) {
	r.mu.Lock()
	r.local[replica] = r.local[replica].Add(Load{Prefill: prefill, Running: 1})
	r.mu.Unlock()
	r.node.Record(Delta{Kind: Routed, Request: req, Replica: replica, Prefill: prefill, Tokens: prefill, Keys: []blockkey.Key{1, 2}})
}

func startRouter(t *testing.T, id string, routes ...string) *testRouter {
	t.Helper()
	r := &testRouter{share: NewShare(), local: map[string]Load{}}
	n, err := Start(Options{ID: id, ClusterListen: "127.0.0.1:0", Routes: routes, Sink: r.share, Totals: r.totals,
		Flush: 10 * time.Millisecond, Heartbeat: 100 * time.Millisecond, PeerTimeout: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r.node = n
	t.Cleanup(n.Close)
	return r
}

// Three embedded servers clustered over loopback routes: a request routed on one router is in
// the others' load within the flush interval; a router that stops is dropped by the others after
// the peer timeout.
func TestThreeRoutersShareLoad(t *testing.T) {
	a := startRouter(t, "a")
	b := startRouter(t, "b", a.node.ClusterAddr())
	c := startRouter(t, "c", a.node.ClusterAddr(), b.node.ClusterAddr())
	for _, r := range []*testRouter{a, b, c} {
		testkit.WaitFor(t, waitBound, "every router sees two peers", func() bool { return len(r.node.Peers()) == 2 })
	}
	a.route(1, "e0/0", 700)
	testkit.WaitFor(t, waitBound, "b and c see a's request", func() bool {
		return b.share.Of("e0/0") == (Load{Prefill: 700, Running: 1}) && c.share.Of("e0/0") == (Load{Prefill: 700, Running: 1})
	})
	c.route(2, "e0/0", 300)
	testkit.WaitFor(t, waitBound, "b sees both", func() bool { return b.share.Of("e0/0") == (Load{Prefill: 1000, Running: 2}) })
	if got := a.share.Of("e0/0"); got.Running > 1 {
		// a's share is its peers' only; its own request is local
		t.Fatalf("a counts its own request among its peers': %+v", got)
	}
	a.node.Close()
	testkit.WaitFor(t, waitBound, "a's share expires on b", func() bool { return b.share.Of("e0/0") == (Load{Prefill: 300, Running: 1}) })
	if per1k := c.node.SentBytesPer1kRouted(); per1k <= 0 {
		t.Fatalf("bytes per 1k routed: %v", per1k)
	}
}

// A routed change is published within RoutedFlush, not at the next Flush tick: with a 3 s tick,
// three routed requests in a row each reach the peer in well under a second (by the tick alone
// each would wait 1.5 s on average, all three under 300 ms one time in a thousand).
func TestRoutedChangeFlushesEarly(t *testing.T) {
	start := func(id string, routes ...string) *testRouter {
		r := &testRouter{share: NewShare(), local: map[string]Load{}}
		n, err := Start(Options{ID: id, ClusterListen: "127.0.0.1:0", Routes: routes, Sink: r.share, Totals: r.totals,
			Flush: 3 * time.Second, Heartbeat: 3 * time.Second, PeerTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		r.node = n
		t.Cleanup(n.Close)
		return r
	}
	a := start("a")
	b := start("b", a.node.ClusterAddr())
	testkit.WaitFor(t, waitBound, "a and b see each other", func() bool { return len(a.node.Peers()) == 1 && len(b.node.Peers()) == 1 })
	for i := range 3 {
		t0 := time.Now()
		a.route(uint64(10+i), "e0/0", 100)
		want := Load{Prefill: int64(100 * (i + 1)), Running: int64(i + 1)}
		testkit.WaitFor(t, waitBound, "b sees a's routed request", func() bool { return b.share.Of("e0/0") == want })
		if took := time.Since(t0); took > 300*time.Millisecond {
			t.Fatalf("routed change %d reached the peer after %v; want it well before the 3 s tick (RoutedFlush 2 ms)", i, took)
		}
	}
}

// proxy is a TCP relay that can be cut: while cut it closes every connection and refuses new
// ones (accepts and closes at once), like a network partition that resets.
type proxy struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); p.cutAll() })
	go p.serve()
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			c.Close()
			continue
		}
		u, err := net.DialTimeout("tcp", p.target, time.Second)
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
}

func (p *proxy) cutAll() {
	p.cut.Store(true)
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
}

// A partition between two routers (their route cut by a proxy): each drops the other's share
// after the peer timeout and decides on its own load; when the network is back the route is
// re-established by the router that dialled it and the shares return.
func TestPartitionHeals(t *testing.T) {
	a := startRouter(t, "a")
	px := newProxy(t, a.node.ClusterAddr())
	b := startRouter(t, "b", px.addr())
	testkit.WaitFor(t, waitBound, "b sees a", func() bool { return len(b.node.Peers()) == 1 && len(a.node.Peers()) == 1 })
	a.route(1, "e0/0", 100)
	testkit.WaitFor(t, waitBound, "b sees a's load", func() bool { return b.share.Of("e0/0").Running == 1 })

	px.cutAll()
	testkit.WaitFor(t, waitBound, "b drops a", func() bool { return len(b.node.Peers()) == 0 && b.share.Of("e0/0") == (Load{}) })
	testkit.WaitFor(t, waitBound, "a drops b", func() bool { return len(a.node.Peers()) == 0 })

	px.cut.Store(false)
	testkit.WaitFor(t, waitBound, "the route comes back", func() bool { return len(b.node.Peers()) == 1 && len(a.node.Peers()) == 1 })
	testkit.WaitFor(t, waitBound, "b sees a's load again", func() bool { return b.share.Of("e0/0").Running == 1 })
}

// Messages on the subject that are not batches are counted and dropped, never applied.
func TestForeignMessagesDropped(t *testing.T) {
	a := startRouter(t, "a")
	if err := a.node.nc.Publish(a.node.o.Subject, []byte("not a batch")); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, waitBound, "decode error counted", func() bool { return testutil.ToFloat64(a.node.met.decodeErrors) == 1 })
	if n := len(a.node.Peers()); n != 0 {
		t.Fatalf("%d peers from a foreign message", n)
	}
	// The same count for /debug/engines, and the kind logged once: a second one is not.
	if err := a.node.nc.Publish(a.node.o.Subject, []byte("nor this")); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, waitBound, "second decode error counted", func() bool { return a.node.Faults().DecodeErrors == 2 })
	if !a.node.logged[faultDecode].Load() || testutil.ToFloat64(a.node.met.decodeErrors) != 2 {
		t.Fatalf("decode errors: logged %v, metric %v", a.node.logged[faultDecode].Load(), testutil.ToFloat64(a.node.met.decodeErrors))
	}
}

// A cluster port already taken fails the start at once with NATS's own reason, not after the
// 10 s start bound with none.
func TestClusterPortTakenFailsWithItsReason(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	r := &testRouter{share: NewShare(), local: map[string]Load{}}
	t0 := time.Now()
	n, err := Start(Options{ID: "taken", ClusterListen: ln.Addr().String(), Sink: r.share, Totals: r.totals})
	if err == nil {
		n.Close()
		t.Fatal("started on a taken cluster port")
	}
	if took := time.Since(t0); took > 5*time.Second || !strings.Contains(err.Error(), "router port") {
		t.Fatalf("after %v: %v; want NATS's reason (router port ... in use) well before the 10 s bound", took, err)
	}
	t.Logf("%v after %v", err, time.Since(t0).Round(time.Millisecond))
}

// stalledNATS is a NATS server that completes the handshake and then never reads again: a
// server or network that hangs. Every connection it accepts stays open until the test ends.
func stalledNATS(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	port := ln.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(4096) // fill the client's window sooner
			}
			go func() {
				fmt.Fprintf(c, "INFO {\"server_id\":\"stalled\",\"version\":\"2.10.0\",\"go\":\"go1\",\"host\":\"127.0.0.1\",\"port\":%d,\"max_payload\":1048576,\"proto\":1,\"headers\":true}\r\n", port)
				rd := bufio.NewReader(c)
				for {
					line, err := rd.ReadString('\n')
					if err != nil {
						return
					}
					if strings.HasPrefix(line, "PING") {
						fmt.Fprint(c, "PONG\r\n")
						return // and never read again
					}
				}
			}()
		}
	}()
	return "nats://" + ln.Addr().String()
}

// Record is on the request path: it must not wait while the flusher is stuck in NATS. Against a
// server that stops reading, the flusher's writes block until publishTimeout fails them; a
// router recording a change every millisecond meanwhile never waits more than a fraction of
// that. Before, flush held the lock Record takes across nc.Publish, so every decision waited for
// the stalled write (up to nats.go's default minute).
func TestRecordNeverWaitsForAStalledServer(t *testing.T) {
	// Big totals (about 600 kB a batch) fill the socket buffers within a few flushes.
	big := make([]Total, 20_000)
	for i := range big {
		big[i] = Total{Replica: fmt.Sprintf("engine-%06d/0", i), Load: Load{Prefill: 1 << 40, Decode: 1 << 40, Running: 1 << 20}}
	}
	n, err := Start(Options{ID: "r", URL: stalledNATS(t), Sink: NewShare(), Totals: func() []Total { return big },
		Flush: 10 * time.Millisecond, Heartbeat: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var worst time.Duration
	deadline := time.Now().Add(15 * time.Second)
	for i := uint64(0); n.Faults().PublishErrors == 0; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("no publish error in 15 s against a server that never reads (worst Record %v)", worst)
		}
		t0 := time.Now()
		n.Record(Delta{Kind: Routed, Request: i, Replica: "e0/0", Prefill: 10, Tokens: 10})
		worst = max(worst, time.Since(t0))
		time.Sleep(time.Millisecond)
	}
	t.Logf("first publish error after the stall; worst Record meanwhile %v", worst)
	if worst > publishTimeout/4 {
		t.Fatalf("a Record waited %v while the flusher was stalled; want well under %v", worst, publishTimeout)
	}
}

// A peer's batch delivered again (or behind a newer one) is counted, shown in Faults, logged
// once and not applied: applying it would count its routed requests twice in the balance
// windows. A gap after it is still a loss.
func TestStaleBatchCountedNotApplied(t *testing.T) {
	a := startRouter(t, "a")
	send := func(seq uint64, prefill int64) {
		b := Batch{Peer: "b", Epoch: 7, Seq: seq, Sent: time.Now().UnixNano(),
			Totals: []Total{{Replica: "e0/0", Load: Load{Prefill: prefill}}}}
		if err := a.node.nc.Publish(a.node.o.Subject, EncodeBatch(nil, &b)); err != nil {
			t.Fatal(err)
		}
	}
	send(5, 100)
	testkit.WaitFor(t, waitBound, "the peer's first batch", func() bool { return a.share.Of("e0/0").Prefill == 100 })
	send(5, 999) // delivered again
	send(4, 999) // behind
	testkit.WaitFor(t, waitBound, "two stale batches counted", func() bool { return a.node.Faults().StaleBatches == 2 })
	if got := testutil.ToFloat64(a.node.met.stale); got != 2 || !a.node.logged[faultStale].Load() {
		t.Fatalf("stale batches: metric %v, logged %v", got, a.node.logged[faultStale].Load())
	}
	send(7, 300) // seq 6 never came
	testkit.WaitFor(t, waitBound, "the newer batch applied", func() bool { return a.share.Of("e0/0").Prefill == 300 })
	if f := a.node.Faults(); f.LostBatches != 1 || f.StaleBatches != 2 {
		t.Fatalf("faults %+v, want 1 lost and 2 stale", f)
	}
}
