package app

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/degraded"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// noHealthLoop keeps the background health loop out of tests that drive healthTick with their
// own clock.
func noHealthLoop(o *Options) { o.HealthInterval = time.Hour }

func reasonsOf(rt *router, replica string) []degraded.Reason {
	var out []degraded.Reason
	for _, st := range rt.s.Degraded()[replica] {
		out = append(out, st.Reason)
	}
	return out
}

func hasReason(rt *router, replica string, r degraded.Reason) bool {
	for _, x := range reasonsOf(rt, replica) {
		if x == r {
			return true
		}
	}
	return false
}

// A sim hashing with another PYTHONHASHSEED than the router's fails the parity check: the replica
// is reported hash-mismatch on /debug/engines and /metrics, and not demoted (a parity mismatch
// alone does not prove its keys wrong). The healthy peer is not degraded.
func TestDegradedHashMismatch(t *testing.T) {
	good := startSim(t, vllmsim.Config{KVEventsPort: 0})
	bad := startSim(t, vllmsim.Config{KVEventsPort: 0, HashSeed: "7"})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("e0", good), simEngine("e1", bad)}), noHealthLoop)
	rt.waitStreams(t, "exact")
	t0 := time.Now()
	rt.s.healthTick(t0)
	for i := range 40 {
		postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(100+i, 64, 0, 0, 1))
	}
	testkit.WaitFor(t, waitBound, "a parity mismatch counted", func() bool {
		st, _ := rt.s.sub.Stats("e1", 0)
		return st.ParityMismatches > 0
	})
	rt.s.healthTick(t0.Add(5 * time.Second))
	if !hasReason(rt, "e1/0", degraded.HashMismatch) || len(reasonsOf(rt, "e0/0")) != 0 {
		t.Fatalf("degraded %+v", rt.s.Degraded())
	}
	ri := rt.s.Engines()[1].Ranks[0]
	if ri.Demoted || ri.Scoring != "exact" || len(ri.Degraded) != 1 || ri.Degraded[0].Detail == "" || !ri.Degraded[0].Since.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("rank info %+v", ri)
	}
	body := scrape(t, rt)
	if !strings.Contains(body, `kvroute_router_replica_degraded{engine="e1",rank="0",reason="hash-mismatch"} 1`) ||
		!strings.Contains(body, `kvroute_router_replica_degraded{engine="e0",rank="0",reason="hash-mismatch"} 0`) {
		t.Fatalf("/metrics lacks replica_degraded:\n%s", grepLines(body, "replica_degraded"))
	}
	// The window passes without a new mismatch: the reason ends.
	rt.s.healthTick(t0.Add(70 * time.Second))
	rt.s.healthTick(t0.Add(71 * time.Second))
	if len(reasonsOf(rt, "e1/0")) != 0 {
		t.Fatalf("still degraded: %+v", rt.s.Degraded())
	}
}

// A publisher whose payloads do not decode makes the replica undecodable.
func TestDegradedUndecodable(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	u, _ := url.Parse(sim.URL())
	pub, err := kvtest.NewPublisher(kvtest.Options{Topic: "kv@" + u.Host + "@m", NoReplay: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	e := discovery.Engine{Name: "e0", URL: sim.URL(), Events: []string{pub.Endpoint()}, Ready: true}
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{e}), func(o *Options) { noHealthLoop(o); o.Model = "m" })
	if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	rt.s.healthTick(t0)
	testkit.WaitFor(t, waitBound, "decode errors", func() bool {
		_, _ = pub.PublishPayload([]byte("not msgpack at all"))
		st, _ := rt.s.sub.Stats("e0", 0)
		return st.DecodeErrors > 0
	})
	rt.s.healthTick(t0.Add(5 * time.Second))
	if !hasReason(rt, "e0/0", degraded.Undecodable) {
		t.Fatalf("degraded %+v", rt.s.Degraded())
	}
}

// An event endpoint nobody publishes on, with too few requests routed there for the evidence of
// degraded.QuietRequests (one, of four blocks), is no-events once degraded.QuietWindow passed
// without a message; before, it is not.
func TestDegradedNoEvents(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	e := discovery.Engine{Name: "e0", URL: sim.URL(), Events: []string{"tcp://127.0.0.1:9"}, Ready: true}
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{e}), noHealthLoop)
	t0 := time.Now()
	rt.s.healthTick(t0)
	postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 64, 0, 0, 1))
	rt.s.healthTick(t0.Add(30 * time.Second))
	if len(reasonsOf(rt, "e0/0")) != 0 {
		t.Fatalf("degraded before a whole window: %+v", rt.s.Degraded())
	}
	rt.s.healthTick(t0.Add(degraded.QuietWindow))
	if !hasReason(rt, "e0/0", degraded.NoEvents) {
		t.Fatalf("degraded %+v", rt.s.Degraded())
	}
}

