package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/tokens"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// responseID reads a Responses answer's id: the body's, or a stream's response.created.
func responseIDOf(t *testing.T, a answer) string {
	t.Helper()
	for _, line := range strings.Split(string(a.body), "\n") {
		if ev, ok := strings.CutPrefix(line, "data: "); ok {
			var e struct {
				Type     string
				Response struct{ ID string }
			}
			if json.Unmarshal([]byte(ev), &e) == nil && e.Type == "response.created" {
				return e.Response.ID
			}
		}
	}
	var r struct{ ID string }
	if err := json.Unmarshal(a.body, &r); err != nil || r.ID == "" {
		t.Fatalf("no response id in %d %s", a.status, a.body)
	}
	return r.ID
}

// Follow-ups naming a stored response reach the engine that stored it: 12 conversations over
// three engines under round-robin (which alone would scatter them), half streamed. Each
// engine keeps its responses in its own memory, so a follow-up anywhere else would be a 404.
func TestResponsesFollowUpsReachTheirEngine(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{})
	src := newPushSource(f.engines())
	rt := startRouter(t, src, func(o *Options) { o.Config.Policy = "round-robin" })
	const convs = 12
	reached := 0
	ids, owners := make([]string, convs), make([]string, convs)
	for c := range convs {
		stream := c%2 == 0
		a := postJSON(t, rt.api.URL+"/v1/responses", fmt.Sprintf(`{"model":"vllm-sim","input":"conversation %d opens","max_output_tokens":2,"stream":%v}`, c, stream))
		if a.status != 200 {
			t.Fatalf("conversation %d: %d %s", c, a.status, a.body)
		}
		ids[c], owners[c] = responseIDOf(t, a), a.header.Get("x-kvroute-engine")
	}
	for c := range convs {
		a := postJSON(t, rt.api.URL+"/v1/responses", fmt.Sprintf(`{"model":"vllm-sim","input":"and next","previous_response_id":%q,"max_output_tokens":2,"stream":%v}`, ids[c], c%3 == 0))
		if a.status == 200 && a.header.Get("x-kvroute-engine") == owners[c] {
			reached++
		} else {
			t.Errorf("follow-up %d: %d on %s, stored on %s: %s", c, a.status, a.header.Get("x-kvroute-engine"), owners[c], a.body)
		}
	}
	if reached != convs {
		t.Fatalf("%d of %d follow-ups reached their engine", reached, convs)
	}
	m := rt.s.met.ResponseAffinity
	if testutil.ToFloat64(m.WithLabelValues(affinityRecorded)) < convs || testutil.ToFloat64(m.WithLabelValues(affinityPinned)) != convs {
		t.Fatalf("recorded %v pinned %v", testutil.ToFloat64(m.WithLabelValues(affinityRecorded)), testutil.ToFloat64(m.WithLabelValues(affinityPinned)))
	}
	if n := testutil.ToFloat64(rt.s.met.UnkeyedRequests.WithLabelValues(tokens.UnkeyedPreviousResponse)); n != convs {
		t.Fatalf("follow-ups counted unkeyed %v", n)
	}

	// GET and cancel reach the owner.
	resp, err := http.Get(rt.api.URL + "/v1/responses/" + ids[1])
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("x-kvroute-engine") != owners[1] || !strings.Contains(string(b), ids[1]) {
		t.Fatalf("GET %d on %s: %s", resp.StatusCode, resp.Header.Get("x-kvroute-engine"), b)
	}
	if a := postJSON(t, rt.api.URL+"/v1/responses/"+ids[1]+"/cancel", `{}`); a.status != 400 || !strings.Contains(string(a.body), "synchronous") {
		t.Fatalf("cancel: %d %s", a.status, a.body)
	}

	// A router that never saw the answer (a peer, or this one restarted) finds the owner by
	// asking the engines.
	other := startRouter(t, newPushSource(f.engines()), func(o *Options) { o.Config.Policy = "round-robin" })
	a := postJSON(t, other.api.URL+"/v1/responses", fmt.Sprintf(`{"model":"vllm-sim","input":"later","previous_response_id":%q,"max_output_tokens":1}`, ids[2]))
	if a.status != 200 || a.header.Get("x-kvroute-engine") != owners[2] || testutil.ToFloat64(other.s.met.ResponseAffinity.WithLabelValues(affinityProbed)) != 1 {
		t.Fatalf("lookup: %d on %s (owner %s): %s", a.status, a.header.Get("x-kvroute-engine"), owners[2], a.body)
	}

	// An id no engine holds: vLLM's 404.
	a = postJSON(t, rt.api.URL+"/v1/responses", `{"model":"vllm-sim","input":"x","previous_response_id":"resp_nowhere"}`)
	var e struct {
		Error struct {
			Message, Type, Param string
			Code                 int
		}
	}
	if a.status != 404 || json.Unmarshal(a.body, &e) != nil || e.Error.Type != "invalid_request_error" || e.Error.Param != "response_id" ||
		e.Error.Message != "Response with id 'resp_nowhere' not found." || e.Error.Code != 404 {
		t.Fatalf("unknown id: %d %s", a.status, a.body)
	}

	// The owner leaves: its follow-ups get the 404, never another engine.
	gone := owners[3]
	var keep []discovery.Engine
	for _, e := range f.engines() {
		if e.Name != gone {
			keep = append(keep, e)
		}
	}
	src.ch <- keep
	waitFor(t, func() bool { return len(rt.s.reps()) == len(keep) })
	a = postJSON(t, rt.api.URL+"/v1/responses", fmt.Sprintf(`{"model":"vllm-sim","input":"x","previous_response_id":%q}`, ids[3]))
	if a.status != 404 || a.header.Get("x-kvroute-engine") != "" || testutil.ToFloat64(rt.s.met.ResponseAffinity.WithLabelValues(affinityUnavailable)) != 1 {
		t.Fatalf("owner gone: %d on %q: %s", a.status, a.header.Get("x-kvroute-engine"), a.body)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	if !testkit.Until(waitBound, cond) {
		t.Fatal("condition not met")
	}
}

