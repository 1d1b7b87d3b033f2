package vllmsim

import (
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
)

// freePair is a port p with p and p+1 free on 127.0.0.1.
func freePair(t *testing.T, avoid int) int {
	t.Helper()
	for tries := 0; tries < 100; tries++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if p+1 > 65535 || p == avoid || p == avoid+1 || p+1 == avoid {
			continue
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1)); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

// Whole bind endpoints (vLLM's --kv-events-config) are offset by the rank, events and replay.
func TestBindEndpointsPerRank(t *testing.T) {
	ev := freePair(t, 0)
	rep := freePair(t, ev)
	cfg := fastConfig()
	cfg.DataParallelSize = 2
	cfg.KVEventsBind, cfg.KVReplayBind = fmt.Sprintf("tcp://127.0.0.1:%d", ev), fmt.Sprintf("tcp://127.0.0.1:%d", rep)
	s := startSim(t, cfg)
	want := func(p int) []string {
		return []string{fmt.Sprintf("tcp://127.0.0.1:%d", p), fmt.Sprintf("tcp://127.0.0.1:%d", p+1)}
	}
	if got := s.EventEndpoints(); !reflect.DeepEqual(got, want(ev)) {
		t.Errorf("events bound on %v, want %v", got, want(ev))
	}
	if got := s.ReplayEndpoints(); !reflect.DeepEqual(got, want(rep)) {
		t.Errorf("replay bound on %v, want %v", got, want(rep))
	}
	cfg.KVEventsPort = 5557
	if _, err := New(cfg); err == nil {
		t.Error("a bind endpoint and --kv-events-port together were accepted")
	}
}

// Without --enable-prompt-tokens-details vLLM's usage has no prompt_tokens_details; with the
// option off the simulator's neither, streamed or whole.
func TestOmitPromptTokensDetails(t *testing.T) {
	cfg := fastConfig()
	cfg.OmitPromptTokensDetails = true
	s := startSim(t, cfg)
	whole := post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(1, 40), "max_tokens": 2})
	streamed := post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(1, 40), "max_tokens": 2,
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	for name, r := range map[string]httpResult{"whole": whole, "streamed": streamed} {
		if r.status != 200 || !strings.Contains(string(r.body), `"prompt_tokens":40`) || strings.Contains(string(r.body), "prompt_tokens_details") {
			t.Errorf("%s: status %d, body %s", name, r.status, r.body)
		}
	}
	cfg.OmitPromptTokensDetails = false
	s = startSim(t, cfg)
	if r := post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(1, 40), "max_tokens": 2}); !strings.Contains(string(r.body), `"prompt_tokens_details":{"cached_tokens":0}`) {
		t.Errorf("default: body %s", r.body)
	}
}