// The same silent endpoint with requests that publish nothing in vLLM (shorter than a block,
// so no full block is stored) is not no-events, however long: an idle or cache-neutral replica
// must not look broken.
func TestSubBlockRequestsAreNotNoEvents(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	e := discovery.Engine{Name: "e0", URL: sim.URL(), Events: []string{"tcp://127.0.0.1:9"}, Ready: true}
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{e}), noHealthLoop)
	t0 := time.Now()
	rt.s.healthTick(t0)
	for i := range 2 * degraded.QuietRequests {
		postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(20+i, 15, 0, 0, 1)) // 15 tokens: under one 16-token block
	}
	for sec := 5; sec <= 2*int(degraded.Window/time.Second); sec += 5 {
		rt.s.healthTick(t0.Add(time.Duration(sec) * time.Second))
	}
	if r := reasonsOf(rt, "e0/0"); len(r) != 0 {
		t.Fatalf("requests shorter than a block degraded the replica: %v", r)
	}
	if n := rt.s.reps()[0].C.Routed.Load(); n != 2*degraded.QuietRequests {
		t.Fatalf("%d requests routed, want %d", n, 2*degraded.QuietRequests)
	}
}

// An engine that keeps serving but stopped publishing is no-events at the first sample after
// QuietRequests block-sized requests (not a whole window later), and no longer once its held
// batches arrive. The router's stale mark and the reason share the count.
func TestDegradedNoEventsOnEvidence(t *testing.T) {
	if kvevents.QuietHits != degraded.QuietRequests {
		t.Fatalf("kvevents.QuietHits %d and degraded.QuietRequests %d must agree: the reason reports the stale evidence", kvevents.QuietHits, degraded.QuietRequests)
	}
	sim := startSim(t, vllmsim.Config{})
	clk := &fakeClock{}
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("e0", sim)}), func(o *Options) { noHealthLoop(o); o.Now = clk.now })
	t0 := time.Now()
	rt.s.healthTick(t0)
	postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 64, 0, 0, 1))
	testkit.WaitFor(t, waitBound, "the first batch applied", func() bool { st, _ := rt.s.sub.Stats("e0", 0); return st.Applied > 0 })
	rt.s.healthTick(t0.Add(5 * time.Second))
	if r := reasonsOf(rt, "e0/0"); len(r) != 0 {
		t.Fatalf("healthy stream degraded: %v", r)
	}
	sim.SetEventsStalled(true)
	clk.advance(kvevents.QuietAfter) // each quiet request must come kvevents.QuietAfter past the last applied batch
	for i := range degraded.QuietRequests {
		postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(10+i, 64, 0, 0, 1))
	}
	rt.s.healthTick(t0.Add(10 * time.Second))
	if !hasReason(rt, "e0/0", degraded.NoEvents) {
		t.Fatalf("degraded %+v after %d requests with no events", rt.s.Degraded(), degraded.QuietRequests)
	}
	sim.SetEventsStalled(false)
	testkit.WaitFor(t, waitBound, "the held batches", func() bool { st, _ := rt.s.sub.Stats("e0", 0); return st.Applied > 1 })
	rt.s.healthTick(t0.Add(15 * time.Second))
	if hasReason(rt, "e0/0", degraded.NoEvents) {
		t.Fatalf("still no-events after the batches arrived: %+v", rt.s.Degraded())
	}
}

// A prompt served again wholly from the prefix cache publishes nothing in incremental mode
// (vLLM stores no new block for it), so repeats of it, however many and however long after the
// last batch, are no evidence of a silent publisher: the replica stays exact and not degraded.
func TestRepeatedCachedPromptIsNotNoEvents(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	clk := &fakeClock{}
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("e0", sim)}), func(o *Options) { noHealthLoop(o); o.Now = clk.now })
	t0 := time.Now()
	rt.s.healthTick(t0)
	prompt := idsPrompt(3, 64, 1, 6, 1) // 70 tokens: a repeat hits all four full blocks, stores none
	postJSON(t, rt.api.URL+"/v1/completions", prompt)
	testkit.WaitFor(t, waitBound, "the first batch applied", func() bool { st, _ := rt.s.sub.Stats("e0", 0); return st.Applied > 0 })
	clk.advance(kvevents.QuietAfter) // past the last applied batch, as a silent publisher's requests would be
	for range 2 * degraded.QuietRequests {
		postJSON(t, rt.api.URL+"/v1/completions", prompt)
	}
	rt.s.healthTick(t0.Add(10 * time.Second))
	if r := reasonsOf(rt, "e0/0"); len(r) != 0 {
		t.Fatalf("repeats of a cached prompt degraded the replica: %v", r)
	}
	if st, _ := rt.s.sub.Stats("e0", 0); st.State != kvevents.Exact {
		t.Fatalf("stream %v after repeats of a cached prompt; want exact", st.State)
	}
}

