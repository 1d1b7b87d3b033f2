package app

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// streamResult is what a client saw of one streamed request.
type streamResult struct {
	status    int
	tokens    int  // data events with a choice
	errEvent  bool // a data: {"error": ...} event
	done      bool // data: [DONE]
	readErr   error
	firstBody string
}

// clean: the whole answer. cut: tokens, then an error event and a broken connection. Anything
// else (an error without tokens, a truncated stream that ends cleanly, a non-200) is a failure.
func (r streamResult) clean() bool {
	return r.status == 200 && r.done && !r.errEvent && r.readErr == nil && r.tokens > 0
}
func (r streamResult) cut() bool {
	return r.status == 200 && r.tokens > 0 && r.errEvent && !r.done && r.readErr != nil
}

func postStream(url, body string) streamResult {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return streamResult{readErr: err}
	}
	defer resp.Body.Close()
	res := streamResult{status: resp.StatusCode}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		res.firstBody = string(b)
		return res
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		switch {
		case strings.HasPrefix(line, `data: {"error"`):
			res.errEvent = true
		case strings.HasPrefix(line, "data: [DONE]"):
			res.done = true
		case strings.HasPrefix(line, "data: {") && strings.Contains(line, `"choices":[{`):
			res.tokens++
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				res.readErr = err
			}
			return res
		}
	}
}

func streamPrompt(seed, n, maxTokens int) string {
	return strings.Replace(idsPrompt(seed, n, seed, 1, maxTokens), `{"model"`, `{"stream":true,"model"`, 1)
}

// An engine killed under streaming load, with vLLM's headers at acceptance and without: no
// request that had not received its first token fails (each is retried on another engine),
// and each one cut mid-stream ends with an error event and a broken connection, never as a
// clean, truncated success.
func TestKilledUnderStreamingLoad(t *testing.T) {
	for _, at := range []bool{false, true} {
		t.Run(fmt.Sprintf("headersAtAcceptance=%v", at), func(t *testing.T) {
			f := startPinnedFleet(t, 3, vllmsim.Config{TimeScale: 5, HoldHeaders: !at, SSEKeepAliveInterval: 20 * time.Millisecond,
				PrefillTokensPerS: 4000})
			rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
			const n = 60
			results := make([]streamResult, n)
			var wg sync.WaitGroup
			sem := make(chan struct{}, 12)
			killed := make(chan struct{})
			go func() {
				defer close(killed)
				// Kill it while some of its requests stream and others still wait for a token.
				testkit.WaitFor(t, waitBound, "streaming and waiting attempts on e1", func() bool {
					in := rt.s.Engines()[1].Ranks[0].Inflight
					return in.DecodeTokens > 0 && in.PrefillTokens > 0 && in.PrefillHeldTokens >= in.PrefillTokens
				})
				_ = f.sims[1].Close()
			}()
			for i := range n {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					results[i] = postStream(rt.api.URL+"/v1/completions", streamPrompt(60_000+i, 1200, 40))
				}()
			}
			wg.Wait()
			<-killed
			var clean, cut int
			for i, r := range results {
				switch {
				case r.clean():
					clean++
				case r.cut():
					cut++
				default:
					t.Errorf("request %d failed visibly wrong: %+v", i, r)
				}
			}
			// Every attempt on the killed engine, cut, retried or failed, gives back all it held:
			// /debug/engines shows nothing left in flight there, the prompts of requests that
			// never reached a first token included.
			testkit.WaitFor(t, waitBound, "nothing left in flight on the killed engine", func() bool {
				return rt.s.Engines()[1].Ranks[0].Inflight == Inflight{}
			})
			retries := testutil.ToFloat64(rt.s.met.Retries.WithLabelValues("e1"))
			t.Logf("clean %d, cut mid-stream %d, retried off the killed engine %v", clean, cut, retries)
			if retries+float64(cut) == 0 {
				t.Fatal("nothing was in flight on the killed engine: the test proved nothing")
			}
		})
	}
}

// With every engine failing after acceptance (an in-stream error before the first token), the
// client gets one HTTP error, not a 200 with an error inside; with one good engine left it gets a
// clean answer and the failed attempt is counted as a retry.
func TestInStreamErrorBeforeFirstTokenRetried(t *testing.T) {
	bad := startPinnedSim(t, vllmsim.Config{FailRate: 1})
	good := startPinnedSim(t, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("bad", bad), simEngine("good", good)}),
		func(o *Options) { o.Config.Policy = "round-robin" })
	for i := range 6 {
		r := postStream(rt.api.URL+"/v1/completions", streamPrompt(70_000+i, 64, 4))
		if !r.clean() {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	if n := testutil.ToFloat64(rt.s.met.EngineErrors.WithLabelValues("bad", "before_first_token")); n == 0 {
		t.Fatal("the bad engine's in-stream errors were not counted")
	}
	if n := testutil.ToFloat64(rt.s.met.Retries.WithLabelValues("bad")); n == 0 {
		t.Fatal("no retry counted")
	}
	rt2 := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("bad", bad)}), nil)
	r := postStream(rt2.api.URL+"/v1/completions", streamPrompt(70_100, 64, 4))
	if r.status != 500 || !strings.Contains(r.firstBody, `"error"`) {
		t.Fatalf("all engines failing: %+v", r)
	}
}

