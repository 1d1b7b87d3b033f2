package app

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// An SGLang-shaped and a TensorRT-LLM-shaped fleet (vllm-sim speaking each engine's event wire,
// tokenize route and /metrics page) are routed exactly: on a shared-prefix workload, every
// request's predicted cached tokens equal what the engine reports in its usage, the streams are
// exact without vLLM's hash parity, text prompts are tokenized through the engine's own route,
// and /debug/engines says which vLLM checks do not apply. vLLM runs the same workload as the
// reference.
func TestEngineKindsPredictedEqualsReported(t *testing.T) {
	for _, kind := range []string{"vllm", "sglang", "trtllm"} {
		t.Run(kind, func(t *testing.T) {
			f := startFleet(t, 2, vllmsim.Config{EngineKind: kind})
			rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) {
				o.Config.EngineKind = kind
				o.ProbeInterval = 0
			})
			rt.waitStreams(t, "exact")
			indexed := func() int {
				n := 0
				for _, e := range rt.s.Engines() {
					for _, r := range e.Ranks {
						n += r.Blocks["GPU"]
					}
				}
				return n
			}
			cached := func() int {
				n := 0
				for _, s := range f.sims {
					for _, r := range s.CacheState().Ranks {
						n += len(r.Hashes)
					}
				}
				return n
			}
			reported := 0
			for i := range 12 {
				var body string
				if i%2 == 0 {
					body = idsPrompt(i%3, 96, i, 20, 1) // three shared prefixes, distinct tails
				} else {
					body = fmt.Sprintf(`{"model":"vllm-sim","max_tokens":1,"prompt":"%s tail %d"}`,
						strings.Repeat("the shared system prompt of this workload says the same words ", 6), i)
				}
				a := postJSON(t, rt.api.URL+"/v1/completions", body)
				if a.status != 200 {
					t.Fatalf("request %d: %d %s", i, a.status, a.body)
				}
				reported += a.cachedTokens(t)
				// The next decision sees every block this one stored (no race with the events).
				testkit.WaitFor(t, waitBound, "index caught up with the engines", func() bool { return indexed() == cached() })
			}
			var pred, act float64
			for _, n := range f.names {
				pred += testutil.ToFloat64(rt.s.met.ModePredictedCached.WithLabelValues(n, modeExact))
				act += testutil.ToFloat64(rt.s.met.ModeActualCached.WithLabelValues(n, modeExact))
			}
			if pred == 0 || pred != act || int(act) != reported {
				t.Fatalf("%s: predicted %v, reported %v (usage summed %d): want equal and > 0", kind, pred, act, reported)
			}
			if n := testutil.ToFloat64(rt.s.met.TokenizeSource.WithLabelValues("engine")); n == 0 {
				t.Errorf("%s: no text prompt was tokenized through the engine", kind)
			}
			for _, e := range rt.s.Engines() {
				if e.Kind != kind || (kind != "vllm") != (len(e.NotApplicable) > 0) {
					t.Errorf("%s: /debug/engines says kind %q, not applicable %q", kind, e.Kind, e.NotApplicable)
				}
			}
			t.Logf("%s: predicted = reported = %v cached tokens over 12 requests", kind, act)
		})
	}
}

// A fleet runs one engine kind: an SGLang engine discovered by a vLLM router is refused, not
// routed to, counted on /metrics and listed in /debug/engines with why; the vLLM engine beside
// it is routed as usual.
func TestMixedFleetRefused(t *testing.T) {
	f := startFleet(t, 2, vllmsim.Config{})
	es := f.engines()
	es[1].Kind = "sglang"
	rt := startRouter(t, discovery.NewStatic(es), noHealthLoop)
	if n := testutil.ToFloat64(rt.s.met.EnginesRefused); n != 1 {
		t.Fatalf("engines refused %v, want 1", n)
	}
	var refused, routed int
	for _, e := range rt.s.Engines() {
		switch {
		case e.Name == "e1" && strings.Contains(e.Refused, "kind=sglang but the router runs vllm engines") && len(e.Ranks) == 0:
			refused++
		case e.Name == "e0" && e.Refused == "" && len(e.Ranks) == 1:
			routed++
		}
	}
	if refused != 1 || routed != 1 {
		t.Fatalf("/debug/engines: %+v", rt.s.Engines())
	}
	for range 4 {
		if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 32, 2, 8, 1)); a.status != 200 || a.header.Get("x-kvroute-engine") == "e1" {
			t.Fatalf("answer %d from %q", a.status, a.header.Get("x-kvroute-engine"))
		}
	}
}