// Render calls failing with 5xx make the engine tokenizer-failing; a client 4xx on render does
// not count.
func TestDegradedTokenizerFailing(t *testing.T) {
	var renderStatus atomic.Int32
	renderStatus.Store(http.StatusServiceUnavailable)
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/health":
		case r.URL.Path == "/v1/models":
			_, _ = io.WriteString(w, `{"data":[{"id":"m"}]}`)
		case strings.HasSuffix(r.URL.Path, "/render") || r.URL.Path == "/tokenize":
			http.Error(w, "render says no", int(renderStatus.Load()))
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[{"text":"x"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
		}
	}))
	t.Cleanup(fake.Close)
	e := discovery.Engine{Name: "e0", URL: fake.URL, Ready: true}
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{e}), noHealthLoop)
	t0 := time.Now()
	rt.s.healthTick(t0)
	renderStatus.Store(http.StatusBadRequest)
	postJSON(t, rt.api.URL+"/v1/completions", `{"model":"m","prompt":"a client's bad prompt"}`)
	rt.s.healthTick(t0.Add(5 * time.Second))
	if len(reasonsOf(rt, "e0/0")) != 0 {
		t.Fatalf("a client 4xx on render degraded the engine: %+v", rt.s.Degraded())
	}
	renderStatus.Store(http.StatusServiceUnavailable)
	postJSON(t, rt.api.URL+"/v1/completions", `{"model":"m","prompt":"hello there"}`)
	rt.s.healthTick(t0.Add(10 * time.Second))
	if !hasReason(rt, "e0/0", degraded.TokenizerFailing) {
		t.Fatalf("degraded %+v", rt.s.Degraded())
	}
}

// Evidence that a replica's keys are wrong (the engine reports far fewer cached tokens than the
// exact index predicted) demotes it to approximate scoring until the window passes clean.
func TestDegradedKeysWrongDemotes(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{KVEventsPort: 0})
	rt := startRouter(t, discovery.NewStatic(f.engines()), noHealthLoop)
	rt.waitStreams(t, "exact")
	t0 := time.Now()
	rt.s.healthTick(t0)
	r := rt.s.reps()[0]
	r.C.ExactPredicted.Add(8192)
	r.C.ExactActual.Add(100)
	rt.s.healthTick(t0.Add(5 * time.Second))
	if !hasReason(rt, "e0/0", degraded.KeysWrong) || !r.View().Demoted || rt.s.exactStream(r) {
		t.Fatalf("not demoted: %+v", rt.s.Degraded())
	}
	if ri := rt.s.Engines()[0].Ranks[0]; !ri.Demoted || ri.Scoring != "approximate" {
		t.Fatalf("rank info %+v", ri)
	}
	rt.s.healthTick(t0.Add(70 * time.Second))
	rt.s.healthTick(t0.Add(71 * time.Second))
	if r.View().Demoted || !rt.s.exactStream(r) {
		t.Fatal("still demoted after a clean window")
	}
}

