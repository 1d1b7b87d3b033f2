package app

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/extproc/gatewaytest"
	"github.com/kvroute/kvroute/router/tokens"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// The Responses API through the picker: each stored answer's engine is learnt from the
// response phases (the body's id, the stream's response.created), follow-ups naming it are
// picked onto that engine alone (round-robin alone would scatter them; no fallback, which would
// answer 404), a GET of it goes there too, an unknown id and a gone owner get vLLM's 404 as an
// immediate response.
func TestPickerResponsesPinnedToTheirEngine(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{})
	src := newPushSource(f.engines())
	rt := startRouter(t, src, func(o *Options) { o.Config.Policy = "round-robin" })
	gw, _ := startPicker(t, rt, false)
	ctx := context.Background()
	const convs = 6
	ids, owners := make([]string, convs), make([]string, convs)
	for c := range convs {
		res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/responses",
			Body: fmt.Appendf(nil, `{"model":"vllm-sim","input":"conversation %d opens","max_output_tokens":2,"stream":%v}`, c, c%2 == 0)})
		if err != nil || res.Status != 200 || res.Immediate {
			t.Fatalf("conversation %d: %v %+v", c, err, res)
		}
		ids[c], owners[c] = responseIDOf(t, answer{status: res.Status, body: res.ClientBody}), res.Served
	}
	testkit.WaitFor(t, waitBound, "every answer's owner recorded", func() bool {
		return testutil.ToFloat64(rt.s.met.ResponseAffinity.WithLabelValues(affinityRecorded)) == convs
	})
	for c := range convs {
		res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/responses",
			Body: fmt.Appendf(nil, `{"model":"vllm-sim","input":"and next","previous_response_id":%q,"max_output_tokens":2,"stream":%v}`, ids[c], c%3 == 0)})
		if err != nil || res.Status != 200 || len(res.Endpoints) != 1 || res.Endpoints[0] != owners[c] {
			t.Fatalf("follow-up %d: %v; picked %v (status %d), stored on %s: %s", c, err, res.Endpoints, res.Status, owners[c], res.ClientBody)
		}
	}
	if n := testutil.ToFloat64(rt.s.met.ResponseAffinity.WithLabelValues(affinityPinned)); n != convs {
		t.Fatalf("pinned %v, want %d", n, convs)
	}

	res, err := gw.Do(ctx, gatewaytest.Request{Method: "GET", Path: "/v1/responses/" + ids[1]})
	if err != nil || res.Status != 200 || len(res.Endpoints) != 1 || res.Endpoints[0] != owners[1] || !strings.Contains(string(res.ClientBody), ids[1]) {
		t.Fatalf("GET of a stored response: %v %+v", err, res)
	}

	// Its cancel too (the simulator, like vLLM, refuses to cancel a synchronous response).
	res, err = gw.Do(ctx, gatewaytest.Request{Path: "/v1/responses/" + ids[1] + "/cancel", Body: []byte(`{}`)})
	if err != nil || res.Status != 400 || len(res.Endpoints) != 1 || res.Endpoints[0] != owners[1] || !strings.Contains(string(res.ClientBody), "synchronous") {
		t.Fatalf("cancel of a stored response: %v %+v %s", err, res, res.ClientBody)
	}

	res, err = gw.Do(ctx, gatewaytest.Request{Path: "/v1/responses", Body: []byte(`{"model":"vllm-sim","input":"x","previous_response_id":"resp_nowhere"}`)})
	var e struct {
		Error struct {
			Message, Type, Param string
			Code                 int
		}
	}
	if err != nil || !res.Immediate || res.Status != 404 || json.Unmarshal(res.ClientBody, &e) != nil || e.Error.Param != "response_id" ||
		e.Error.Message != "Response with id 'resp_nowhere' not found." || e.Error.Code != 404 {
		t.Fatalf("unknown id: %v %+v %s", err, res, res.ClientBody)
	}

	// The owner leaves: its follow-ups get vLLM's 404 from the picker, never another engine.
	gone := ""
	var keep []discovery.Engine
	for _, en := range f.engines() {
		if strings.HasSuffix(en.URL, owners[2]) {
			gone = en.Name
			continue
		}
		keep = append(keep, en)
	}
	src.ch <- keep
	waitFor(t, func() bool { return len(rt.s.reps()) == len(keep) })
	res, err = gw.Do(ctx, gatewaytest.Request{Path: "/v1/responses",
		Body: fmt.Appendf(nil, `{"model":"vllm-sim","input":"x","previous_response_id":%q}`, ids[2])})
	if err != nil || !res.Immediate || res.Status != 404 || len(res.Endpoints) != 0 ||
		testutil.ToFloat64(rt.s.met.ResponseAffinity.WithLabelValues(affinityUnavailable)) != 1 {
		t.Fatalf("owner %s gone: %v %+v %s", gone, err, res, res.ClientBody)
	}
	testkit.WaitFor(t, waitBound, "every booking released", func() bool { return idle(rt.s) })
}

