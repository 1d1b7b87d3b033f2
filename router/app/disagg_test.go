package app

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/testkit"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// /debug/engines shows each engine's pool as discovery reported it (the operator's role label
// on a disaggregated model's pods), and nothing for an aggregated engine.
func TestDebugEnginesShowRole(t *testing.T) {
	f := startFleet(t, 3, vllmsim.Config{})
	es := f.engines()
	es[0].Role, es[1].Role = config.RolePrefill, config.RoleDecode
	rt := startRouter(t, discovery.NewStatic(es), nil)
	rt.waitStreams(t, "exact")
	got := map[string]string{}
	for _, e := range rt.s.Engines() {
		got[e.Name] = e.Role
	}
	want := map[string]string{es[0].Name: config.RolePrefill, es[1].Name: config.RoleDecode, es[2].Name: ""}
	for n, r := range want {
		if got[n] != r {
			t.Errorf("engine %s: role %q, want %q (all: %v)", n, got[n], r, got)
		}
	}
}

// pdFleet starts two prefill and two decode vllm-sims (NIXL, kv_both, as the operator renders
// both pools) behind a router whose split threshold is min.
func pdFleet(t *testing.T, min int) (*router, []discovery.Engine) {
	t.Helper()
	f := startFleet(t, 4, vllmsim.Config{KVTransfer: &vllmsim.KVTransfer{Connector: "NixlConnector", Role: "kv_both"}})
	es := f.engines()
	es[0].Role, es[1].Role = config.RolePrefill, config.RolePrefill
	es[2].Role, es[3].Role = config.RoleDecode, config.RoleDecode
	rt := startRouter(t, discovery.NewStatic(es), func(o *Options) { o.DisaggMinUncached = min })
	rt.waitStreams(t, "exact")
	return rt, es
}

// streamUsage posts a streamed request and returns the answer's engine header, its text
// events' count and the usage chunk's cached and completion tokens.
func streamUsage(t *testing.T, url, body string) (engine string, chunks, cached, completion int) {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	cached, completion = -1, -1
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			continue
		}
		var ch struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *struct {
				CompletionTokens int `json:"completion_tokens"`
				Details          *struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
			KV json.RawMessage `json:"kv_transfer_params"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		chunks += len(ch.Choices)
		if ch.Usage != nil && ch.Usage.Details != nil {
			cached, completion = ch.Usage.Details.Cached, ch.Usage.CompletionTokens
		}
	}
	if !done {
		t.Fatal("the stream ended without [DONE]")
	}
	return resp.Header.Get("x-kvroute-engine"), chunks, cached, completion
}

func accuracyOf(rt *router, name string) Accuracy {
	for _, e := range rt.s.Engines() {
		if e.Name == name {
			return e.Ranks[0].Accuracy
		}
	}
	return Accuracy{}
}

func ledgerEmpty(rt *router) bool {
	for _, e := range rt.s.Engines() {
		for _, r := range e.Ranks {
			if r.Inflight != (Inflight{}) {
				return false
			}
		}
	}
	return true
}

// A request on a fleet with both pools is split: its prefill leg on a prefill replica, its
// decode leg (the prefill answer's kv_transfer_params) on a decode replica streaming the one
// answer the client gets, with vLLM's decode usage (the pulled prompt as cached). Both picks
// are booked and ended (the ledger is empty after), each pool's prediction is compared with
// what its engine reported, and a short prompt, then a prompt the decode pool already holds,
// go whole to a decode replica, each counted with its reason.
func TestDisaggSplitsAndSkipsTheSplit(t *testing.T) {
	rt, _ := pdFleet(t, 64)
	body := strings.Replace(idsPrompt(1, 200, 0, 0, 5), `"max_tokens"`, `"stream":true,"stream_options":{"include_usage":true},"max_tokens"`, 1)
	engine, chunks, cached, completion := streamUsage(t, rt.api.URL, body)
	if engine != "e2" && engine != "e3" {
		t.Fatalf("answer from %q, want a decode engine (e2, e3)", engine)
	}
	if chunks < 5 || cached != 199 || completion != 5 {
		t.Fatalf("split answer: %d choice events, usage cached %d completion %d; want >= 5, 199 (pulled from the prefill engine), 5", chunks, cached, completion)
	}
	testkit.WaitFor(t, waitBound, "both picks ended in the ledger", func() bool { return ledgerEmpty(rt) })
	pre := accuracyOf(rt, "e0")
	if p1 := accuracyOf(rt, "e1"); p1.Responses > 0 {
		pre = p1
	}
	if pre.Responses != 1 || pre.WithUsage != 1 || pre.PredictedCached != pre.ActualCached {
		t.Errorf("prefill pool: %+v, want one answer with usage, predicted = reported", pre)
	}
	dec := accuracyOf(rt, engine)
	if dec.Responses != 1 || dec.PredictedCached != 199 || dec.ActualCached != 199 {
		t.Errorf("decode pool (%s): %+v, want one answer, predicted = reported = 199", engine, dec)
	}
	m := scrape(t, rt)
	if !strings.Contains(m, `kvroute_router_disagg_requests_total{path="split",reason=""} 1`) {
		t.Errorf("split not counted:\n%s", grepLines(m, "disagg"))
	}

	// A short prompt: decode-only, the prefill pool untouched.
	if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(2, 20, 0, 0, 3)); a.status != 200 ||
		(a.header.Get("x-kvroute-engine") != "e2" && a.header.Get("x-kvroute-engine") != "e3") {
		t.Fatalf("short prompt: %d from %q: %s", a.status, a.header.Get("x-kvroute-engine"), a.body)
	}
	// The decode engine announced the pulled blocks (BlockStored): the same prompt now leaves
	// 8 uncached tokens there, under the threshold.
	testkit.WaitFor(t, waitBound, "the decode engine's pulled blocks in the index", func() bool {
		for _, e := range rt.s.Engines() {
			if e.Name == engine {
				n := 0
				for _, b := range e.Ranks[0].Blocks {
					n += b
				}
				return n >= 12
			}
		}
		return false
	})
	a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 200, 0, 0, 3))
	if a.status != 200 || a.header.Get("x-kvroute-engine") != engine || a.cachedTokens(t) != 192 {
		t.Fatalf("cached prompt: %d from %q (cached %d), want the decode engine %s holding 192 tokens: %s",
			a.status, a.header.Get("x-kvroute-engine"), a.cachedTokens(t), engine, a.body)
	}
	m = scrape(t, rt)
	for _, want := range []string{`path="decode_only",reason="short_prompt"} 1`, `path="decode_only",reason="cached_prefix"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("missing %s:\n%s", want, grepLines(m, "disagg"))
		}
	}
	if got := accuracyOf(rt, "e0").Responses + accuracyOf(rt, "e1").Responses; got != 1 {
		t.Errorf("prefill pool answered %d legs, want 1 (decode-only requests do not touch it)", got)
	}
	// A non-streamed split: the decode engine's whole answer, with its usage.
	a = postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(5, 300, 0, 0, 4))
	if e := a.header.Get("x-kvroute-engine"); a.status != 200 || (e != "e2" && e != "e3") || a.cachedTokens(t) != 299 {
		t.Fatalf("non-streamed split: %d from %q: %s", a.status, e, a.body)
	}
	if m = scrape(t, rt); !strings.Contains(m, `kvroute_router_disagg_requests_total{path="split",reason=""} 2`) {
		t.Errorf("second split not counted:\n%s", grepLines(m, "disagg"))
	}
	testkit.WaitFor(t, waitBound, "every request ended in the ledger", func() bool { return ledgerEmpty(rt) })
	if d := rt.s.disaggInfo(pools(rt.s.reps())); d.PrefillReplicas != 2 || d.DecodeReplicas != 2 || !d.Splitting {
		t.Errorf("/debug/engines disaggregation: %+v", d)
	}
}