// keys-wrong provoked through real events (a ZMQ publisher, msgpack batches) rather than set
// counters: (1) the events announce blocks the engine does not hold, so the engine reports far
// fewer cached tokens than the exact index predicted; (2) stored events that cannot be
// re-keyed (one token short of their blocks). Either demotes the replica to approximate
// scoring at the next sample, on /debug/engines and /metrics.
func TestKeysWrongProvokedByEvents(t *testing.T) {
	promptOf := func(toks []uint32) string {
		ids := make([]string, len(toks))
		for i, x := range toks {
			ids[i] = fmt.Sprint(x)
		}
		return `{"model":"m","max_tokens":1,"prompt":[` + strings.Join(ids, ",") + `]}`
	}
	check := func(t *testing.T, rt *router, wantDetail string) {
		t.Helper()
		var detail string
		for _, st := range rt.s.Degraded()["e0/0"] {
			if st.Reason == degraded.KeysWrong {
				detail = st.Detail
			}
		}
		if !strings.Contains(detail, wantDetail) {
			t.Fatalf("degraded %+v: want keys-wrong with %q", rt.s.Degraded(), wantDetail)
		}
		if ri := rt.s.Engines()[0].Ranks[0]; !ri.Demoted || ri.Scoring != "approximate" {
			t.Fatalf("rank info demoted %v scoring %s", ri.Demoted, ri.Scoring)
		}
		if body := scrape(t, rt); !strings.Contains(body, `kvroute_router_replica_degraded{engine="e0",rank="0",reason="keys-wrong"} 1`) {
			t.Fatalf("/metrics:\n%s", grepLines(body, "replica_degraded"))
		}
	}
	t.Run("engine reports far fewer cached tokens", func(t *testing.T) {
		rt, pub, cache := pubRouter(t, kvtest.Options{NoReplay: true}, nil)
		t0 := time.Now()
		rt.s.healthTick(t0)
		// Six 256-token prompts the events say are cached; the engine (the simulator, which
		// never saw them) computes them from scratch and says so in usage.
		var prompts [][]uint32
		for i := range 6 {
			toks := tokensFrom(300+i, 256)
			ev, err := cache.Store(toks, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pub.Publish(ev); err != nil {
				t.Fatal(err)
			}
			prompts = append(prompts, toks)
		}
		testkit.WaitFor(t, waitBound, "the announced blocks indexed", func() bool { return rt.s.Engines()[0].Ranks[0].Blocks["GPU"] >= 6*16 })
		for _, toks := range prompts {
			if a := postJSON(t, rt.api.URL+"/v1/completions", promptOf(toks)); a.status != 200 {
				t.Fatalf("status %d: %s", a.status, a.body)
			}
		}
		c := &rt.s.reps()[0].C
		if pred, act := c.ExactPredicted.Load(), c.ExactActual.Load(); pred < degraded.MinDivergenceTokens || act != 0 {
			t.Fatalf("exact mode predicted %d, engine reported %d: the provocation did not take", pred, act)
		}
		rt.s.healthTick(t0.Add(5 * time.Second))
		check(t, rt, "exact index predicted")
	})
	t.Run("stored events cannot be re-keyed", func(t *testing.T) {
		rt, pub, cache := pubRouter(t, kvtest.Options{NoReplay: true}, nil)
		t0 := time.Now()
		rt.s.healthTick(t0)
		for i := range 8 {
			ev, err := cache.Store(tokensFrom(400+i, 48), 0)
			if err != nil {
				t.Fatal(err)
			}
			ev.Stored.TokenIDs = ev.Stored.TokenIDs[:len(ev.Stored.TokenIDs)-1] // three hashes, 47 tokens
			if _, err := pub.Publish(ev); err != nil {
				t.Fatal(err)
			}
		}
		testkit.WaitFor(t, waitBound, "re-key errors counted", func() bool { st, _ := rt.s.sub.Stats("e0", 0); return st.RekeyErrors >= 8 })
		rt.s.healthTick(t0.Add(5 * time.Second))
		check(t, rt, "could not be re-keyed")
		if body := scrape(t, rt); !strings.Contains(body, `kvroute_router_stream_rekey_errors_total{engine="e0",rank="0"} 8`) {
			t.Fatalf("/metrics:\n%s", grepLines(body, "rekey"))
		}
	})
}

func scrape(t *testing.T, rt *router) string {
	t.Helper()
	resp, err := http.Get(rt.admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// /debug/engines shows degraded as a list, [] when none.
func TestDebugEnginesDegradedList(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), noHealthLoop)
	resp, err := http.Get(rt.admin.URL + "/debug/engines")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Engines []struct {
			Ranks []map[string]json.RawMessage `json:"ranks"`
		} `json:"engines"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if got := string(v.Engines[0].Ranks[0]["degraded"]); got != "[]" {
		t.Fatalf("degraded %s, want []", got)
	}
}

// A router-wide section (the capture's counts, added by cmd/kvrouter) shows in /debug/engines;
// a key the answer already has is refused, and the list of those keys is the answer's.
func TestDebugEnginesSections(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), noHealthLoop)
	if err := rt.s.AddDebugSection("capture", func() any { return map[string]int{"records": 3} }); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"capture", "engines", ""} {
		if err := rt.s.AddDebugSection(key, func() any { return nil }); err == nil {
			t.Fatalf("section %q accepted; want it refused (taken)", key)
		}
	}
	resp, err := http.Get(rt.admin.URL + "/debug/engines")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	var capture map[string]int
	if err := json.Unmarshal(v["capture"], &capture); err != nil || capture["records"] != 3 {
		t.Fatalf("capture section %s (%v); want records 3", v["capture"], err)
	}
	for key := range v {
		if key != "capture" && !slices.Contains(debugEnginesKeys, key) {
			t.Fatalf("/debug/engines writes %q, missing from debugEnginesKeys (a section could overwrite it)", key)
		}
	}
}

// A chat request with an image is routed by load without keys, with the visible reason, and the
// replica it went to shows multimodal-unkeyed (informational).
func TestMultimodalRoutedUnkeyed(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	// The simulator is text only and its render refuses images (a client error the router
	// returns as is, as a text-only vLLM would). In front of it, a render that answers for the
	// image as a multimodal vLLM does (placeholder tokens), so the request is routed; the
	// generation call then reaches the simulator, which refuses the image with 400.
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions/render" {
			b, _ := io.ReadAll(r.Body)
			if strings.Contains(string(b), "image_url") {
				ids := make([]string, 40)
				for i := range ids {
					ids[i] = "7"
				}
				_, _ = w.Write([]byte(`{"token_ids":[` + strings.Join(ids, ",") + `]}`))
				return
			}
			r.Body = io.NopCloser(strings.NewReader(string(b)))
		}
		sim.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{{Name: "e0", URL: front.URL, Ready: true}}), noHealthLoop)
	t0 := time.Now()
	rt.s.healthTick(t0)
	body := `{"model":"vllm-sim","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`
	resp0, err := http.Post(rt.api.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp0.Body.Close()
	if n := testutil.ToFloat64(rt.s.met.UnkeyedRequests.WithLabelValues("multimodal")); n != 1 {
		t.Fatalf("unkeyed multimodal %v, want 1", n)
	}
	resp, err := http.Post(rt.admin.URL+"/debug/route", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var ans RouteAnswer
	_ = json.NewDecoder(resp.Body).Decode(&ans)
	resp.Body.Close()
	if ans.Unkeyed != "multimodal" || ans.Blocks != 0 {
		t.Fatalf("/debug/route %+v", ans)
	}
	rt.s.healthTick(t0.Add(5 * time.Second))
	if !hasReason(rt, "e0/0", degraded.MultimodalUnkeyed) {
		t.Fatalf("degraded %+v", rt.s.Degraded())
	}
	// A text-only chat is keyed as before.
	postJSON(t, rt.api.URL+"/v1/chat/completions", `{"model":"vllm-sim","max_tokens":1,"messages":[{"role":"user","content":"hello"}]}`)
	if n := testutil.ToFloat64(rt.s.met.UnkeyedRequests.WithLabelValues("multimodal")); n != 1 {
		t.Fatalf("unkeyed multimodal %v after a text chat, want 1", n)
	}
}

// Accuracy is counted per scoring mode: a repeated prompt on an exact stream is an exact-mode
// decision whose predicted and reported cached tokens both grow; the lifetime ratio gauges are gone.
func TestAccuracyPerMode(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{KVEventsPort: 0})
	rt := startRouter(t, discovery.NewStatic(f.engines()), noHealthLoop)
	rt.waitStreams(t, "exact")
	body := idsPrompt(3, 128, 0, 0, 1)
	postJSON(t, rt.api.URL+"/v1/completions", body)
	testkit.WaitFor(t, waitBound, "blocks indexed", func() bool { return rt.s.Engines()[0].Ranks[0].Blocks["GPU"] > 0 })
	postJSON(t, rt.api.URL+"/v1/completions", body)
	pred := testutil.ToFloat64(rt.s.met.ModePredictedCached.WithLabelValues("e0", modeExact))
	act := testutil.ToFloat64(rt.s.met.ModeActualCached.WithLabelValues("e0", modeExact))
	prompt := testutil.ToFloat64(rt.s.met.ModePromptTokens.WithLabelValues("e0", modeExact))
	if pred == 0 || act == 0 || prompt != 256 {
		t.Fatalf("exact mode: predicted %v actual %v prompt %v", pred, act, prompt)
	}
	if h := &rt.s.reps()[0].C; float64(h.ExactPredicted.Load()) != pred || float64(h.ExactActual.Load()) != act {
		t.Fatalf("replica evidence %d/%d, metrics %v/%v", h.ExactPredicted.Load(), h.ExactActual.Load(), pred, act)
	}
	if body := scrape(t, rt); strings.Contains(body, "hit_ratio") {
		t.Fatalf("hit ratio gauges still exported:\n%s", grepLines(body, "hit_ratio"))
	}
}

// The other two scoring modes count accuracy under their own label: a repeat of a prompt whose
// events have not arrived (the engine's publisher stalled) is scored from the predicted side
// index (mode predicted), and on an engine without an event stream from the approximate index
// (mode approximate); both with the cached tokens the engine then reports.
func TestAccuracyPerModePredictedAndApproximate(t *testing.T) {
	for _, c := range []struct {
		mode   string
		stream bool
	}{{modePredicted, true}, {modeApproximate, false}} {
		t.Run(c.mode, func(t *testing.T) {
			sim := startSim(t, vllmsim.Config{})
			e := discovery.Engine{Name: "e0", URL: sim.URL(), Ready: true}
			if c.stream {
				e = simEngine("e0", sim)
			}
			rt := startRouter(t, discovery.NewStatic([]discovery.Engine{e}), noHealthLoop)
			if c.stream {
				rt.waitStreams(t, "exact")
				sim.SetEventsStalled(true) // the first request's BlockStored never reaches the router
			}
			body := idsPrompt(5, 128, 0, 0, 1)
			postJSON(t, rt.api.URL+"/v1/completions", body)
			postJSON(t, rt.api.URL+"/v1/completions", body)
			if c.stream {
				if ri := rt.s.Engines()[0].Ranks[0]; ri.Blocks["GPU"] != 0 || ri.Stream != "exact" {
					t.Fatalf("stream %s with %d blocks: the events were to stay away", ri.Stream, ri.Blocks["GPU"])
				}
			}
			pred := testutil.ToFloat64(rt.s.met.ModePredictedCached.WithLabelValues("e0", c.mode))
			act := testutil.ToFloat64(rt.s.met.ModeActualCached.WithLabelValues("e0", c.mode))
			prompt := testutil.ToFloat64(rt.s.met.ModePromptTokens.WithLabelValues("e0", c.mode))
			if pred == 0 || act == 0 || prompt == 0 {
				t.Fatalf("%s mode: predicted %v actual %v prompt %v", c.mode, pred, act, prompt)
			}
			if ex := testutil.ToFloat64(rt.s.met.ModePredictedCached.WithLabelValues("e0", modeExact)); ex != 0 {
				t.Fatalf("exact mode predicted %v: the repeat was scored from the exact index", ex)
			}
		})
	}
}

// Two replicas that hash the same block 0 differently are both reported hash-mismatch, each
// naming the other, without either being demoted.
func TestDegradedPeerMismatch(t *testing.T) {
	a := startSim(t, vllmsim.Config{KVEventsPort: 0})
	b := startSim(t, vllmsim.Config{KVEventsPort: 0, HashSeed: "7"})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("e0", a), simEngine("e1", b)}), func(o *Options) {
		noHealthLoop(o)
		o.Config.Policy = "round-robin" // the same prompt lands on both
	})
	rt.waitStreams(t, "exact")
	t0 := time.Now()
	rt.s.healthTick(t0)
	body := idsPrompt(9, 64, 0, 0, 1)
	postJSON(t, rt.api.URL+"/v1/completions", body)
	postJSON(t, rt.api.URL+"/v1/completions", body)
	testkit.WaitFor(t, waitBound, "a cross-replica mismatch", func() bool {
		n, _, _ := rt.s.peers.Mismatches(rt.s.reps()[0].ID)
		return n > 0
	})
	rt.s.healthTick(t0.Add(5 * time.Second))
	for rep, peer := range map[string]string{"e0/0": "e1/0", "e1/0": "e0/0"} {
		var detail string
		for _, st := range rt.s.Degraded()[rep] {
			if st.Reason == degraded.HashMismatch {
				detail = st.Detail
			}
		}
		if !strings.Contains(detail, "replica "+peer) {
			t.Errorf("%s hash-mismatch detail %q does not name %s", rep, detail, peer)
		}
	}
	if rt.s.reps()[0].View().Demoted || rt.s.reps()[1].View().Demoted {
		t.Fatal("a parity mismatch demoted a replica")
	}
}

