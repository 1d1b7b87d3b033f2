package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// Rolling update lag: how long after a router pod's SIGTERM the Service still sends it new
// connections (the endpoint change travelling to every node's proxy). The test's client keeps
// the stopping router in its endpoints this long; the router's drain delay must cover it.
const (
	rollLag        = time.Second
	rollDrainDelay = 2 * time.Second
	rollWorkers    = 6
)

// Two kvrouters sharing load (router/peers) in front of two vllm-sims, shared-prefix streamed
// traffic through a client that balances over the routers as a Service does (round robin over
// its endpoints; a stopping router leaves them rollLag after its SIGTERM, a new one joins once
// /readyz says ready), and a rolling update of both: stop A (SIGTERM), start A' (it bootstraps
// from B's snapshot), then the same for B. Asserted: no request fails before its first token,
// and no serving router's stream is other than exact for more than a second.
func TestRollingUpdateUnderLoad(t *testing.T) {
	var sims []*vllmsim.Sim
	var specs []string
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 2 {
		s, err := vllmsim.New(vllmsim.Config{KVEventsPort: -1, KVReplayPort: -1, PrefillTokensPerS: 20000, DecodeMsPerToken: 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		sims = append(sims, s)
		specs = append(specs, fmt.Sprintf("e%d=%s;events=%s;replay=%s", i, s.URL(), s.EventEndpoints()[0], s.ReplayEndpoints()[0]))
	}
	kvrouterBin(t)
	dir := t.TempDir()
	start := func(id string, routes ...string) *router {
		cfg := filepath.Join(dir, id+".yaml")
		y := fmt.Sprintf("peers:\n  id: %s\n  subject: kvroute.load.roll\n  clusterListen: 127.0.0.1:0\n  routes: [%s]\nshutdown:\n  drainDelay: %s\n  timeout: 10s\n",
			id, strings.Join(routes, ", "), rollDrainDelay)
		if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"--model", "vllm-sim", "--block-size", "16", "--config", cfg}
		for _, s := range specs {
			args = append(args, "--engine", s)
		}
		t0 := time.Now()
		r := startRouter(t, args...)
		if !testkit.Until(20*time.Second, r.ready) {
			t.Fatalf("router %s not ready within 20 s\n%s", id, tail(r.logs(), 3000))
		}
		t.Logf("MEASURE router %s ready %v after start", id, time.Since(t0).Round(time.Millisecond))
		return r
	}

	svc := &service{}
	a := start("a")
	b := start("b", a.cluster)
	svc.add(a)
	svc.add(b)
	w := newIndexWatch(len(specs))
	w.watch(a)
	w.watch(b)

	var res rollResults
	stopLoad := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: rollWorkers}}
	for i := range rollWorkers {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stopLoad:
					return
				default:
				}
				res.add(oneStream(client, svc.pick(), i*100000+n))
			}
		})
	}
	waitServed := func(min int64) {
		if !testkit.Until(30*time.Second, func() bool { return res.ok.Load() >= min }) {
			t.Fatalf("only %d requests answered", res.ok.Load())
		}
	}
	waitServed(30)

	roll := func(old *router, id string, peer *router) *router {
		// SIGTERM; the Service stops sending new connections rollLag later.
		_ = old.cmd.Process.Signal(syscall.SIGTERM)
		time.AfterFunc(rollLag, func() { svc.remove(old); w.unwatch(old) })
		t0 := time.Now()
		// Not ready at once (the Service's own cue), while it still serves what the lag sends.
		if !testkit.Until(rollLag, func() bool { return !old.ready() }) {
			t.Errorf("router still ready %v after SIGTERM", rollLag)
		}
		select {
		case <-old.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("router did not exit within 30 s of SIGTERM\n%s", tail(old.logs(), 3000))
		}
		if old.err != nil {
			t.Fatalf("router exited with %v\n%s", old.err, tail(old.logs(), 3000))
		}
		t.Logf("MEASURE router stopped %v after SIGTERM (drain delay %v)", time.Since(t0).Round(time.Millisecond), rollDrainDelay)
		nr := start(id, peer.cluster)
		if !strings.Contains(nr.logs(), "starting from a peer's snapshot") {
			t.Errorf("router %s did not start from its peer's snapshot\n%s", id, tail(nr.logs(), 3000))
		}
		svc.add(nr)
		w.watch(nr)
		waitServed(res.ok.Load() + 30)
		return nr
	}
	a2 := roll(a, "a2", b)
	b2 := roll(b, "b2", a2)
	close(stopLoad)
	wg.Wait()
	longest := w.stop()

	t.Logf("MEASURE rolling update of 2 routers under load: %d answered, %d failed before the first token, %d after; longest non-exact window on a serving router %v (%d stream samples)",
		res.ok.Load(), res.before.Load(), res.after.Load(), longest.Round(time.Millisecond), w.samples)
	if n := res.before.Load(); n > 0 {
		t.Errorf("%d requests failed before their first token, e.g. %v", n, res.firstErr.Load())
	}
	if longest > time.Second {
		t.Errorf("a serving router's index was not exact for %v, want at most 1 s", longest)
	}
	b2.stop()
	a2.stop()
}

