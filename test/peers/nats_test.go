package peers

import (
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvroute/kvroute/internal/testkit"
)

// startNATS runs a NATS server in the test process on 127.0.0.1 (port -1: the kernel picks) and
// returns it once it takes connections; the test's end shuts it down.
func startNATS(t *testing.T, port int) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true, MaxPayload: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		t.Fatalf("NATS server on port %d not up in 10s", port)
	}
	t.Cleanup(ns.Shutdown)
	return ns
}

// Two routers on an external NATS server (peers.url, nothing embedded) share their load. When
// the server goes away they keep deciding without waiting for it (each request as quick as
// before), count the failed publishes, and drop each other's share after the peer timeout;
// when it comes back on the same address they reconnect by themselves and share again.
func TestExternalNATSGoesAndComesBack(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvrouter and vllm-sim processes")
	}
	ns := startNATS(t, -1)
	port := ns.Addr().(*net.TCPAddr).Port
	o := routerOpts{natsURL: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	es := startEngines(t, 2, "--decode-ms-per-token", "20")
	a := startRouterOpts(t, "ra", es, "", o)
	b := startRouterOpts(t, "rb", es, "", o)
	for _, r := range []*router{a, b} {
		testkit.WaitFor(t, 20*time.Second, r.id+" sees its peer through the external server and is ready", func() bool { return r.peers() == 1 && r.ready() })
	}
	if d := a.engines(); d.RouterPeers.Routes != 0 {
		t.Fatalf("ra holds %d NATS routes; with an external server it embeds none", d.RouterPeers.Routes)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	inflight := func(n int) {
		for i := range n {
			wg.Add(1)
			go func() { defer wg.Done(); _, _, _ = a.completion(prompt(i, i, 32, 64), 150) }() // 3 s each
		}
	}
	inflight(2)
	testkit.WaitFor(t, 5*time.Second, "rb sees ra's two requests", func() bool { _, pb := b.running(); return pb == 2 })

	// timed sends short requests through both routers one at a time and returns their times.
	timed := func(base int) []time.Duration {
		var out []time.Duration
		for i := range 10 {
			r := []*router{a, b}[i%2]
			t0 := time.Now()
			if _, _, err := r.completion(prompt(100+i%3, base+i, 32, 64), 1); err != nil {
				t.Fatalf("request %d through %s: %v", i, r.id, err)
			}
			out = append(out, time.Since(t0))
		}
		slices.Sort(out)
		return out
	}
	before := timed(0)

	ns.Shutdown()
	down := time.Now()
	during := timed(100)
	testkit.WaitFor(t, 5*time.Second, "both routers count failed publishes and drop the other's share", func() bool {
		_, pb := b.running()
		return pb == 0 && a.peers() == 0 && b.peers() == 0 &&
			a.metric("kvroute_router_peer_sync_publish_errors_total") > 0 && b.metric("kvroute_router_peer_sync_publish_errors_total") > 0
	})
	t.Logf("server gone: peers dropped and publish errors counted %v after; requests meanwhile %v (max), before %v (max)",
		time.Since(down).Round(10*time.Millisecond), during[len(during)-1].Round(time.Millisecond), before[len(before)-1].Round(time.Millisecond))
	// A decision that waited for the server would wait out the client's reconnect wait or its
	// write timeout (1 s each); the bound leaves room for a loaded machine (twice the slowest
	// request before the outage) and none comes near it.
	if worst, limit := during[len(during)-1], max(time.Second, 2*before[len(before)-1]); worst > limit {
		t.Fatalf("a request took %v while the NATS server was down (over %v; before: %v); the decisions waited on it", worst, limit, before)
	}
	if d := a.engines(); d.RouterPeers.SyncFaults.PublishErrors == 0 {
		t.Fatalf("ra's /debug/engines shows no publish error while the server was down: %+v", d.RouterPeers.SyncFaults)
	}

	startNATS(t, port)
	back := time.Now()
	testkit.WaitFor(t, 10*time.Second, "the routers find each other again", func() bool { return a.peers() == 1 && b.peers() == 1 })
	wg.Wait()
	inflight(2)
	testkit.WaitFor(t, 5*time.Second, "rb sees ra's load again", func() bool { _, pb := b.running(); return pb == 2 })
	t.Logf("server back: sharing again %v after it listened", time.Since(back).Round(10*time.Millisecond))
}