// logRig is one engine with a test publisher in front of a router whose health ticks the test
// drives and whose log it reads; a first batch is applied and the stream is exact.
type logRig struct {
	rt   *router
	pub  *kvtest.Publisher
	ev   kvwire.Event
	logs *syncBuffer
}

func newLogRig(t *testing.T, replay bool) *logRig {
	t.Helper()
	sim := startSim(t, vllmsim.Config{})
	u, _ := url.Parse(sim.URL())
	pub, err := kvtest.NewPublisher(kvtest.Options{Topic: "kv@" + u.Host + "@m", NoReplay: !replay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	logs := &syncBuffer{}
	e := discovery.Engine{Name: "e0", URL: sim.URL(), Events: []string{pub.Endpoint()}, Ready: true}
	if replay {
		e.Replay = []string{pub.ReplayEndpoint()}
	}
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{e}), func(o *Options) {
		noHealthLoop(o)
		o.Model = "m"
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	algo, _ := blockkey.ParseAlgo("sha256")
	cache, err := kvtest.NewCache(algo, "0", 16)
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, 32)
	for i := range toks {
		toks[i] = uint32(100 + i)
	}
	ev, err := cache.Store(toks, 0)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, waitBound, "a first batch applied", func() bool {
		_, _ = pub.Publish(ev)
		st, _ := rt.s.sub.Stats("e0", 0)
		return st.Applied > 0 && st.State == kvevents.Exact
	})
	return &logRig{rt: rt, pub: pub, ev: ev, logs: logs}
}