// A prefill leg that fails with no retry left sends the request whole to a decode replica:
// the client gets its answer, the fallback is counted with its reason, and nothing stays in
// the ledger.
func TestDisaggPrefillFailureFallsBackToDecode(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{KVTransfer: &vllmsim.KVTransfer{Connector: "NixlConnector", Role: "kv_both"}})
	es := f.engines()
	es[0].Role, es[1].Role = config.RolePrefill, config.RoleDecode
	rt := startRouter(t, discovery.NewStatic(es), func(o *Options) {
		o.Config.Disaggregation = &config.Disaggregation{MinUncachedTokens: -1} // split every request
	})
	rt.waitStreams(t, "exact")
	if d := rt.s.disaggInfo(pools(rt.s.reps())); d.MinUncached != -1 {
		t.Fatalf("threshold %d, want the config file's -1", d.MinUncached)
	}
	_ = f.sims[0].Close() // the prefill pool's only engine goes away: its dial is refused
	for i := range 2 {
		a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(3+i, 100, 0, 0, 3))
		if a.status != 200 || a.header.Get("x-kvroute-engine") != "e1" {
			t.Fatalf("request %d: %d from %q: %s", i, a.status, a.header.Get("x-kvroute-engine"), a.body)
		}
	}
	m := scrape(t, rt)
	// The first finds the refused dial; the second finds the engine out of routing.
	for _, want := range []string{`path="fallback",reason="connect"} 1`, `path="fallback",reason="no_prefill_replica"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("missing %s:\n%s", want, grepLines(m, "disagg"))
		}
	}
	testkit.WaitFor(t, waitBound, "every attempt ended in the ledger", func() bool { return ledgerEmpty(rt) })
}

// The decode pick is booked first, as a decode leg: while the prefill leg computes the prompt
// on the prefill replica, the decode replica already carries the request, its pulled prompt
// booked as transfer and only the recomputed last token as prefill (vLLM keeps a request
// waiting for remote KV off its prefill steps). Booked as before (the decode replica picked
// after the prefill answer, its whole uncached prompt as prefill until the first token), the
// condition below never holds.
func TestDisaggDecodeLegBookedAsTransfer(t *testing.T) {
	cfg := vllmsim.Config{KVTransfer: &vllmsim.KVTransfer{Connector: "NixlConnector", Role: "kv_both"},
		StepModel: "flat", PrefillTokensPerS: 400, DecodeMsPerToken: 100}
	f := startFleet(t, 2, cfg)
	es := f.engines()
	es[0].Role, es[1].Role = config.RolePrefill, config.RoleDecode
	rt := startRouter(t, discovery.NewStatic(es), func(o *Options) { o.DisaggMinUncached = -1 })
	rt.waitStreams(t, "exact")
	done := make(chan answer, 1)
	go func() { done <- postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(7, 400, 0, 0, 6)) }()
	inflight := func(name string) Inflight {
		for _, e := range rt.s.Engines() {
			if e.Name == name {
				return e.Ranks[0].Inflight
			}
		}
		return Inflight{}
	}
	var pre, dec Inflight
	if !testkit.Until(waitBound, func() bool {
		pre, dec = inflight("e0"), inflight("e1")
		return pre.PrefillTokens == 400 && dec.TransferTokens == 399 && dec.PrefillTokens == 1 && dec.PrefillHeldTokens == 400
	}) {
		t.Fatalf("the decode leg not booked as transfer while the prefill leg runs: prefill replica %+v, decode replica %+v", pre, dec)
	}
	a := <-done
	if a.status != 200 || a.header.Get("x-kvroute-engine") != "e1" || a.cachedTokens(t) != 399 {
		t.Fatalf("split answer: %d from %q: %s", a.status, a.header.Get("x-kvroute-engine"), a.body)
	}
	testkit.WaitFor(t, waitBound, "both legs ended in the ledger", func() bool { return ledgerEmpty(rt) })
	if acc := accuracyOf(rt, "e1"); acc.PredictedCached != 399 || acc.ActualCached != 399 {
		t.Errorf("decode pool: %+v, want predicted = reported = 399", acc)
	}
}

// A Messages request splits like chat (vLLM's Messages API carries kv_transfer_params both
// ways): its answer comes from the decode pool with the pulled prompt as
// cache_read_input_tokens, both pools' predictions equal what their engines reported. A
// Responses request (vLLM's Responses API carries no kv_transfer_params) goes whole to the
// decode pool, counted with its reason.
func TestDisaggMessagesSplitResponsesWhole(t *testing.T) {
	rt, _ := pdFleet(t, -1)
	long := strings.Repeat("a long shared system prompt ", 60)
	body := fmt.Sprintf(`{"model":"vllm-sim","max_tokens":3,"system":%q,"messages":[{"role":"user","content":"question"}]}`, long)
	a := postJSON(t, rt.api.URL+"/v1/messages", body)
	e := a.header.Get("x-kvroute-engine")
	var msg struct {
		Type  string
		Usage struct {
			Input  int `json:"input_tokens"`
			Cached int `json:"cache_read_input_tokens"`
		}
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if a.status != 200 || (e != "e2" && e != "e3") || json.Unmarshal(a.body, &msg) != nil || msg.Type != "message" ||
		msg.Usage.Input < 100 || msg.Usage.Cached != msg.Usage.Input-1 {
		t.Fatalf("Messages split: %d from %q: %s", a.status, e, a.body)
	}
	m := scrape(t, rt)
	if !strings.Contains(m, `kvroute_router_disagg_requests_total{path="split",reason=""} 1`) {
		t.Errorf("Messages split not counted:\n%s", grepLines(m, "disagg"))
	}
	testkit.WaitFor(t, waitBound, "both legs ended in the ledger", func() bool { return ledgerEmpty(rt) })
	for _, name := range []string{"e0", "e1", e} {
		if acc := accuracyOf(rt, name); acc.PredictedCached != acc.ActualCached {
			t.Errorf("%s: %+v, want predicted = reported", name, acc)
		}
	}
	if got := accuracyOf(rt, "e0").Responses + accuracyOf(rt, "e1").Responses; got != 1 {
		t.Errorf("prefill pool answered %d legs, want 1", got)
	}

	r := postJSON(t, rt.api.URL+"/v1/responses", fmt.Sprintf(`{"model":"vllm-sim","max_output_tokens":2,"input":%q,"store":false}`, long))
	if e := r.header.Get("x-kvroute-engine"); r.status != 200 || (e != "e2" && e != "e3") {
		t.Fatalf("Responses: %d from %q: %s", r.status, e, r.body)
	}
	if m = scrape(t, rt); !strings.Contains(m, `kvroute_router_disagg_requests_total{path="decode_only",reason="api_unsupported"} 1`) {
		t.Errorf("Responses not counted as decode-only:\n%s", grepLines(m, "disagg"))
	}
}
