package kvevents

import (
	"testing"

	"github.com/kvroute/kvroute/router/engine"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

// SGLang and TensorRT-LLM streams over real ZMQ: each engine's encoding and replay framing (SGLang
// replays without the topic frame), a batch taken by the start-up replay and one live, the index
// mirroring the engine exactly, and vLLM's hash parity left off (their hashes are their own).
func TestEngineKindStreams(t *testing.T) {
	for _, kind := range []engine.Kind{engine.SGLang, engine.TRTLLM} {
		t.Run(string(kind), func(t *testing.T) {
			r := newRig(t, Options{})
			p := newPub(t, kvtest.Options{Kind: kind})
			c := newCache(t)
			st := must[kvwire.Event](t)
			publish(t, p, st(c.Store(toks(1, 3*testBS), 0)))
			cfg := StreamConfig{Engine: "e", Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Topic: p.Topic(), Kind: kind}
			if err := r.sub.Add(cfg); err != nil {
				t.Fatal(err)
			}
			r.waitStats("e", 0, "start-up replay", func(s Stats) bool { return s.Replays >= 1 && s.State != Replaying })
			if err := p.WaitSubscribers(1, 10e9); err != nil {
				t.Fatal(err)
			}
			publish(t, p, st(c.Store(toks(2, 2*testBS), 0)))
			s := r.waitMirror("e", 0, c, Exact)
			if s.BlocksStored != 5 || s.ParityChecked != 0 || s.TopicMismatches != 0 || s.BlockSize != testBS {
				t.Fatalf("stored %d, parity checked %d, topic mismatches %d, block size %d; want 5, 0, 0, %d",
					s.BlocksStored, s.ParityChecked, s.TopicMismatches, s.BlockSize, testBS)
			}
		})
	}
}