// A stream state change is logged once, with the counters that moved.
func TestStreamStateChangeLoggedOnce(t *testing.T) {
	r := newLogRig(t, false)
	rt, pub, ev, logs := r.rt, r.pub, r.ev, r.logs
	t0 := time.Now()
	rt.s.healthTick(t0)
	_, _ = pub.PublishLost(ev) // a gap the engine cannot replay (no replay socket)
	testkit.WaitFor(t, waitBound, "the stream leaves exact", func() bool {
		_, _ = pub.Publish(ev)
		st, _ := rt.s.sub.Stats("e0", 0)
		return st.State != kvevents.Exact
	})
	rt.s.healthTick(t0.Add(5 * time.Second))
	rt.s.healthTick(t0.Add(10 * time.Second))
	out := logs.String()
	if n := strings.Count(out, "event stream state changed"); n != 1 {
		t.Fatalf("%d state change lines, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "from=exact") || !strings.Contains(out, "gaps+") {
		t.Fatalf("state change line lacks from/why:\n%s", grepLines(out, "state changed"))
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// pubRouter is a router in front of one engine whose KV events come from a test publisher
// (real ZMQ and msgpack) with a first batch already applied, and a cache keyed as the router
// keys (sha256, seed 0, 16-token blocks).
func pubRouter(t *testing.T, opts kvtest.Options, replay []string, logs ...*syncBuffer) (*router, *kvtest.Publisher, *kvtest.Cache) {
	t.Helper()
	sim := startSim(t, vllmsim.Config{Model: "m"}) // the router's model: a request for "m" is keyed without a LoRA
	u, _ := url.Parse(sim.URL())
	opts.Topic = "kv@" + u.Host + "@m"
	pub, err := kvtest.NewPublisher(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	e := discovery.Engine{Name: "e0", URL: sim.URL(), Events: []string{pub.Endpoint()}, Replay: replay, Ready: true}
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{e}), func(o *Options) {
		noHealthLoop(o)
		o.Model = "m"
		o.Config.Events.Replay = len(replay) > 0
		if len(logs) > 0 {
			o.Logger = slog.New(slog.NewTextHandler(logs[0], nil))
		}
	})
	if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	algo, _ := blockkey.ParseAlgo("sha256")
	cache, err := kvtest.NewCache(algo, "0", 16)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := cache.Store(tokensFrom(1, 32), 0)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, waitBound, "a first batch applied", func() bool {
		_, _ = pub.Publish(ev)
		st, _ := rt.s.sub.Stats("e0", 0)
		return st.Applied > 0
	})
	// The batches published while the SUB was joining have all arrived: the test's samples
	// start from a settled stream.
	testkit.WaitFor(t, waitBound, "every published batch applied", func() bool {
		st, _ := rt.s.sub.Stats("e0", 0)
		return st.HaveSeq && st.LastSeq+1 == pub.NextSeq()
	})
	return rt, pub, cache
}

// tokensFrom is n distinct token ids from seed.
func tokensFrom(seed, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(1000 + (seed*7919+i*31)%100000)
	}
	return out
}

