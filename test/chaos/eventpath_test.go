package chaos

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

// full reports whether the long cases run: `make chaos` sets KVROUTE_CHAOS_FULL=1; `make test`
// runs the bounded subset.
func full() bool { return os.Getenv("KVROUTE_CHAOS_FULL") == "1" }

const model, bs, gpuBlocks = "m", 16, 4096

// engine is one stand-in engine: HTTP (health that can be failed, /v1/models, /metrics with
// vLLM's cache_config_info) plus a kvtest publisher with a real ring, driven like a busy vLLM:
// every batch stores four two-block prompts and evicts the oldest past gpuBlocks.
type engine struct {
	t     *testing.T
	name  string
	http  *httptest.Server
	down  atomic.Bool
	pub   *kvtest.Publisher
	cache *kvtest.Cache
	seed  uint32
	order []uint64
}

func newEngine(t *testing.T, name string, seed uint32, ring int) *engine {
	t.Helper()
	e := &engine{t: t, name: name, seed: seed << 20}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		if e.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"` + model + `","object":"model"}]}`))
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "vllm:cache_config_info{block_size=\"%d\",engine=\"0\",num_gpu_blocks=\"%d\"} 1\n", bs, gpuBlocks)
	})
	e.http = httptest.NewServer(mux)
	t.Cleanup(e.http.Close)
	u, _ := url.Parse(e.http.URL)
	var err error
	if e.pub, err = kvtest.NewPublisher(kvtest.Options{Topic: "kv@" + u.Host + "@" + model, Ring: ring}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.pub.Close() })
	e.newProcess()
	return e
}

// newProcess: a new engine process behind the same addresses, seq from 0, empty cache and ring.
func (e *engine) newProcess() {
	e.pub.Restart()
	var err error
	if e.cache, err = kvtest.NewCache(blockkey.AlgoSHA256, "0", bs); err != nil {
		e.t.Fatal(err)
	}
	e.order = nil
}

func (e *engine) flag() string {
	return e.name + "=" + e.http.URL + ";events=" + e.pub.Endpoint() + ";replay=" + e.pub.ReplayEndpoint()
}

func (e *engine) batch() []kvwire.Event {
	var evs []kvwire.Event
	for range 4 {
		e.seed++
		tk := toks(e.seed, 2*bs)
		ev, err := e.cache.Store(tk, 0)
		if err != nil {
			e.t.Fatal(err)
		}
		evs = append(evs, ev)
		e.order = append(e.order, e.cache.Hashes(tk)...)
	}
	for len(e.order) > gpuBlocks-1 {
		ev, err := e.cache.Evict(e.order[0])
		if err != nil {
			e.t.Fatal(err)
		}
		e.order = e.order[1:]
		evs = append(evs, ev)
	}
	return evs
}

// publish sends n batches; lost ones only go to the ring (dropped on the way, or published
// while no SUB was connected).
func (e *engine) publish(n int, lost bool) {
	for range n {
		var err error
		if lost {
			_, err = e.pub.PublishLost(e.batch()...)
		} else {
			_, err = e.pub.Publish(e.batch()...)
		}
		if err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *engine) labels(extra ...string) []string {
	return append([]string{`engine="` + e.name + `"`, `rank="0"`}, extra...)
}

// converged waits until the router's replica holds as many GPU blocks as the engine and the
// stream is in state, and returns how long that took from t0.
func (r *router) converged(e *engine, state string, t0 time.Time, timeout time.Duration) time.Duration {
	r.t.Helper()
	want := float64(len(e.cache.Resident()))
	var n, s float64
	if !testkit.Until(timeout, func() bool {
		r.alive()
		n, _ = r.metric("kvroute_router_index_blocks_gpu", e.labels()...)
		s, _ = r.metric("kvroute_router_stream_state", e.labels(`state="`+state+`"`)...)
		return n == want && s == 1
	}) {
		r.t.Fatalf("%s: %v of %v blocks, state %s %v, after %v\n%s", e.name, n, want, state, s, timeout, tail(r.logs(), 3000))
	}
	return time.Since(t0)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// rssMiB is the router process's resident set (VmRSS) in MiB.
func (r *router) rssMiB() float64 {
	r.t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", r.cmd.Process.Pid))
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	r.t.Fatal("no VmRSS")
	return 0
}

func (r *router) ready() bool {
	resp, err := http.Get("http://" + r.api + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// startFor starts a router in front of es. Times measured from before it exclude the one-off
// build of the binary (kvrouterBin).
func startFor(t *testing.T, es ...*engine) *router {
	args := []string{"--model", model, "--block-size", "16"}
	for _, e := range es {
		args = append(args, "--engine", e.flag())
	}
	return startRouter(t, args...)
}

// A router (re)started in front of engines whose rings hold vLLM's default 10,000 batches
// (three engines in the full suite; one ring of 3,000 in the short one), live batches flowing
// meanwhile: ready at once, every replica exact and equal to its engine.
func TestRouterStartInFrontOfFullRings(t *testing.T) {
	n, ring, before := 1, 3000, 2900
	if full() {
		n, ring, before = 3, 10000, 9800
	}
	var es []*engine
	for i := range n {
		e := newEngine(t, fmt.Sprintf("e%d", i), uint32(i+1), ring)
		e.publish(before, false)
		es = append(es, e)
	}
	kvrouterBin(t)
	t0 := time.Now()
	r := startFor(t, es...)
	if !testkit.Until(10*time.Second-time.Since(t0), r.ready) {
		t.Fatal("not ready within 10 s")
	}
	readyAt := time.Since(t0)
	for range 100 {
		for _, e := range es {
			e.publish(1, false)
		}
		time.Sleep(2 * time.Millisecond)
	}
	var worst time.Duration
	for _, e := range es {
		worst = max(worst, r.converged(e, "exact", t0, 30*time.Second))
	}
	t.Logf("MEASURE router start, %d ring(s) of %d batches: ready %v, every replica exact and equal %v after start",
		n, ring, readyAt.Round(time.Millisecond), worst.Round(time.Millisecond))
	r.stop()
}

// A ring that wrapped before the router asked: approximate (partial), every ring block indexed.
func TestRouterStartInFrontOfWrappedRing(t *testing.T) {
	e := newEngine(t, "e", 7, 2000)
	e.publish(2600, false)
	kvrouterBin(t)
	t0 := time.Now()
	r := startFor(t, e)
	took := r.converged(e, "approximate", t0, 20*time.Second)
	t.Logf("MEASURE wrapped ring: approximate with every ring block %v after start", took.Round(time.Millisecond))

}

// Batches lost on the way, and a stall (the engine publishes into its ring only for a while):
// both are a gap in the seq, repaired from the ring within 2 s of the next batch.
func TestDroppedBatchesAndStall(t *testing.T) {
	e := newEngine(t, "e", 8, 10000)
	r := startFor(t, e)
	r.converged(e, "exact", time.Now(), 10*time.Second)
	for _, c := range []struct {
		what string
		lost int
		wait time.Duration
	}{{"dropped batches", 50, 0}, {"stall", 500, 2 * time.Second}} {
		e.publish(c.lost, true)
		time.Sleep(c.wait)
		t0 := time.Now()
		e.publish(1, false)
		took := r.converged(e, "exact", t0, 10*time.Second)
		t.Logf("MEASURE %s (%d batches): exact again %v after the next batch", c.what, c.lost, took.Round(time.Millisecond))
		if took > 2*time.Second {
			t.Errorf("%s: took %v, want within 2 s", c.what, took)
		}
	}
	// A gap older than the ring: inexact until the engine's cache is reset (AllBlocksCleared).
	small := newEngine(t, "s", 9, 20)
	small.publish(5, false)
	r2 := startFor(t, small)
	r2.converged(small, "exact", time.Now(), 10*time.Second)
	small.publish(40, true)
	small.publish(1, false)
	r2.waitMetric(10*time.Second, "inexact after a gap older than the ring", func(v float64) bool { return v == 1 },
		"kvroute_router_stream_state", small.labels(`state="inexact"`)...)
	t0 := time.Now()
	if _, err := small.pub.Publish(small.cache.Clear()); err != nil {
		t.Fatal(err)
	}
	small.order = nil
	took := r2.converged(small, "exact", t0, 10*time.Second)
	t.Logf("MEASURE AllBlocksCleared heals an inexact stream in %v", took.Round(time.Millisecond))
}

// kill -9 of the engine and a new process behind the same addresses, in both sequence cases:
// fewer batches than the old process (the seq goes back) and more, published while the SUB was
// away (the seq jumps). The health probe sees the engine down meanwhile; the old blocks stop
// counting as exact then and are gone within one probe interval (2 s) plus 1 s of its return.
func TestEngineKilledAndRestarted(t *testing.T) {
	for _, c := range []struct {
		name      string
		lost, liv int
	}{{"seq goes back", 0, 5}, {"seq jumps", 400, 1}, {"idle after return", 400, 0}} {
		t.Run(c.name, func(t *testing.T) {
			if !full() && c.name != "seq jumps" {
				t.Skip("KVROUTE_CHAOS_FULL=1 runs it (make chaos)")
			}
			e := newEngine(t, "e", 10, 10000)
			e.publish(100, false)
			r := startFor(t, e)
			r.converged(e, "exact", time.Now(), 10*time.Second)
			e.down.Store(true)
			t0 := time.Now()
			r.waitMetric(5*time.Second, "not exact once the probe fails", func(v float64) bool { return v == 0 },
				"kvroute_router_stream_state", e.labels(`state="exact"`)...)
			t.Logf("MEASURE engine down: not exact %v after /health failed", time.Since(t0).Round(time.Millisecond))
			e.newProcess()
			e.publish(c.lost, true)
			e.publish(c.liv, false)
			t1 := time.Now()
			e.down.Store(false)
			took := r.converged(e, "exact", t1, 10*time.Second)
			t.Logf("MEASURE engine restart (%s): new process mirrored exactly %v after its return", c.name, took.Round(time.Millisecond))
			if took > 3*time.Second {
				t.Errorf("took %v, want within one probe interval plus 1 s", took)
			}
		})
	}
}

// Poison and oversize frames, live and in the ring, with memory under attack: a publisher that
// claims a million blocks against a 4,096-block engine, and five 64 MiB frames. The router stays
// up, counts and skips, keeps its RSS within 64 MiB of the baseline, and converges.
func TestPoisonOversizeAndMemory(t *testing.T) {
	blocks, frames := 100_000, 2
	if full() {
		blocks, frames = 1_000_000, 5
	}
	e := newEngine(t, "e", 11, 10000)
	e.publish(50, false)
	// The claim, built before the router starts: prompts of 64 blocks each, never evicted.
	claim, err := kvtest.NewCache(blockkey.AlgoSHA256, "0", bs)
	if err != nil {
		t.Fatal(err)
	}
	var evs []kvwire.Event
	for i := range blocks / 64 {
		ev, err := claim.Store(toks(uint32(5_000_000+i), 64*bs), 0)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	r := startFor(t, e)
	r.converged(e, "exact", time.Now(), 10*time.Second)
	base := r.rssMiB()
	for _, ev := range evs {
		if _, err := e.pub.Publish(ev); err != nil {
			t.Fatal(err)
		}
	}
	evs = nil
	big := make([]byte, 64<<20)
	for range frames {
		if _, err := e.pub.PublishPayload(big); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pub.PublishPayload(kvtest.OversizedBlockSizeBatch()); err != nil {
		t.Fatal(err)
	}
	// The engine goes on publishing, as a serving one does, until every frame is counted: its
	// batches show any gap the lost connections left.
	testkit.Eventually(t, 60*time.Second, "oversize frames counted", func() error {
		if _, err := e.pub.Publish(); err != nil { // an empty batch
			t.Fatal(err)
		}
		r.alive()
		if v, _ := r.metric("kvroute_router_stream_too_large_total", e.labels()...); v != float64(frames) {
			return fmt.Errorf("%v of %d oversize frames counted\n%s", v, frames, tail(r.logs(), 3000))
		}
		return nil
	})
	peak := r.rssMiB()
	r.waitMetric(10*time.Second, "over the block limit counted", func(v float64) bool { return v >= 1 },
		"kvroute_router_stream_over_limit_total", e.labels()...)
	// The engine resets its cache (what a real one would do to come back from this): exact again.
	t0 := time.Now()
	if _, err := e.pub.Publish(e.cache.Clear()); err != nil {
		t.Fatal(err)
	}
	e.order = nil
	e.publish(5, false)
	took := r.converged(e, "exact", t0, 20*time.Second)
	after := r.rssMiB()
	t.Logf("MEASURE memory: %d claimed blocks, %d x 64 MiB frames: RSS %.0f MiB at baseline, %.0f after the frames, %.0f after; exact again %v after the reset",
		blocks, frames, base, peak, after, took.Round(time.Millisecond))
	if max(peak, after) > base+64 {
		t.Errorf("RSS %.0f MiB, more than 64 MiB over the baseline of %.0f", max(peak, after), base)
	}
	r.alive()
}

// Oversize and poison frames into an exact stream, live: each is counted and skipped, the
// batches around them applied, the stream stays exact (nothing is cleared).
func TestOversizeAndPoisonLive(t *testing.T) {
	e := newEngine(t, "e", 12, 10000)
	e.publish(20, false)
	r := startFor(t, e)
	r.converged(e, "exact", time.Now(), 10*time.Second)
	t0 := time.Now()
	if _, err := e.pub.PublishPayload(make([]byte, 64<<20)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pub.PublishPayload(kvtest.OversizedBlockSizeBatch()); err != nil {
		t.Fatal(err)
	}
	e.publish(3, false)
	r.waitMetric(20*time.Second, "oversize frame counted", func(v float64) bool { return v == 1 },
		"kvroute_router_stream_too_large_total", e.labels()...)
	took := r.converged(e, "exact", t0, 20*time.Second)
	if v, _ := r.metric("kvroute_router_stream_resets_total", e.labels()...); v != 0 {
		t.Fatalf("%v resets, want none", v)
	}
	t.Logf("MEASURE 64 MiB frame and poison batch live: skipped, exact and equal %v after the frame", took.Round(time.Millisecond))
}