// The Messages API through the picker is keyed like chat (a repeated conversation returns to
// its engine with a predicted prefix equal to what the engine reports cached), its typed
// stream read for the first token and usage; a pooling path is picked by load, unkeyed.
func TestPickerMessagesAndPooling(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	gw, _ := startPicker(t, rt, false)
	ctx := context.Background()
	long := strings.Repeat("the same long system prompt ", 40)
	body := fmt.Appendf(nil, `{"model":"vllm-sim","max_tokens":2,"system":%q,"messages":[{"role":"user","content":[{"type":"text","text":"question"}]}],"stream":true}`, long)
	first, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/messages", Body: body})
	if err != nil || first.Status != 200 || !strings.Contains(string(first.ClientBody), "event: message_stop") {
		t.Fatalf("first: %v %+v", err, first)
	}
	owner := first.Endpoints[0]
	// The simulator's Messages answers report no cached tokens (no cache_read_input_tokens),
	// so the prefix shows in the pick and the rendering, not in predicted-vs-reported.
	testkit.WaitFor(t, waitBound, "the repeated conversation picked onto its engine", func() bool {
		res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/messages", Body: body})
		return err == nil && res.Status == 200 && res.Endpoints[0] == owner
	})
	var name string
	for _, en := range f.engines() {
		if strings.HasSuffix(en.URL, owner) {
			name = en.Name
		}
	}
	if n := testutil.CollectAndCount(rt.s.met.FirstTokenSeconds); n == 0 {
		t.Fatal("no first token observed from the Messages stream's content_block_delta")
	}
	testkit.WaitFor(t, waitBound, "the answers accounted", func() bool { return rt.s.Engines()[engineIndex(rt.s, name)].Ranks[0].Accuracy.Responses >= 2 })
	if n := testutil.ToFloat64(rt.s.met.TokenizeSource.WithLabelValues("engine")) + testutil.ToFloat64(rt.s.met.TokenizeSource.WithLabelValues("cache")); n < 2 {
		t.Fatalf("Messages requests not rendered: %v", n)
	}
	res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/messages", Body: []byte(`{"model":"vllm-sim","max_tokens":2}`)})
	var ae struct {
		Type  string
		Error struct{ Type string }
	}
	if err != nil || !res.Immediate || res.Status != 400 || json.Unmarshal(res.ClientBody, &ae) != nil || ae.Type != "error" {
		t.Fatalf("a bad Messages request: %v %+v %s", err, res, res.ClientBody)
	}

	res, err = gw.Do(ctx, gatewaytest.Request{Path: "/tokenize", Body: []byte(`{"model":"vllm-sim","prompt":"hello world"}`)})
	if err != nil || res.Status != 200 || len(res.Endpoints) == 0 || !strings.Contains(string(res.ClientBody), `"tokens"`) {
		t.Fatalf("tokenize: %v %+v", err, res)
	}
	if n := testutil.ToFloat64(rt.s.met.UnkeyedRequests.WithLabelValues(tokens.UnkeyedPooling)); n != 1 {
		t.Fatalf("unkeyed pooling %v", n)
	}
	testkit.WaitFor(t, waitBound, "every booking released", func() bool { return idle(rt.s) })
}

// engineIndex is the index of the engine named name in s.Engines().
func engineIndex(s *Router, name string) int {
	for i, e := range s.Engines() {
		if e.Name == name {
			return i
		}
	}
	return -1
}