// Stored events whose parent the replica never held, more of them than blocks indexed, make
// it unchained at the next sample; the index is not demoted for it.
func TestDegradedUnchained(t *testing.T) {
	rt, pub, cache := pubRouter(t, kvtest.Options{NoReplay: true}, nil)
	t0 := time.Now()
	rt.s.healthTick(t0)
	for i := range 8 {
		ev, err := cache.Store(tokensFrom(10+i, 48), 1) // parent: block 0, never published
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Publish(ev); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, waitBound, "unknown parents counted", func() bool { st, _ := rt.s.sub.Stats("e0", 0); return st.UnknownParent >= 8 })
	rt.s.healthTick(t0.Add(5 * time.Second))
	if !hasReason(rt, "e0/0", degraded.Unchained) {
		st, _ := rt.s.sub.Stats("e0", 0)
		t.Fatalf("degraded %+v; stats %+v", rt.s.Degraded(), st)
	}
	ri := rt.s.Engines()[0].Ranks[0]
	if ri.Demoted || ri.Counters["unknown_parents"] < 4 {
		t.Fatalf("rank info %+v", ri)
	}
	if body := scrape(t, rt); !strings.Contains(body, `kvroute_router_replica_degraded{engine="e0",rank="0",reason="unchained"} 1`) {
		t.Fatalf("/metrics:\n%s", grepLines(body, "replica_degraded"))
	}
}

// Events of a sliding-window group are skipped (counted) and the replica shows the
// informational hybrid-groups-skipped.
func TestDegradedHybridGroupsSkipped(t *testing.T) {
	rt, pub, cache := pubRouter(t, kvtest.Options{NoReplay: true}, nil)
	t0 := time.Now()
	rt.s.healthTick(t0)
	ev, err := cache.Store(tokensFrom(20, 32), 0)
	if err != nil {
		t.Fatal(err)
	}
	ev.Stored.GroupIdx, ev.Stored.KVCacheSpecKind = kvwire.Some(int64(1)), kvwire.Some("sliding_window")
	if _, err := pub.Publish(ev); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, waitBound, "the group skipped", func() bool { st, _ := rt.s.sub.Stats("e0", 0); return st.SkippedGroups > 0 })
	rt.s.healthTick(t0.Add(5 * time.Second))
	if got := reasonsOf(rt, "e0/0"); len(got) != 1 || got[0] != degraded.HybridGroupsSkipped {
		t.Fatalf("degraded %v", got)
	}
	if !degraded.HybridGroupsSkipped.Informational() {
		t.Fatal("hybrid-groups-skipped must stay informational")
	}
}

