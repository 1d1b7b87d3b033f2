package app

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// A prefix warmed on one engine directly (not through the router) attracts the next request
// with that prefix, and the prediction matches what the engine reports.
func TestWarmedPrefixAttracts(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	if a := postJSON(t, f.sims[2].URL()+"/v1/completions", idsPrompt(1, 256, 1, 5, 1)); a.status != 200 {
		t.Fatalf("warm-up: %d %s", a.status, a.body)
	}
	testkit.WaitFor(t, waitBound, "the warmed blocks to be indexed", func() bool {
		return rt.s.Engines()[2].Ranks[0].Blocks["GPU"] >= 16
	})
	a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 256, 2, 40, 1))
	if a.status != 200 || a.header.Get("x-kvroute-engine") != "e2" {
		t.Fatalf("routed to %q (%d %s), want e2", a.header.Get("x-kvroute-engine"), a.status, a.body)
	}
	if got, pred := a.cachedTokens(t), a.header.Get("x-kvroute-predicted-cached-tokens"); got != 256 || pred != "256" {
		t.Fatalf("engine cached %d, router predicted %s; want 256 both", got, pred)
	}
	acc := rt.s.Engines()[2].Ranks[0].Accuracy
	if acc.WithUsage != 1 || acc.PredictedCached != acc.ActualCached {
		t.Fatalf("accuracy %+v", acc)
	}
}

// Chat is routed by the tokens the engine's template renders.
func TestChatRoutedByRenderedTokens(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	sys := strings.Repeat("You are a careful assistant who answers in full sentences. ", 20)
	chat := func(q string) string {
		b, _ := json.Marshal(map[string]any{"model": "vllm-sim", "max_tokens": 2, "messages": []map[string]string{
			{"role": "system", "content": sys}, {"role": "user", "content": q}}})
		return string(b)
	}
	if a := postJSON(t, f.sims[1].URL()+"/v1/chat/completions", chat("first question")); a.status != 200 {
		t.Fatalf("warm-up: %d %s", a.status, a.body)
	}
	testkit.WaitFor(t, waitBound, "the system prompt indexed", func() bool { return rt.s.Engines()[1].Ranks[0].Blocks["GPU"] > 10 })
	a := postJSON(t, rt.api.URL+"/v1/chat/completions", chat("second question, different"))
	if a.status != 200 || a.header.Get("x-kvroute-engine") != "e1" {
		t.Fatalf("chat routed to %q (%d %s), want e1", a.header.Get("x-kvroute-engine"), a.status, a.body)
	}
	if a.cachedTokens(t) == 0 {
		t.Fatal("the engine reported no cached tokens for the shared system prompt")
	}
}

// A stream through the router is byte-identical to the engine's (ids and timestamps aside),
// with and without usage asked for by the client.
func TestStreamThroughRouterIdentical(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	for _, opts := range []string{``, `,"stream_options":{"include_usage":true}`} {
		body := `{"model":"vllm-sim","prompt":"tell me a story about routers","max_tokens":6,"seed":3,"stream":true` + opts + `}`
		direct := postJSON(t, f.sims[0].URL()+"/v1/completions", body)
		via := postJSON(t, rt.api.URL+"/v1/completions", body)
		if via.status != 200 || via.header.Get("Content-Type") != direct.header.Get("Content-Type") {
			t.Fatalf("status %d, content type %q vs %q", via.status, via.header.Get("Content-Type"), direct.header.Get("Content-Type"))
		}
		if maskIDs(via.body) != maskIDs(direct.body) {
			t.Fatalf("stream differs (%s):\n%s\nvs direct\n%s", opts, via.body, direct.body)
		}
		if wantUsage := opts != ""; bytes.Contains(via.body, []byte(`"prompt_tokens"`)) != wantUsage {
			t.Fatalf("usage in the stream: %v, client asked: %v", !wantUsage, wantUsage)
		}
	}
	// The router asked for usage it dropped, so accuracy is known for both.
	if acc := rt.s.Engines()[0].Ranks[0].Accuracy; acc.WithUsage != 2 {
		t.Fatalf("accuracy %+v", acc)
	}
}

// maskIDs replaces the per-request id and created fields so two answers compare.
func maskIDs(b []byte) string {
	var out strings.Builder
	for line := range strings.Lines(string(b)) {
		if d, ok := strings.CutPrefix(line, "data: {"); ok {
			var m map[string]any
			if json.Unmarshal([]byte("{"+d), &m) == nil {
				delete(m, "id")
				delete(m, "created")
				j, _ := json.Marshal(m)
				line = "data: " + string(j) + "\n"
			}
		}
		out.WriteString(line)
	}
	return out.String()
}

func TestMalformedBodies(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{})
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) { o.Config.Limits.MaxBodyBytes = 4096 })
	cases := []struct{ path, body string }{
		{"/v1/completions", `{`},
		{"/v1/completions", `{"model":"vllm-sim"}`},
		{"/v1/completions", `{"model":"vllm-sim","prompt":[-3]}`},
		{"/v1/chat/completions", `{"model":"vllm-sim","messages":[]}`},
		{"/v1/chat/completions", `[1,2]`},
		{"/v1/chat/completions", `{"model":"vllm-sim","messages":[{"role":"user","content":"x"}],"stream":"yes"}`},
	}
	for _, c := range cases {
		a := postJSON(t, rt.api.URL+c.path, c.body)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if a.status != 400 || json.Unmarshal(a.body, &e) != nil || e.Error.Message == "" || e.Error.Type != "BadRequestError" || e.Error.Code != 400 {
			t.Errorf("%s %s: %d %s", c.path, c.body, a.status, a.body)
		}
	}
	big := `{"model":"vllm-sim","prompt":"` + strings.Repeat("x", 5000) + `"}`
	if a := postJSON(t, rt.api.URL+"/v1/completions", big); a.status != 413 || !bytes.Contains(a.body, []byte(`"error"`)) {
		t.Fatalf("oversized body: %d %s", a.status, a.body)
	}
}

// A DP-2 engine: a shared prefix lands on the rank that holds it, pinned by the header.
func TestDPRankAffinity(t *testing.T) {
	sim := startSim(t, vllmsim.Config{DataParallelSize: 2})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("dp", sim)}), nil)
	rt.waitStreams(t, "exact")
	first := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(5, 320, 1, 3, 1))
	rank := first.header.Get("x-vllm-sim-rank")
	if first.status != 200 || first.header.Get("x-kvroute-engine") != "dp/"+rank {
		t.Fatalf("first: %d engine %q rank %q", first.status, first.header.Get("x-kvroute-engine"), rank)
	}
	testkit.WaitFor(t, waitBound, "blocks on the rank", func() bool {
		for _, ri := range rt.s.Engines()[0].Ranks {
			if fmt.Sprint(ri.Rank) == rank && ri.Blocks["GPU"] >= 20 {
				return true
			}
		}
		return false
	})
	for i := range 4 {
		a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(5, 320, 10+i, 8, 1))
		if a.header.Get("x-vllm-sim-rank") != rank || a.header.Get("x-kvroute-engine") != "dp/"+rank || a.cachedTokens(t) < 320 {
			t.Fatalf("request %d went to rank %q (%q), cached %d; want rank %s", i, a.header.Get("x-vllm-sim-rank"),
				a.header.Get("x-kvroute-engine"), a.cachedTokens(t), rank)
		}
	}
}
