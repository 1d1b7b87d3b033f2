package app

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/extproc"
	"github.com/kvroute/kvroute/router/extproc/gatewaytest"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// startPicker serves the router's picker over real gRPC and returns a gateway playing Envoy
// in front of it, and the picker's address.
func startPicker(t *testing.T, rt *router, hooks bool) (*gatewaytest.Gateway, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eps := extproc.New(rt.s.Picker(), extproc.Options{ConformanceHooks: hooks})
	g := grpc.NewServer()
	eps.Register(g)
	eps.SetReady(true)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	gw, err := gatewaytest.Dial(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return gw, ln.Addr().String()
}

// hostPort is a sim's endpoint as the gateway names it.
func hostPort(t *testing.T, s *vllmsim.Sim) string {
	u, err := url.Parse(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// idle reports whether the router holds no request in flight anywhere.
func idle(s *Router) bool {
	for _, e := range s.Engines() {
		for _, r := range e.Ranks {
			if r.Inflight.Running != 0 {
				return false
			}
		}
	}
	return true
}

// The picker routes through the same pipeline as the proxy: a warmed prefix attracts its
// request, the engine's reported cached tokens equal the prediction (non-streamed and streamed,
// the usage the picker asked for dropped from the client's stream), every booking is released.
func TestPickerRoutesLikeTheProxy(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	gw, _ := startPicker(t, rt, false)
	ctx := context.Background()

	if a := postJSON(t, f.sims[2].URL()+"/v1/completions", idsPrompt(1, 256, 1, 5, 1)); a.status != 200 {
		t.Fatalf("warm-up: %d %s", a.status, a.body)
	}
	testkit.WaitFor(t, waitBound, "the warmed blocks to be indexed", func() bool {
		return rt.s.Engines()[2].Ranks[0].Blocks["GPU"] >= 16
	})
	res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: []byte(idsPrompt(1, 256, 2, 40, 1)), Chunk: 100})
	if err != nil {
		t.Fatal(err)
	}
	if res.Immediate || res.Status != 200 || len(res.Endpoints) == 0 || res.Endpoints[0] != hostPort(t, f.sims[2]) {
		t.Fatalf("picked %v (status %d, immediate %v), want %s first", res.Endpoints, res.Status, res.Immediate, hostPort(t, f.sims[2]))
	}
	if res.MetadataPick != strings.Join(res.Endpoints, ",") {
		t.Fatalf("dynamic metadata %q, header %v", res.MetadataPick, res.Endpoints)
	}
	if len(res.Endpoints) != 3 || res.Endpoints[1] == res.Endpoints[2] {
		t.Fatalf("fallbacks: want the two other engines, got %v", res.Endpoints)
	}
	var ans struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(res.ClientBody, &ans); err != nil || ans.Usage.PromptTokensDetails.CachedTokens != 256 {
		t.Fatalf("engine answer %s (%v): want 256 cached", res.ClientBody, err)
	}
	testkit.WaitFor(t, waitBound, "the answer accounted", func() bool { return rt.s.Engines()[2].Ranks[0].Accuracy.WithUsage == 1 })
	if acc := rt.s.Engines()[2].Ranks[0].Accuracy; acc.PredictedCached != 256 || acc.ActualCached != 256 {
		t.Fatalf("predicted %d, engine reported %d; want 256 both", acc.PredictedCached, acc.ActualCached)
	}

	// Streamed, the client did not ask for usage: the picker asks, reads it and drops it.
	body := strings.Replace(idsPrompt(1, 256, 3, 40, 4), `{"model"`, `{"stream":true,"model"`, 1)
	res, err = gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != 200 || res.Endpoints[0] != hostPort(t, f.sims[2]) || !strings.Contains(string(res.ClientBody), "[DONE]") ||
		strings.Contains(string(res.ClientBody), `"prompt_tokens"`) {
		t.Fatalf("stream: %d via %v:\n%s", res.Status, res.Endpoints, res.ClientBody)
	}
	testkit.WaitFor(t, waitBound, "the stream accounted", func() bool { return rt.s.Engines()[2].Ranks[0].Accuracy.WithUsage == 2 })
	if acc := rt.s.Engines()[2].Ranks[0].Accuracy; acc.PredictedCached != acc.ActualCached || acc.AbsErrorTokens != 0 {
		t.Fatalf("accuracy %+v", acc)
	}
	testkit.WaitFor(t, waitBound, "every booking released", func() bool { return idle(rt.s) })
}

// The subset hint restricts the pick; a subset naming no engine gets 503; a client that goes
// away after the pick and a stream cut mid-answer release their bookings.
func TestPickerSubsetAndRelease(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	gw, _ := startPicker(t, rt, false)
	ctx := context.Background()
	body := []byte(idsPrompt(5, 64, 5, 8, 2))

	for _, asString := range []bool{false, true} {
		res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: body, HasSubset: true, SubsetAsString: asString,
			Subset: []string{hostPort(t, f.sims[1]), "10.255.255.1:8000"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != 200 || len(res.Endpoints) != 1 || res.Endpoints[0] != hostPort(t, f.sims[1]) {
			t.Fatalf("subset pick %v (%d), want only %s", res.Endpoints, res.Status, hostPort(t, f.sims[1]))
		}
	}
	res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: body, HasSubset: true, Subset: []string{"10.255.255.1:8000"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Immediate || res.Status != 503 {
		t.Fatalf("subset of unknown endpoints: immediate %v status %d, want 503", res.Immediate, res.Status)
	}

	if _, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: []byte(idsPrompt(6, 64, 6, 8, 200)), LeaveAfterPick: true}); err != nil {
		t.Logf("client gone: %v", err)
	}
	stream := strings.Replace(idsPrompt(7, 64, 7, 8, 200), `{"model"`, `{"stream":true,"model"`, 1)
	if _, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: []byte(stream), CutAfter: 200}); err != nil {
		t.Logf("cut: %v", err)
	}
	testkit.WaitFor(t, waitBound, "the abandoned and cut requests released", func() bool { return idle(rt.s) })

	res, err = gw.Do(ctx, gatewaytest.Request{Path: "/v1/models", Body: nil})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Immediate || res.Status != 404 {
		t.Fatalf("a path the picker does not route: immediate %v status %d, want 404", res.Immediate, res.Status)
	}
}

