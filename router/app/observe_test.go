package app

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/fleet"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// Every counter the event pipeline keeps is on /metrics for each stream and in /debug/engines
// (kvevents' own test ties the counter table to every field of Stats), and last_event is shown
// only once the stream applied a batch.
func TestEveryStreamCounterOnMetricsAndDebug(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{KVEventsPort: 0, KVReplayPort: 0})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")

	ranks := rt.s.Engines()[0].Ranks
	if ranks[0].LastEvent != nil {
		t.Fatalf("last_event %v on a stream that has applied nothing", ranks[0].LastEvent)
	}
	resp, err := http.Get(rt.admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var dbg struct {
		Engines []struct {
			Ranks []struct {
				Counters map[string]uint64 `json:"counters"`
			} `json:"ranks"`
		} `json:"engines"`
	}
	resp, err = http.Get(rt.admin.URL + "/debug/engines")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewDecoder(resp.Body).Decode(&dbg); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range kvevents.CounterSpecs() {
		if !strings.Contains(string(body), "kvroute_router_"+c.Metric+`{engine="e0",rank="0"}`) {
			t.Errorf("/metrics lacks kvroute_router_%s for the stream (Stats.%s)", c.Metric, c.Field)
		}
		if _, ok := dbg.Engines[0].Ranks[0].Counters[c.Key]; !ok {
			t.Errorf("/debug/engines lacks counters.%s (Stats.%s)", c.Key, c.Field)
		}
	}

	postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 64, 0, 0, 2))
	testkit.WaitFor(t, waitBound, "last_event after the first batch", func() bool { return rt.s.Engines()[0].Ranks[0].LastEvent != nil })
}

// With the block size left to learn, requests are routed by load without keys (counted, with the
// reason on /debug/engines) until a validated event teaches it; then they are keyed, and the
// parity check runs at the learned size.
func TestBlockSizeLearnedBeforeKeying(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{KVEventsPort: 0, KVReplayPort: 0, BlockSize: 32}) // not the fallback 16
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) { o.Config.BlockSize = 0 })
	rt.waitStreams(t, "exact")
	unkeyed := func() float64 {
		return testutil.ToFloat64(rt.s.met.UnkeyedRequests.WithLabelValues("block_size_unknown"))
	}
	if bs, from := rt.s.blockSize(rt.s.reps()); bs != 0 || from != blockSizeUnknown {
		t.Fatalf("block size %d from %q before any event, want unknown", bs, from)
	}
	postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 64, 0, 0, 2))
	if n := unkeyed(); n != 1 {
		t.Fatalf("%v unkeyed requests, want the first one", n)
	}
	testkit.WaitFor(t, waitBound, "block size learned from events", func() bool {
		_, from := rt.s.blockSize(rt.s.reps())
		return from == blockSizeFromEvents
	})
	if bs, _ := rt.s.blockSize(rt.s.reps()); bs != 32 {
		t.Fatalf("learned %d, the engine's block size is 32", bs)
	}
	a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 64, 0, 0, 2))
	if n := unkeyed(); n != 1 {
		t.Fatalf("%v unkeyed requests after learning, want still 1", n)
	}
	if c := a.cachedTokens(t); c == 0 {
		t.Fatal("second identical prompt: no cached tokens reported")
	}
	st, _ := rt.s.sub.Stats("e0", 0)
	if st.ParityChecked == 0 || st.ParityMismatches != 0 {
		t.Fatalf("parity checked %d, mismatches %d: want it on at the learned size, agreeing", st.ParityChecked, st.ParityMismatches)
	}
}