// An in-stream error after the first token (vLLM's own) is counted, logged and reaches the
// client as an error event and an aborted connection.
func TestInStreamErrorAfterFirstToken(t *testing.T) {
	sim := startPinnedSim(t, vllmsim.Config{StreamErrorAfter: 2})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("e0", sim)}), nil)
	r := postStream(rt.api.URL+"/v1/completions", streamPrompt(80_000, 64, 8))
	if !r.cut() {
		t.Fatalf("client saw %+v", r)
	}
	if n := testutil.ToFloat64(rt.s.met.EngineErrors.WithLabelValues("e0", "after_first_token")); n != 1 {
		t.Fatalf("engine errors counted %v", n)
	}
}

// failingFront serves a sim's render, models and health, but answers every generation 503.
func failingFront(t *testing.T, sim *vllmsim.Sim) string {
	h := sim.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" || r.URL.Path == "/v1/chat/completions" {
			http.Error(w, `{"error":{"message":"overloaded","type":"ServiceUnavailable","param":null,"code":503}}`, 503)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A failed attempt takes back its prediction: after a retry only the replica that served the
// request holds the prompt in the predicted side index.
func TestFailedAttemptRollsBack(t *testing.T) {
	bad, good := startSim(t, vllmsim.Config{KVEventsPort: 0}), startSim(t, vllmsim.Config{KVEventsPort: 0})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{{Name: "bad", URL: failingFront(t, bad), Ready: true},
		{Name: "good", URL: good.URL(), Ready: true}}), func(o *Options) { o.Config.Policy = "round-robin" })
	for i := range 4 {
		a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(90_000+i, 512, i, 1, 2))
		if a.status != 200 || a.header.Get("x-kvroute-engine") != "good" {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
	}
	// 4 prompts of 513 tokens: 32 blocks each, predicted on "good" only.
	if n := rt.s.ledger.Stats().Predicted; n != 4*32 {
		t.Fatalf("predicted side index holds %d entries, want %d (the failed attempts' taken back)", n, 4*32)
	}
	if testutil.ToFloat64(rt.s.met.Retries.WithLabelValues("bad")) == 0 {
		t.Fatal("no attempt went to the failing engine: the test proved nothing")
	}
}

// A pod that stops answering is excluded whole: with 4 DP ranks on the dead pod and 2
// attempts per request, every request still lands on the live engine, and after the first
// refused connection the dead pod stays out until an active probe has seen it again.
func TestDeadPodExcludedWhole(t *testing.T) {
	dead := startSim(t, vllmsim.Config{DataParallelSize: 4, KVEventsPort: -1})
	good := startSim(t, vllmsim.Config{KVEventsPort: 0})
	deadEng := simEngine("dead", dead)
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{deadEng, {Name: "good", URL: good.URL(), Ready: true}}), func(o *Options) {
		o.MaxAttempts = 2
		o.ProbeInterval = time.Hour
		o.Config.Events.Enabled = false
		o.Config.Policy = "round-robin"
	})
	_ = dead.Close()
	for i := range 10 {
		a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(95_000+i, 64, i, 1, 2))
		if a.status != 200 {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
	}
	if n := testutil.ToFloat64(rt.s.met.Retries.WithLabelValues("dead")); n != 1 {
		t.Fatalf("%v attempts went to the dead pod, want 1 (then it is out)", n)
	}
	var shown uint64 // /debug/engines shows the same count on the dead pod's ranks
	for _, e := range rt.s.Engines() {
		if e.Name == "dead" {
			for _, r := range e.Ranks {
				shown += r.Retries
			}
		}
	}
	if shown != 1 {
		t.Fatalf("/debug/engines shows %d retries on the dead pod, want 1", shown)
	}
	if rt.s.Engines()[0].Health.Healthy {
		t.Fatal("the dead pod is back without a probe")
	}
}

// A connection broken before the first token is the engine's HTTP server failing, shared by its
// DP ranks: the retry goes to another pod, not another rank of the same one.
func TestBrokenConnectionExcludesThePod(t *testing.T) {
	sim := startSim(t, vllmsim.Config{DataParallelSize: 4, KVEventsPort: -1})
	h := sim.Handler()
	var hits atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			hits.Add(1)
			panic(http.ErrAbortHandler) // the connection breaks before any answer
		}
		h.ServeHTTP(w, r)
	}))
	defer front.Close()
	good := startSim(t, vllmsim.Config{KVEventsPort: 0})
	broken := simEngine("broken", sim)
	broken.URL = front.URL
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{broken, {Name: "good", URL: good.URL(), Ready: true}}), func(o *Options) {
		o.MaxAttempts = 2
		o.Config.Events.Enabled = false
		o.Config.Policy = "round-robin"
	})
	for i := range 8 {
		if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(120_000+i, 64, i, 1, 2)); a.status != 200 {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
	}
	if hits.Load() == 0 {
		t.Fatal("no attempt reached the broken pod: the test proved nothing")
	}
}