// service is the client's view of a Kubernetes Service: round robin over its endpoints.
type service struct {
	mu  sync.Mutex
	eps []*router
	rr  int
}

func (s *service) add(r *router) { s.mu.Lock(); s.eps = append(s.eps, r); s.mu.Unlock() }

func (s *service) remove(r *router) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, e := range s.eps {
		if e == r {
			s.eps = append(s.eps[:i], s.eps[i+1:]...)
			return
		}
	}
}

func (s *service) pick() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rr++
	return s.eps[s.rr%len(s.eps)].api
}

type rollResults struct {
	ok, before, after atomic.Int64
	firstErr          atomic.Value
}

// outcome of one streamed request: "" answered; else whether it failed before its first token.
type outcome struct {
	err        string
	afterFirst bool
}

func (r *rollResults) add(o outcome) {
	switch {
	case o.err == "":
		r.ok.Add(1)
	case o.afterFirst:
		r.after.Add(1)
	default:
		r.before.Add(1)
		r.firstErr.CompareAndSwap(nil, o.err)
	}
}

// oneStream sends a streamed completion whose prompt shares one of four 128-token prefixes and
// reads it to [DONE].
func oneStream(c *http.Client, api string, n int) outcome {
	ids := strings.Trim(promptIDs(n%4, 128), "[]") + "," + strings.Trim(promptIDs(1000+n, 32), "[]")
	body := `{"model":"vllm-sim","max_tokens":16,"stream":true,"prompt":[` + ids + `]}`
	resp, err := c.Post("http://"+api+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return outcome{err: err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return outcome{err: fmt.Sprintf("status %d", resp.StatusCode)}
	}
	first := false
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		switch {
		case ok && data == "[DONE]":
			if !first {
				return outcome{err: "stream ended before its first token"}
			}
			return outcome{}
		case ok && strings.Contains(data, `"error"`):
			return outcome{err: data, afterFirst: first}
		case ok:
			first = true
		}
		if err != nil {
			return outcome{err: "stream cut: " + err.Error(), afterFirst: first}
		}
	}
}

// indexWatch samples the serving routers' stream states every 20 ms and keeps the longest time
// any (router, engine) stream spent other than exact while the router was serving.
type indexWatch struct {
	engines int
	mu      sync.Mutex
	since   map[*router][]time.Time // per engine: not exact since (zero: exact)
	longest time.Duration
	samples int
	done    chan struct{}
	stopped chan struct{}
}

func newIndexWatch(engines int) *indexWatch {
	w := &indexWatch{engines: engines, since: map[*router][]time.Time{}, done: make(chan struct{}), stopped: make(chan struct{})}
	go w.loop()
	return w
}

func (w *indexWatch) watch(r *router) {
	w.mu.Lock()
	w.since[r] = make([]time.Time, w.engines)
	w.mu.Unlock()
}

func (w *indexWatch) unwatch(r *router) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.close(r, time.Now())
	delete(w.since, r)
}

// close ends r's open windows at now (w.mu held).
func (w *indexWatch) close(r *router, now time.Time) {
	for e, s := range w.since[r] {
		if !s.IsZero() {
			w.longest = max(w.longest, now.Sub(s))
			w.since[r][e] = time.Time{}
		}
	}
}

func (w *indexWatch) loop() {
	defer close(w.stopped)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-t.C:
		}
		w.mu.Lock()
		rs := make([]*router, 0, len(w.since))
		for r := range w.since {
			rs = append(rs, r)
		}
		w.mu.Unlock()
		for _, r := range rs {
			states := make([]bool, w.engines)
			for e := range w.engines {
				v, ok := r.metric("kvroute_router_stream_state", fmt.Sprintf(`engine="e%d"`, e), `rank="0"`, `state="exact"`)
				states[e] = ok && v == 1
			}
			now := time.Now()
			w.mu.Lock()
			if s, ok := w.since[r]; ok {
				for e, exact := range states {
					switch {
					case exact && !s[e].IsZero():
						w.longest = max(w.longest, now.Sub(s[e]))
						s[e] = time.Time{}
					case !exact && s[e].IsZero():
						s[e] = now
					}
					w.samples++
				}
			}
			w.mu.Unlock()
		}
	}
}

// stop ends the watch and returns the longest non-exact window, open ones closed now.
func (w *indexWatch) stop() time.Duration {
	close(w.done)
	<-w.stopped
	w.mu.Lock()
	defer w.mu.Unlock()
	for r := range w.since {
		w.close(r, time.Now())
	}
	return w.longest
}