// The gateway falls back when the pick is dead: the request is booked where it went, and the
// dead engine's attempt counted as a failure.
func TestPickerFallbackOnDeadPod(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	gw, _ := startPicker(t, rt, false)
	if a := postJSON(t, f.sims[0].URL()+"/v1/completions", idsPrompt(9, 256, 9, 5, 1)); a.status != 200 {
		t.Fatalf("warm-up: %d %s", a.status, a.body)
	}
	testkit.WaitFor(t, waitBound, "the warmed blocks to be indexed", func() bool {
		return rt.s.Engines()[0].Ranks[0].Blocks["GPU"] >= 16
	})
	dead := hostPort(t, f.sims[0])
	_ = f.sims[0].Close() // its HTTP server is gone; the router has not noticed yet
	res, err := gw.Do(context.Background(), gatewaytest.Request{Path: "/v1/completions", Body: []byte(idsPrompt(9, 256, 10, 8, 1))})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != 200 || len(res.Endpoints) != 2 || res.Endpoints[0] != dead || res.Served != hostPort(t, f.sims[1]) {
		t.Fatalf("picked %v served %q status %d; want the dead %s first and the other serving", res.Endpoints, res.Served, res.Status, dead)
	}
	testkit.WaitFor(t, waitBound, "the request booked on the fallback and released", func() bool {
		return idle(rt.s) && rt.s.Engines()[1].Ranks[0].Accuracy.Responses == 1
	})
	if got := testutil.ToFloat64(rt.s.met.Retries.WithLabelValues("e0")); got != 1 {
		t.Fatalf("the dead pick's attempt: %v retries counted, want 1", got)
	}
}

// kvroutectl epp-check's conformance kit passes against the router's picker.
func TestEPPCheckPassesAgainstKvrouter(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	_, addr := startPicker(t, rt, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	outs, err := gatewaytest.Check(ctx, addr, gatewaytest.CheckOptions{Model: "vllm-sim", Conformance: true, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range outs {
		t.Logf("%+v", o)
	}
	for i, o := range outs {
		if !o.Pass && !o.Skipped {
			t.Errorf("check %d %s failed: %s", i, o.Name, o.Detail)
		}
	}
	testkit.WaitFor(t, waitBound, "every booking released", func() bool { return idle(rt.s) })
}

// sharedPrefixWorkload is 4 prefixes of 192 tokens, each asked 6 times with its own suffix,
// interleaved.
func sharedPrefixWorkload() []string {
	var out []string
	for round := range 6 {
		for p := range 4 {
			out = append(out, idsPrompt(20+p, 192, 100*p+round, 24, 1))
		}
	}
	return out
}

// cachedShare is the engines' reported cached tokens over the prompt tokens of what the router
// accounted.
func cachedShare(s *Router) (share float64, responses uint64, exact bool) {
	var prompt, cached, predicted uint64
	for _, e := range s.Engines() {
		for _, r := range e.Ranks {
			prompt += r.Accuracy.PromptTokens
			cached += r.Accuracy.ActualCached
			predicted += r.Accuracy.PredictedCached
			responses += r.Accuracy.WithUsage
		}
	}
	if prompt == 0 {
		return 0, responses, false
	}
	return float64(cached) / float64(prompt), responses, predicted == cached
}

// A shared-prefix workload gets the same cached share through the picker as through the proxy
// (each on fresh engines), with predicted = reported cached tokens in both.
func TestPickerCachedShareMatchesProxy(t *testing.T) {
	work := sharedPrefixWorkload()
	run := func(viaPicker bool) (float64, bool) {
		f := startFleet(t, 3, vllmsim.Config{})
		rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
		rt.waitStreams(t, "exact")
		var gw *gatewaytest.Gateway
		if viaPicker {
			gw, _ = startPicker(t, rt, false)
		}
		for i, b := range work {
			if viaPicker {
				res, err := gw.Do(context.Background(), gatewaytest.Request{Path: "/v1/completions", Body: []byte(b)})
				if err != nil || res.Status != 200 {
					t.Fatalf("request %d via the picker: %v %+v", i, err, res)
				}
			} else if a := postJSON(t, rt.api.URL+"/v1/completions", b); a.status != 200 {
				t.Fatalf("request %d via the proxy: %d %s", i, a.status, a.body)
			}
			// The next request sees this one's blocks in the index, as in a paced workload.
			testkit.WaitFor(t, waitBound, "the answer accounted", func() bool { _, n, _ := cachedShare(rt.s); return n == uint64(i+1) })
		}
		share, _, exact := cachedShare(rt.s)
		return share, exact
	}
	proxyShare, proxyExact := run(false)
	pickerShare, pickerExact := run(true)
	t.Logf("cached share: proxy %.3f, picker %.3f", proxyShare, pickerShare)
	if proxyShare < 0.5 || pickerShare < proxyShare-0.02 || pickerShare > proxyShare+0.02 {
		t.Fatalf("cached share: proxy %.3f, picker %.3f; want them within 2 points, and above 0.5", proxyShare, pickerShare)
	}
	if !proxyExact || !pickerExact {
		t.Fatalf("predicted != reported cached tokens (proxy exact %v, picker exact %v)", proxyExact, pickerExact)
	}
}