// A stream whose replay never answers holds the live batches behind the gap: received, none
// applied, which is stalled at the next sample (before the replay gives up).
func TestDegradedStalled(t *testing.T) {
	// A replay endpoint that accepts connections and never speaks ZMTP: the replay hangs until
	// its first-reply timeout (the start-up replay too, so the router's first batch waits 5 s).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	rt, pub, cache := pubRouter(t, kvtest.Options{NoReplay: true}, []string{"tcp://" + ln.Addr().String()})
	t0 := time.Now()
	rt.s.healthTick(t0)
	ev, err := cache.Store(tokensFrom(30, 32), 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = pub.PublishLost(ev) // the gap
	for range 4 {
		_, _ = pub.Publish(ev)
	}
	testkit.WaitFor(t, waitBound, "live batches held behind the replay", func() bool {
		st, _ := rt.s.sub.Stats("e0", 0)
		return st.State == kvevents.Replaying && st.Pending >= 3
	})
	rt.s.healthTick(t0.Add(5 * time.Second))
	if st, _ := rt.s.sub.Stats("e0", 0); st.State != kvevents.Replaying {
		t.Skipf("the replay gave up before the sample (loaded machine): %s", st.State)
	}
	if !hasReason(rt, "e0/0", degraded.Stalled) {
		st, _ := rt.s.sub.Stats("e0", 0)
		t.Fatalf("degraded %+v; stats %+v", rt.s.Degraded(), st)
	}
}

// The first of each kind of drop on a stream is logged once (WARN, with the counter and its
// metric); further drops of that kind, in later samples too, only count.
func TestFirstDropOfEachKindLoggedOnce(t *testing.T) {
	var logs syncBuffer
	rt, pub, cache := pubRouter(t, kvtest.Options{NoReplay: true}, nil, &logs)
	t0 := time.Now()
	for i := range 3 {
		ev, err := cache.Store(tokensFrom(40+i, 48), 1) // unknown parent
		if err != nil {
			t.Fatal(err)
		}
		ev2, _ := cache.Store(tokensFrom(50+i, 32), 0)
		ev2.Stored.Medium = kvwire.Some("NVME_OVER_THE_MOON") // a medium this version does not know
		if _, err := pub.Publish(ev, ev2); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, waitBound, "the drops counted", func() bool {
			st, _ := rt.s.sub.Stats("e0", 0)
			return st.UnknownParent >= uint64(i+1) && st.SkippedMedia >= uint64(i+1)
		})
		rt.s.healthTick(t0.Add(time.Duration(i) * 5 * time.Second))
	}
	out := logs.String()
	for _, key := range []string{"unknown_parents", "skipped_media"} {
		if n := strings.Count(out, "counter="+key); n != 1 {
			t.Errorf("%s logged %d times, want once:\n%s", key, n, grepLines(out, "dropped"))
		}
	}
	if !strings.Contains(out, "metric=kvroute_router_stream_unknown_parents_total") {
		t.Errorf("the line does not name the metric:\n%s", grepLines(out, "dropped"))
	}
}

// A gap the engine cannot replay leaves the stream inexact; past degraded.InexactFor the
// replica is reported inexact, and no longer once the engine's cache reset heals the stream.
func TestDegradedInexact(t *testing.T) {
	rt, pub, cache := pubRouter(t, kvtest.Options{NoReplay: true}, nil)
	t0 := time.Now()
	rt.s.healthTick(t0)
	ev, err := cache.Store(tokensFrom(60, 32), 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = pub.PublishLost(ev) // a gap, and no replay socket to fill it
	testkit.WaitFor(t, waitBound, "the stream inexact", func() bool {
		_, _ = pub.Publish(ev)
		st, _ := rt.s.sub.Stats("e0", 0)
		return st.State == kvevents.Inexact
	})
	rt.s.healthTick(t0.Add(5 * time.Second))
	rt.s.healthTick(t0.Add(15 * time.Second))
	if hasReason(rt, "e0/0", degraded.Inexact) {
		t.Fatalf("inexact reported before %v: %+v", degraded.InexactFor, rt.s.Degraded())
	}
	rt.s.healthTick(t0.Add(5*time.Second + degraded.InexactFor))
	if !hasReason(rt, "e0/0", degraded.Inexact) {
		st, _ := rt.s.sub.Stats("e0", 0)
		t.Fatalf("degraded %+v; stream %s", rt.s.Degraded(), st.State)
	}
	testkit.WaitFor(t, waitBound, "healed by a cache reset", func() bool {
		_, _ = pub.Publish(cache.Clear())
		st, _ := rt.s.sub.Stats("e0", 0)
		return st.State == kvevents.Exact
	})
	rt.s.healthTick(t0.Add(30 * time.Second))
	if hasReason(rt, "e0/0", degraded.Inexact) {
		t.Fatalf("still inexact after the reset: %+v", rt.s.Degraded())
	}
}

// A stream state change that heals before the next health sample (a gap the engine's replay
// socket repairs within milliseconds) is logged too, once, with the path it took and why: the
// two samples both read exact, which before this was logged as nothing at all.
func TestTransientStreamStateChangeLogged(t *testing.T) {
	r := newLogRig(t, true)
	rt, pub, ev, logs := r.rt, r.pub, r.ev, r.logs
	t0 := time.Now()
	rt.s.healthTick(t0)
	_, _ = pub.PublishLost(ev) // a gap the replay ring still holds
	_, _ = pub.Publish(ev)
	testkit.WaitFor(t, waitBound, "the gap repaired by replay, the stream exact again", func() bool {
		st, _ := rt.s.sub.Stats("e0", 0)
		return st.Gaps > 0 && st.ReplayedBatches > 0 && st.State == kvevents.Exact
	})
	rt.s.healthTick(t0.Add(5 * time.Second))
	rt.s.healthTick(t0.Add(10 * time.Second))
	out := grepLines(logs.String(), "event stream state changed")
	if n := strings.Count(out, "event stream state changed"); n != 1 {
		t.Fatalf("%d state change lines, want 1:\n%s", n, logs.String())
	}
	for _, want := range []string{"from=exact", "to=exact", "path=exact>replaying>exact", "gaps+1"} {
		if !strings.Contains(out, want) {
			t.Errorf("state change line lacks %q: %s", want, out)
		}
	}
}