// trtllm-serve has no served-name option: its /v1/models lists the model path, and it answers
// a request naming any model (tensorrt_llm/serve/openai_server.py at 00057725d959). The
// operator gives the router the spec's name, so a TensorRT-LLM fleet sees requests under the
// spec's name, the path and whatever a client sends; all are the one base model. Keyed as
// LoRA adapters (what a vLLM fleet does with a name it does not serve), the requests under a
// name other than the router's would predict 0 cached tokens where the engine reports a hit.
func TestTRTLLMAnyModelNameIsTheBaseModel(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{EngineKind: "trtllm", Model: "org/llama-path"})
	rt := startRouter(t, discovery.NewStatic(f.engines()), func(o *Options) {
		o.Config.EngineKind = "trtllm"
		o.ProbeInterval = 0
	})
	rt.waitStreams(t, "exact")
	reported := 0
	for i, model := range []string{"org/llama-path", "llama", "any-name", "llama"} {
		body := strings.Replace(idsPrompt(0, 96, i, 20, 1), `"vllm-sim"`, `"`+model+`"`, 1)
		a := postJSON(t, rt.api.URL+"/v1/completions", body)
		if a.status != 200 || !strings.Contains(string(a.body), `"model":"`+model+`"`) {
			t.Fatalf("request %d naming %q: %d %s; want 200 answered under the name asked", i, model, a.status, a.body)
		}
		got := a.cachedTokens(t)
		if pred := a.header.Get("x-kvroute-predicted-cached-tokens"); pred != fmt.Sprint(got) {
			t.Fatalf("request %d naming %q: predicted %s, engine cached %d", i, model, pred, got)
		}
		if i > 0 && got == 0 {
			t.Fatalf("request %d naming %q: the shared prefix was not cached", i, model)
		}
		reported += got
		testkit.WaitFor(t, waitBound, "index caught up", func() bool {
			n := 0
			for _, e := range rt.s.Engines() {
				for _, r := range e.Ranks {
					n += r.Blocks["GPU"]
				}
			}
			return n == len(f.sims[0].CacheState().Ranks[0].Hashes)
		})
	}
	t.Logf("trtllm: four model names, %d cached tokens reported and predicted", reported)
}

// The operator's TensorRT-LLM pods share one config, so they publish one topic,
// <prefix>@<engine Deployment>@<model>, and say so in the kv-events-topic annotation
// (discovery.Engine.Topic). The router expects that topic from each of them, on the stream it
// dials to each pod's own port; expecting <prefix>@<host>@<model> would drop every batch as a
// topic mismatch, and the index would stay empty.
func TestAnnouncedTopicIsExpected(t *testing.T) {
	topic := "kv@llama-engine@vllm-sim"
	f := startFleet(t, 2, vllmsim.Config{EngineKind: "trtllm", KVEventsTopic: &topic})
	es := f.engines()
	for i := range es {
		es[i].Topic = topic
	}
	rt := startRouter(t, discovery.NewStatic(es), func(o *Options) {
		o.Config.EngineKind = "trtllm"
		o.ProbeInterval = 0
	})
	rt.waitStreams(t, "exact")
	for i := range 2 {
		a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 96, i, 20, 1))
		got := a.cachedTokens(t)
		if a.status != 200 || a.header.Get("x-kvroute-predicted-cached-tokens") != fmt.Sprint(got) {
			t.Fatalf("request %d: %d predicted %s cached %d", i, a.status, a.header.Get("x-kvroute-predicted-cached-tokens"), got)
		}
		testkit.WaitFor(t, waitBound, "index caught up", func() bool {
			n := 0
			for _, e := range rt.s.Engines() {
				for _, r := range e.Ranks {
					n += r.Blocks["GPU"]
				}
			}
			c := 0
			for _, s := range f.sims {
				c += len(s.CacheState().Ranks[0].Hashes)
			}
			return n == c && c > 0
		})
	}
}