// The Messages API is keyed like chat: a repeated conversation goes back to its engine with
// the router predicting its cached prefix; the stream's first content_block_delta is the first
// token; errors keep the Messages API's shape.
func TestMessagesKeyedLikeChat(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	long := strings.Repeat("the same long system prompt ", 40)
	body := fmt.Sprintf(`{"model":"vllm-sim","max_tokens":2,"system":%q,"messages":[{"role":"user","content":[{"type":"text","text":"question"}]}],"stream":true}`, long)
	first := postJSON(t, rt.api.URL+"/v1/messages", body)
	if first.status != 200 || !strings.Contains(string(first.body), "event: message_stop") {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	e := first.header.Get("x-kvroute-engine")
	var predicted int
	if !testkit.Until(waitBound, func() bool {
		a := postJSON(t, rt.api.URL+"/v1/messages", body)
		predicted, _ = strconv.Atoi(a.header.Get("x-kvroute-predicted-cached-tokens"))
		return a.status == 200 && a.header.Get("x-kvroute-engine") == e && predicted > 0
	}) {
		t.Fatalf("repeated Messages conversation not routed back to %s with a predicted prefix (last predicted %d)", e, predicted)
	}
	if n := testutil.ToFloat64(rt.s.met.TokenizeSource.WithLabelValues("engine")) + testutil.ToFloat64(rt.s.met.TokenizeSource.WithLabelValues("cache")); n < 2 {
		t.Fatalf("Messages requests not rendered: %v", n)
	}
	a := postJSON(t, rt.api.URL+"/v1/messages", `{"model":"vllm-sim","max_tokens":2}`)
	var ae struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if a.status != 400 || json.Unmarshal(a.body, &ae) != nil || ae.Type != "error" || ae.Error.Type != "BadRequestError" {
		t.Fatalf("Messages error: %d %s", a.status, a.body)
	}
}

// Pooling and tokenize paths are forwarded by load, unkeyed, the engine's answer passed through.
func TestPoolingPathsForwarded(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	a := postJSON(t, rt.api.URL+"/tokenize", `{"model":"vllm-sim","prompt":"hello world"}`)
	if a.status != 200 || !strings.Contains(string(a.body), `"tokens"`) || a.header.Get("x-kvroute-engine") == "" {
		t.Fatalf("tokenize: %d %s", a.status, a.body)
	}
	if n := testutil.ToFloat64(rt.s.met.UnkeyedRequests.WithLabelValues(tokens.UnkeyedPooling)); n != 1 {
		t.Fatalf("unkeyed pooling %v", n)
	}
	// A path the engine lacks: its own answer comes back (the simulator serves no embeddings).
	if a = postJSON(t, rt.api.URL+"/v1/embeddings", `{"model":"vllm-sim","input":"x"}`); a.status != 404 {
		t.Fatalf("embeddings on an engine without them: %d %s", a.status, a.body)
	}
	// The router's own refusals use vLLM's types.
	if a = postJSON(t, rt.api.URL+"/v1/nothing", `{}`); a.status != 404 || !strings.Contains(string(a.body), `"type":"NotFoundError"`) {
		t.Fatalf("unknown route: %d %s", a.status, a.body)
	}
}

// The session-affinity key: vLLM's X-Session-Id header first, then the body's session_id
// (vllm_xargs.session_id), then the OpenAI user or the Messages API's metadata.user_id.
func TestSessionKey(t *testing.T) {
	for _, c := range []struct {
		kind         tokens.Kind
		header, body string
		want         string
	}{
		{tokens.Completion, "h", `{"model":"m","prompt":"x","session_id":"b","user":"u"}`, "h"},
		{tokens.Completion, "", `{"model":"m","prompt":"x","session_id":"b","user":"u"}`, "b"},
		{tokens.Completion, "", `{"model":"m","prompt":"x","vllm_xargs":{"session_id":"x"},"user":"u"}`, "x"},
		{tokens.Chat, "", `{"model":"m","messages":[{"role":"user","content":"x"}],"user":"u"}`, "u"},
		{tokens.Messages, "", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"metadata":{"user_id":"mu"}}`, "mu"},
		{tokens.Completion, "", `{"model":"m","prompt":"x"}`, ""},
	} {
		tr, err := tokens.Parse(c.kind, []byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		if c.header != "" {
			h.Set("X-Session-Id", c.header)
		}
		if got := sessionKey(h, tr); got != c.want {
			t.Errorf("%s %q: %q, want %q", c.body, c.header, got, c.want)
		}
	}
}

// responses.maxOwners bounds the response-owner map: with 2, the third stored answer drops the
// first id (counted), and a follow-up naming it is found by asking the engines, the two kept
// ones from the map.
func TestResponseOwnerBoundFromConfig(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{})
	rt := startRouter(t, newPushSource(f.engines()), func(o *Options) {
		o.Config.Policy = "round-robin"
		o.Config.Responses = &config.Responses{MaxOwners: 2}
	})
	ids := make([]string, 3)
	for c := range ids {
		a := postJSON(t, rt.api.URL+"/v1/responses", fmt.Sprintf(`{"model":"vllm-sim","input":"opens %d","max_output_tokens":1}`, c))
		if a.status != 200 {
			t.Fatalf("%d: %d %s", c, a.status, a.body)
		}
		ids[c] = responseIDOf(t, a)
	}
	if n := testutil.ToFloat64(rt.s.met.ResponseOwnerEvicted); n != 1 {
		t.Fatalf("evictions %v, want 1 (3 ids into 2)", n)
	}
	// Newest first, not stored: what a lookup learns back must not push out an id still to come.
	for c := len(ids) - 1; c >= 0; c-- {
		if a := postJSON(t, rt.api.URL+"/v1/responses", fmt.Sprintf(`{"model":"vllm-sim","input":"next","previous_response_id":%q,"max_output_tokens":1,"store":false}`, ids[c])); a.status != 200 {
			t.Fatalf("follow-up %d: %d %s", c, a.status, a.body)
		}
	}
	m := rt.s.met.ResponseAffinity
	// Every follow-up reaches its engine; the dropped id only by asking the engines.
	if p, l := testutil.ToFloat64(m.WithLabelValues(affinityPinned)), testutil.ToFloat64(m.WithLabelValues(affinityProbed)); l != 1 || p != 3 {
		t.Fatalf("pinned %v found by lookup %v, want 3 and 1", p, l)
	}
}