// /debug/route is bounded: past debugRouteConcurrency calls in flight it answers 429 without
// asking an engine for anything.
func TestDebugRouteIsBounded(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	for range debugRouteConcurrency {
		rt.s.debugRouteSlots <- struct{}{} // calls in flight
	}
	resp, err := http.Post(rt.admin.URL+"/debug/route", "application/json", strings.NewReader(`{"model":"vllm-sim","prompt":"hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), "in flight") {
		t.Fatalf("status %d body %s; want 429 naming the bound", resp.StatusCode, body)
	}
	<-rt.s.debugRouteSlots
	resp, err = http.Post(rt.admin.URL+"/debug/route", "application/json", strings.NewReader(`{"model":"vllm-sim","prompt":"hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d with a slot free, want 200", resp.StatusCode)
	}
}

// Per-request fallbacks are logged once per reason and then at most once a minute (every one
// is counted on /metrics): an outage that fails every request is a line a minute, not a flood.
func TestFallbackLogsAreLimited(t *testing.T) {
	var buf syncBuf
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f := startFleet(t, 1, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		o.Now = clock
	})
	for range 5 {
		rt.s.logLimited("retry:e0/0:connect", "engine attempt failed", "why", "connect")
		rt.s.logLimited("tokenize:e0", "tokenization failed")
	}
	if n, m := strings.Count(buf.String(), "engine attempt failed"), strings.Count(buf.String(), "tokenization failed"); n != 1 || m != 1 {
		t.Fatalf("%d and %d lines for 5 fallbacks each, want 1 and 1:\n%s", n, m, buf.String())
	}
	mu.Lock()
	now = now.Add(fallbackLogEvery + time.Second)
	mu.Unlock()
	rt.s.logLimited("retry:e0/0:connect", "engine attempt failed", "why", "connect")
	if n := strings.Count(buf.String(), "engine attempt failed"); n != 2 {
		t.Fatalf("%d lines after a minute, want 2", n)
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Bound mode: a message whose topic names no engine is dropped and counted on /metrics and in
// /debug/engines (it belongs to no engine's counters).
func TestUnroutableTopicCounted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	sim := startSim(t, vllmsim.Config{KVEventsPort: -1})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{{Name: "b0", URL: sim.URL(), Ready: true}}), func(o *Options) { o.EventsBind = bind })
	pub, err := kvtest.NewPublisher(kvtest.Options{Topic: "kv@10.9.9.9@nobody", Connect: bind, NoReplay: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	testkit.WaitFor(t, waitBound, "an unroutable message counted", func() bool {
		_, _ = pub.PublishPayload([]byte("x")) // dropped by topic before decoding
		return rt.s.sub.Unroutable() > 0
	})
	if body := scrape(t, rt); !regexp.MustCompile(`(?m)^kvroute_router_events_unroutable_total [1-9]`).MatchString(body) {
		t.Fatalf("/metrics:\n%s", grepLines(body, "unroutable"))
	}
	resp, err := http.Get(rt.admin.URL + "/debug/engines")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var dbg struct {
		Unroutable uint64 `json:"events_unroutable"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&dbg); err != nil || dbg.Unroutable == 0 {
		t.Fatalf("/debug/engines events_unroutable %d (%v)", dbg.Unroutable, err)
	}
}

// Whether the engines honour kv_cache_report_mode "full" shows in blocks_reannounced: prefix hits
// re-announced by an engine that honours it (vllm-sim follows vLLM PR #45261), none without it.
func TestFullModeHonouredIsVisible(t *testing.T) {
	for _, full := range []bool{false, true} {
		sim := startSim(t, vllmsim.Config{})
		rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("e0", sim)}), func(o *Options) { o.FullReport = full })
		rt.waitStreams(t, "exact")
		body := idsPrompt(7, 64, 0, 0, 1)
		postJSON(t, rt.api.URL+"/v1/completions", body)
		testkit.WaitFor(t, waitBound, "the first request's blocks", func() bool { st, _ := rt.s.sub.Stats("e0", 0); return st.BlocksStored >= 4 })
		postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(7, 64, 1, 16, 1)) // the same 64 tokens, then one more block
		testkit.WaitFor(t, waitBound, "the second request's new block", func() bool { st, _ := rt.s.sub.Stats("e0", 0); return st.BlocksStored >= 5 })
		st, _ := rt.s.sub.Stats("e0", 0)
		if got := rt.s.Engines()[0].Ranks[0].Counters["blocks_reannounced"]; got != st.BlocksReannounced {
			t.Fatalf("/debug/engines blocks_reannounced %d, stats %d", got, st.BlocksReannounced)
		}
		if full && st.BlocksReannounced < 4 || !full && st.BlocksReannounced != 0 {
			t.Fatalf("full mode %v: %d blocks re-announced (stored %d)", full, st.BlocksReannounced, st.BlocksStored)
		}
		if m := regexp.MustCompile(`(?m)^kvroute_router_stream_blocks_reannounced_total\{engine="e0",rank="0"\} (\d+)`).FindStringSubmatch(scrape(t, rt)); m == nil || m[1] != fmt.Sprint(st.BlocksReannounced) {
			t.Fatalf("/metrics blocks_reannounced %v, stats %d", m, st.BlocksReannounced)
		}
	}
}

// Without event streams (--no-events, static engines) nothing else can teach the block size:
// the engine's own /metrics says it (vllm:cache_config_info's block_size label), so requests
// are keyed once the first page is read, instead of every one being routed by load.
func TestBlockSizeReadFromMetricsWithoutEvents(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{BlockSize: 32}) // not the fallback 16
	var logs syncBuf
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) {
		o.Config.BlockSize = 0
		o.Config.Events.Enabled = false
		o.ScrapeInterval = 50 * time.Millisecond
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	testkit.WaitFor(t, waitBound, "block size read from the engines' /metrics", func() bool {
		_, from := rt.s.blockSize(rt.s.reps())
		return from == blockSizeFromMetrics
	})
	if bs, _ := rt.s.blockSize(rt.s.reps()); bs != 32 {
		t.Fatalf("block size %d from /metrics, the engines' is 32", bs)
	}
	waitScrapes(t, rt, 4) // several more scrapes: still one line per replica
	if n := strings.Count(logs.String(), "block size read from the engine's /metrics"); n != 2 {
		t.Fatalf("%d log lines for the block size read from /metrics, want one per replica (2):\n%s", n, logs.String())
	}
	for range 3 {
		postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 256, 0, 0, 2))
	}
	if n := testutil.ToFloat64(rt.s.met.UnkeyedRequests.WithLabelValues("block_size_unknown")); n != 0 {
		t.Fatalf("%v requests routed without keys, want 0 once /metrics gave the block size", n)
	}
	// Keyed at the engines' size, the approximate index sends the repeats where the first went.
	seen := map[string]int{}
	for range 4 {
		a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 256, 0, 0, 2))
		seen[a.header.Get("x-kvroute-engine")]++
	}
	if len(seen) != 1 {
		t.Fatalf("one prompt repeated went to %v: want one engine (keyed, approximate index)", seen)
	}
}

// An engine with an event stream keeps the events' block size: the /metrics page's is only for
// replicas nothing else teaches.
func TestMetricsBlockSizeNotUsedBesideAStream(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{KVEventsPort: 0, KVReplayPort: 0, BlockSize: 32})
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) {
		o.Config.BlockSize = 0
		o.ScrapeInterval = 50 * time.Millisecond
	})
	rt.waitStreams(t, "exact")
	waitScrapes(t, rt, 6) // several scrapes
	if bs, from := rt.s.blockSize(rt.s.reps()); bs != 0 || from != blockSizeUnknown {
		t.Fatalf("block size %d from %q with a stream and no event yet, want unknown", bs, from)
	}
}

// waitScrapes waits until every replica's view has been published n+1 more times. Each /metrics
// page read publishes one; the one more covers a health sample (every 5 s by default), the only
// other publisher once discovery and the streams have settled.
func waitScrapes(t *testing.T, rt *router, n int) {
	t.Helper()
	reps := rt.s.reps()
	last, seen := make([]*fleet.View, len(reps)), make([]int, len(reps))
	for i, r := range reps {
		last[i] = r.View()
	}
	testkit.WaitFor(t, waitBound, fmt.Sprintf("%d scrapes of every engine", n), func() bool {
		done := true
		for i, r := range reps {
			if v := r.View(); v != last[i] {
				last[i], seen[i] = v, seen[i]+1
			}
			done = done && seen[i] > n
		}
		return done
	})
}
