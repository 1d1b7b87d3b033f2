package vllmsim

import (
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"testing"
)

// The sim's payloads are byte-for-byte those of the spec's vectors (testdata/vllm), which follow
// vLLM's msgspec encoding: the same requests give the same bytes in both layouts.
func TestPayloadsMatchVLLMVectors(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/vllm/vllm-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vec struct {
		KVEvents struct {
			TS   float64 `json:"ts"`
			Sets map[string][]struct {
				Label  string `json:"label"`
				Frames struct {
					Topic   string `json:"topic"`
					Payload string `json:"payload"`
				} `json:"zmq_frames_hex"`
			} `json:"sets"`
		} `json:"kv_events"`
	}
	if err := json.Unmarshal(raw, &vec); err != nil {
		t.Fatal(err)
	}
	for set, layout := range map[string]string{"map_v0.24plus__int_hashes": "map", "array_v0.22_v0.23__int_hashes": "array"} {
		msgs := vec.KVEvents.Sets[set]
		if len(msgs) != 4 {
			t.Fatalf("%s: %d messages in the vectors, want 4", set, len(msgs))
		}
		t.Run(layout, func(t *testing.T) {
			cfg := eventConfig()
			empty := ""
			cfg.KVEventsTopic, cfg.EventLayout = &empty, layout
			cfg.eventClock = func() float64 { return vec.KVEvents.TS }
			s := startSim(t, cfg)
			sub := subscribe(t, s.EventEndpoints()[0], "")
			check := func(label, wantHex string) {
				t.Helper()
				m, _ := recvBatch(t, sub)
				if len(m.Topic) != 0 {
					t.Errorf("%s: topic %q, want vLLM's empty default", label, m.Topic)
				}
				if got := hex.EncodeToString(m.Payload); got != wantHex {
					t.Errorf("%s payload\n got %s\nwant %s", label, got, wantHex)
				}
			}
			// seq 0: A = tokens 0..63; seq 1: B = 0..31 then 1000..1031, sharing A's first 2 blocks.
			complete(t, s, map[string]any{"prompt": seqTokens(0, 64)})
			check(msgs[0].Label, msgs[0].Frames.Payload)
			complete(t, s, map[string]any{"prompt": concat(seqTokens(0, 32), seqTokens(1000, 32))})
			check(msgs[1].Label, msgs[1].Frames.Payload)
			if r := post(t, s, "/reset_prefix_cache", ""); r.status != http.StatusOK {
				t.Fatalf("reset: %d", r.status)
			}
			check(msgs[3].Label, msgs[3].Frames.Payload) // AllBlocksCleared
		})
	}
}
