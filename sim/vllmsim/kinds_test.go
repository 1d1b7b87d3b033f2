package vllmsim

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/router/engine"
	"github.com/kvroute/kvroute/router/kvwire"
)

// Each kind's batch, as the sim's own encoder writes it, decodes with the router's decoder for
// that kind to the same events; SGLang's events are positional arrays of seven, TensorRT-LLM's
// maps, and both send a hash with the top bit set as a negative int64 (msgpack int64 0xd3),
// never as vLLM's uint64 (0xcf).
func TestEngineKindWire(t *testing.T) {
	h, parent := uint64(0x8000_0000_0000_0001), uint64(7)
	gpu := "GPU"
	b := &wireBatch{ts: 1.5, rank: new(int64), events: []wireEvent{
		{kind: evStored, hashes: []uint64{h}, parent: &parent, tokens: []uint32{1, 2, 3, 4}, blockSize: 4, medium: &gpu},
		{kind: evRemoved, hashes: []uint64{h}, medium: &gpu},
		{kind: evCleared},
	}}
	for _, k := range []struct {
		kind string
		ek   engine.Kind
		head byte // the first event's msgpack header
	}{{KindSGLang, engine.SGLang, 0x97}, {KindTRTLLM, engine.TRTLLM, 0x88}} {
		payload, err := newEventEncoder().encodeKind(b, shapeE3, k.kind)
		if err != nil {
			t.Fatal(err)
		}
		// [ts float64 (9 bytes), [events...]: array header 0x93, cb + 8, 0x93, then event 0.
		if payload[11] != k.head {
			t.Errorf("%s: first event header %#x, want %#x", k.kind, payload[11], k.head)
		}
		if !strings.Contains(string(payload), "\xd3\x80\x00\x00\x00\x00\x00\x00\x01") || strings.Contains(string(payload), "\xcf") {
			t.Errorf("%s: hash not sent as a signed int64: % x", k.kind, payload)
		}
		got, err := kvwire.NewDecoderFor(k.ek).DecodeBatch(payload)
		if err != nil {
			t.Fatalf("%s: router decoder: %v", k.kind, err)
		}
		if k.kind == KindSGLang {
			salted := *b
			salted.events = []wireEvent{{kind: evStored, hashes: []uint64{h}, tokens: []uint32{1, 2, 3, 4}, blockSize: 4, medium: &gpu,
				extraKeys: [][]string{{"salt-1"}}, hasExtras: true}}
			p, err := newEventEncoder().encodeKind(&salted, shapeE3, k.kind)
			if err != nil {
				t.Fatal(err)
			}
			d, err := kvwire.NewDecoderFor(k.ek).DecodeBatch(p)
			if err != nil || d.Events[0].Stored.CacheSalt.V != "salt-1" {
				t.Errorf("SGLang salted event: %v %+v", err, d)
			}
		}
		if len(got.Events) != 3 || got.Events[0].Stored.BlockHashes[0].Uint64() != h || len(got.Events[0].Stored.TokenIDs) != 4 ||
			got.Events[0].Stored.ParentBlockHash.V.Uint64() != parent || got.Events[1].Removed.BlockHashes[0].Uint64() != h {
			t.Errorf("%s: decoded %+v", k.kind, got.Events)
		}
	}
}

// Each kind serves its own engine's routes and no other's: SGLang /tokenize text only and no
// render routes, sglang: gauges; TensorRT-LLM /_internal/tokenize, /prometheus/metrics and a
// 400 for vllm_xargs.
func TestEngineKindHTTP(t *testing.T) {
	cfg := fastConfig()
	cfg.EngineKind = KindSGLang
	s := startSim(t, cfg)
	if r := post(t, s, "/tokenize", `{"model":"m","prompt":"a b c"}`); r.status != 200 || !strings.Contains(string(r.body), `"max_model_len"`) {
		t.Errorf("SGLang /tokenize: %d %s", r.status, r.body)
	}
	if r := post(t, s, "/tokenize", `{"model":"m","messages":[{"role":"user","content":"x"}]}`); r.status != 400 {
		t.Errorf("SGLang /tokenize with messages: %d, want 400", r.status)
	}
	if r := post(t, s, "/v1/completions/render", `{"model":"m","prompt":"x"}`); r.status != 404 {
		t.Errorf("SGLang render route: %d, want 404", r.status)
	}
	if r := get(t, s, "/metrics"); !strings.Contains(string(r.body), `sglang:num_queue_reqs{dp_rank="0",model_name="m"} 0`) || strings.Contains(string(r.body), "vllm:") {
		t.Errorf("SGLang /metrics:\n%s", r.body)
	}
	cfg.EngineKind = KindTRTLLM
	s = startSim(t, cfg)
	if r := post(t, s, "/_internal/tokenize", `{"model":"m","prompt":"a b c"}`); r.status != 200 || !strings.Contains(string(r.body), `"tokens"`) {
		t.Errorf("TensorRT-LLM /_internal/tokenize: %d %s", r.status, r.body)
	}
	if r := post(t, s, "/tokenize", `{"model":"m","prompt":"x"}`); r.status != 404 {
		t.Errorf("TensorRT-LLM /tokenize: %d, want 404", r.status)
	}
	if r := post(t, s, "/v1/completions", `{"model":"m","prompt":"x","max_tokens":1,"vllm_xargs":{"kv_cache_report_mode":"full"}}`); r.status != 400 {
		t.Errorf("TensorRT-LLM with vllm_xargs: %d, want 400", r.status)
	}
	if r := get(t, s, "/prometheus/metrics"); !strings.Contains(string(r.body), `trtllm_kv_cache_utilization{model_name="m"}`) {
		t.Errorf("TensorRT-LLM /prometheus/metrics:\n%s", r.body)
	}
}
