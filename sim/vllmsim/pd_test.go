package vllmsim

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/kvwire"
)

func pdConfig(role string) Config {
	cfg := eventConfig()
	cfg.KVTransfer = &KVTransfer{Connector: "NixlConnector", Role: role}
	return cfg
}

type transferAnswer struct {
	completionResponse
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

// prefill sends the prefill leg as vLLM's reference proxy does: max_tokens 1, no stream,
// do_remote_decode.
func prefill(t *testing.T, s *Sim, prompt []uint32) map[string]any {
	t.Helper()
	r := post(t, s, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}})
	if r.status != http.StatusOK {
		t.Fatalf("prefill: %d %s", r.status, r.body)
	}
	a := decodeJSON[transferAnswer](t, r)
	if a.KVTransferParams == nil {
		t.Fatalf("prefill answered without kv_transfer_params: %s", r.body)
	}
	return a.KVTransferParams
}

func decode(t *testing.T, s *Sim, prompt []uint32, params map[string]any) httpResult {
	t.Helper()
	return post(t, s, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4, "kv_transfer_params": params})
}

func metric(t *testing.T, s *Sim, name string, labels ...string) float64 {
	t.Helper()
	v, _ := testkit.Metric(string(get(t, s, "/metrics").body), name, labels...)
	return v
}

func TestPrefillDecodeHandoff(t *testing.T) {
	p := startSim(t, pdConfig("kv_producer"))
	d := startSim(t, pdConfig("kv_consumer"))
	sub := subscribe(t, d.EventEndpoints()[0], "")
	prompt := seqTokens(1000, 100) // 6 full blocks and 4 tokens

	params := prefill(t, p, prompt)
	ids, _ := params["remote_block_ids"].([]any)
	if params["do_remote_prefill"] != true || params["do_remote_decode"] != false || len(ids) != 7 ||
		params["remote_engine_id"] != p.EngineID() || params["tp_size"] != float64(1) ||
		fmt.Sprintf("%v:%v", params["remote_host"], params["remote_port"]) != p.SideChannelEndpoints()[0] {
		t.Fatalf("kv_transfer_params = %v (side channel %v)", params, p.SideChannelEndpoints())
	}
	if got := metric(t, p, "vllm_sim_kv_transfer_held_total"); got != 1 {
		t.Fatalf("held = %v, want 1", got)
	}

	r := decode(t, d, prompt, params)
	if r.status != http.StatusOK {
		t.Fatalf("decode: %d %s", r.status, r.body)
	}
	u := decodeJSON[completionResponse](t, r).Usage
	if u.PromptTokensDetails.CachedTokens != 99 || u.CompletionTokens != 4 {
		t.Fatalf("decode usage = %+v, want 99 cached (the prompt but its last token), 4 generated", u)
	}
	if got := metric(t, d, "vllm:prefix_cache_hits_total"); got != 0 {
		t.Fatalf("decode prefix-cache hits = %v: transferred blocks are no local hits", got)
	}
	_, b := recvBatch(t, sub)
	ev := b.Events[0]
	if ev.Type != kvwire.EventBlockStored || len(ev.Stored.BlockHashes) != 6 || ev.Stored.ParentBlockHash.OK {
		t.Fatalf("first decode-side event = %#v, want BlockStored of the 6 received full blocks", b.Events[0])
	}
	if got := metric(t, p, "vllm_sim_kv_transfer_pulled_total"); got != 1 {
		t.Fatalf("pulled = %v, want 1", got)
	}

	// The producer released the blocks once read: the same parameters again cannot be read, and
	// under kv_load_failure_policy recompute the decoder computes what it does not hold.
	r = decode(t, d, prompt, params)
	u = decodeJSON[completionResponse](t, r).Usage
	if r.status != http.StatusOK || u.PromptTokensDetails.CachedTokens != 96 {
		t.Fatalf("re-read: %d %+v, want 200 with the decoder's own 96 cached tokens", r.status, u)
	}
	if got := metric(t, d, "vllm_sim_kv_transfer_load_failures_total"); got != 1 {
		t.Fatalf("load failures = %v, want 1", got)
	}
}

func TestHeldBlocksExpireAndFailPolicy(t *testing.T) {
	pc := pdConfig("kv_producer")
	pc.KVTransfer.AbortTimeout = 50 * time.Millisecond
	p := startSim(t, pc)
	dc := pdConfig("kv_consumer")
	dc.KVTransfer.LoadFailurePolicy = "fail"
	d := startSim(t, dc)
	prompt := seqTokens(2000, 64)
	params := prefill(t, p, prompt)
	testkit.WaitFor(t, 5*time.Second, "the held blocks to expire", func() bool {
		return metric(t, p, "vllm_sim_kv_transfer_expired_total") == 1
	})
	r := decode(t, d, prompt, params)
	e := decodeJSON[errorBody](t, r)
	if r.status != http.StatusInternalServerError || !strings.Contains(e.Error.Message, "no blocks held") {
		t.Fatalf("decode of expired blocks under policy fail: %d %s", r.status, r.body)
	}
	// Incomplete parameters are no transfer: the request computes its prompt.
	r = decode(t, d, prompt, map[string]any{"do_remote_prefill": true})
	if r.status != http.StatusOK || decodeJSON[completionResponse](t, r).Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("incomplete params: %d %s", r.status, r.body)
	}
	if got := metric(t, d, "vllm_sim_kv_transfer_invalid_params_total"); got != 1 {
		t.Fatalf("invalid params = %v, want 1", got)
	}
}

func TestTransferTimeFollowsBandwidth(t *testing.T) {
	s, err := New(Config{BlockSize: 16, KVTransferBytesPerS: 1e9, KVBytesPerToken: 1 << 17})
	if err != nil {
		t.Fatal(err)
	}
	// 10 blocks x 16 tokens x 128 KiB = 20 MiB at 1 GB/s.
	if got, want := s.transferTime(10), time.Duration(float64(10*16*(1<<17))/1e9*float64(time.Second)); got != want {
		t.Fatalf("transferTime(10) = %v, want %v", got, want)
	}
	if s.transferTime(0) != 0 {
		t.Fatal("no blocks moved must cost nothing")
	}
}

func TestKVTransferConfigChecks(t *testing.T) {
	for _, kt := range []KVTransfer{{Connector: "NixlConnector"}, {Connector: "NixlConnector", Role: "kv_decoder"},
		{Connector: "NixlConnector", Role: "kv_both", LoadFailurePolicy: "retry"}} {
		if _, err := New(Config{KVTransfer: &kt}); err == nil {
			t.Errorf("%+v accepted", kt)
		}
	}
}
