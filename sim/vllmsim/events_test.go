package vllmsim

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/kvwire"
)

func eventConfig() Config {
	cfg := fastConfig()
	cfg.KVEventsPort = -1
	cfg.KVReplayPort = -1
	return cfg
}

// subscribe connects a real SUB socket and waits out ZMQ's slow-joiner window.
func subscribe(t *testing.T, endpoint, topic string) *zmq.Socket {
	t.Helper()
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	_ = sub.SetLinger(0)
	_ = sub.SetRcvtimeo(5 * time.Second)
	if err := sub.SetSubscribe(topic); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	return sub
}

// recvBatch reads one PUB message and decodes it with router/kvwire.
func recvBatch(t *testing.T, sub *zmq.Socket) (kvwire.Message, *kvwire.Batch) {
	t.Helper()
	frames, err := sub.RecvMessageBytes(0)
	if err != nil {
		t.Fatalf("no event message: %v", err)
	}
	m, err := kvwire.ParseFrames(frames)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kvwire.NewDecoder().DecodeBatch(m.Payload)
	if err != nil {
		t.Fatalf("decode seq %d: %v", m.Seq, err)
	}
	return m, b
}

// noMessage asserts nothing arrives within d.
func noMessage(t *testing.T, sub *zmq.Socket, d time.Duration) {
	t.Helper()
	_ = sub.SetRcvtimeo(d)
	defer func() { _ = sub.SetRcvtimeo(5 * time.Second) }()
	frames, err := sub.RecvMessageBytes(0)
	if err == nil {
		m, _ := kvwire.ParseFrames(frames)
		t.Fatalf("unexpected message seq %d", m.Seq)
	}
	if !errors.Is(err, zmq.Errno(syscall.EAGAIN)) {
		t.Fatalf("recv: %v", err)
	}
}

func wireInts(hs []kvwire.Hash) []uint64 {
	out := make([]uint64, len(hs))
	for i, h := range hs {
		out[i] = h.Uint64()
	}
	return out
}

func engineWire(t *testing.T, algo, seed string, tokens []uint32, id blockkey.Identity) []uint64 {
	t.Helper()
	a, _ := blockkey.ParseAlgo(algo)
	h, err := blockkey.NewEngineHasher(a, seed)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := h.HashPrompt(tokens, 16, id)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = blockkey.WireInt(d)
	}
	return out
}

func equalU64(a, b []uint64) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func complete(t *testing.T, s *Sim, body map[string]any, header ...string) completionResponse {
	t.Helper()
	if _, ok := body["model"]; !ok {
		body["model"] = "m"
	}
	if _, ok := body["max_tokens"]; !ok {
		body["max_tokens"] = 1
	}
	res := post(t, s, "/v1/completions", body, header...)
	if res.status != http.StatusOK {
		t.Fatalf("completion: status %d: %s", res.status, res.body)
	}
	return decodeJSON[completionResponse](t, res)
}

func TestBlockStoredHashesEqualEngineHash(t *testing.T) {
	for _, tc := range []struct{ algo, layout, seed string }{
		{"sha256", "map", "0"}, {"sha256_cbor", "array", "0"}, {"xxhash", "map", "42"}, {"xxhash_cbor", "map", "0"},
	} {
		t.Run(tc.algo+"/"+tc.layout, func(t *testing.T) {
			cfg := eventConfig()
			cfg.HashAlgo, cfg.EventLayout, cfg.HashSeed = tc.algo, tc.layout, tc.seed
			s := startSim(t, cfg)
			sub := subscribe(t, s.EventEndpoints()[0], s.Topic())

			a := concat(seqTokens(0, 64), []uint32{7})
			complete(t, s, map[string]any{"prompt": a})
			m, b := recvBatch(t, sub)
			if string(m.Topic) != s.Topic() || m.Seq != 0 || !b.DataParallelRank.OK || b.DataParallelRank.V != 0 || len(b.Events) != 1 {
				t.Fatalf("topic %q seq %d rank %+v events %d", m.Topic, m.Seq, b.DataParallelRank, len(b.Events))
			}
			wantLayout := kvwire.LayoutMap
			if tc.layout == "array" {
				wantLayout = kvwire.LayoutArray
			}
			st := b.Events[0].Stored
			if b.Layout != wantLayout || b.Events[0].Type != kvwire.EventBlockStored || st.ParentBlockHash.OK ||
				st.BlockSize != 16 || st.Medium.V != "GPU" || len(st.TokenIDs) != 64 || len(st.ExtraKeys.V) != 4 {
				t.Fatalf("layout %v, event %+v", b.Layout, b.Events[0])
			}
			wantA := engineWire(t, tc.algo, tc.seed, a, blockkey.Identity{})
			if got := wireInts(st.BlockHashes); !equalU64(got, wantA) {
				t.Fatalf("BlockStored hashes %v, engine hash %v", got, wantA)
			}

			// B shares A's first two blocks: its event chains from A1 and carries only its tail.
			bt := concat(seqTokens(0, 32), seqTokens(1000, 32), []uint32{9})
			c := complete(t, s, map[string]any{"prompt": bt})
			if c.Usage.PromptTokensDetails.CachedTokens != 32 {
				t.Errorf("cached_tokens %d, want 32", c.Usage.PromptTokensDetails.CachedTokens)
			}
			m, b = recvBatch(t, sub)
			st = b.Events[0].Stored
			wantB := engineWire(t, tc.algo, tc.seed, bt, blockkey.Identity{})
			if m.Seq != 1 || !st.ParentBlockHash.OK || st.ParentBlockHash.V.Uint64() != wantA[1] ||
				!equalU64(wireInts(st.BlockHashes), wantB[2:]) || st.TokenIDs[0] != 1000 || len(st.TokenIDs) != 32 {
				t.Fatalf("seq %d second event %+v, want parent %d hashes %v", m.Seq, st, wantA[1], wantB[2:])
			}
		})
	}
}

func TestLoRAAndCacheSaltExtraKeys(t *testing.T) {
	cfg := eventConfig()
	cfg.LoRAAdapters = []string{"adapter-a"}
	s := startSim(t, cfg)
	sub := subscribe(t, s.EventEndpoints()[0], "")
	toks := seqTokens(5, 40)
	complete(t, s, map[string]any{"model": "adapter-a", "prompt": toks, "cache_salt": "salt"})
	_, b := recvBatch(t, sub)
	st := b.Events[0].Stored
	id := blockkey.Identity{LoRAName: "adapter-a", CacheSalt: "salt"}
	want := engineWire(t, "sha256", "0", toks, id)
	if !equalU64(wireInts(st.BlockHashes), want) || st.LoRAName.V != "adapter-a" || st.LoRAID.V != 1 {
		t.Fatalf("event %+v, want hashes %v with lora adapter-a/1", st, want)
	}
	for i, ek := range st.ExtraKeys.V {
		if !ek.Equal(id.BlockExtras(nil, i, 16)) {
			t.Errorf("block %d extra keys %+v", i, ek)
		}
	}
	// The same tokens on the base model or without the salt are different KV: no hit.
	c := complete(t, s, map[string]any{"prompt": toks})
	if c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("base model hit %d tokens of a LoRA request's blocks", c.Usage.PromptTokensDetails.CachedTokens)
	}
	c = complete(t, s, map[string]any{"model": "adapter-a", "prompt": toks, "cache_salt": "salt"})
	if c.Usage.PromptTokensDetails.CachedTokens != 32 {
		t.Errorf("repeat hit %d tokens, want 32", c.Usage.PromptTokensDetails.CachedTokens)
	}
}

func TestDroppedBatchComesBackThroughReplay(t *testing.T) {
	cfg := eventConfig()
	cfg.DropEventEvery = 2
	s := startSim(t, cfg)
	sub := subscribe(t, s.EventEndpoints()[0], s.Topic())
	prompts := [][]uint32{seqTokens(0, 33), seqTokens(100, 33), seqTokens(200, 33)}
	for _, p := range prompts {
		complete(t, s, map[string]any{"prompt": p})
	}
	m0, _ := recvBatch(t, sub)
	m2, _ := recvBatch(t, sub)
	if m0.Seq != 0 || m2.Seq != 2 {
		t.Fatalf("live seqs %d, %d; want 0 then 2 (batch 1 dropped)", m0.Seq, m2.Seq)
	}

	dealer, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer dealer.Close()
	_ = dealer.SetLinger(0)
	_ = dealer.SetRcvtimeo(5 * time.Second)
	if err := dealer.Connect(s.ReplayEndpoints()[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := dealer.SendMessage(kvwire.ReplayRequest(1)); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for {
		frames, err := dealer.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay reply: %v", err)
		}
		if len(frames) != 4 {
			t.Fatalf("replay reply has %d frames, want PR #45177's 4 (topic, seq, payload with the topic frame)", len(frames))
		}
		m, end, err := kvwire.ParseReplayReply(frames)
		if err != nil {
			t.Fatal(err)
		}
		if end {
			if m.Seq != kvwire.EndSeq {
				t.Errorf("end marker seq %x", m.Seq)
			}
			break
		}
		if string(m.Topic) != s.Topic() {
			t.Errorf("replayed topic %q", m.Topic)
		}
		b, err := kvwire.NewDecoder().DecodeBatch(m.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if m.Seq == 1 {
			want := engineWire(t, "sha256", "0", prompts[1], blockkey.Identity{})
			if h := wireInts(b.Events[0].Stored.BlockHashes); !equalU64(h, want) {
				t.Errorf("replayed batch 1 hashes %v, want %v", h, want)
			}
		}
		got = append(got, m.Seq)
	}
	if !equalU64(got, []uint64{1, 2}) {
		t.Errorf("replayed seqs %v, want [1 2]", got)
	}
}

func TestEvictionEmitsBlockRemovedTailFirst(t *testing.T) {
	cfg := eventConfig()
	cfg.NumGPUBlocks = 5 // 4 usable blocks
	s := startSim(t, cfg)
	sub := subscribe(t, s.EventEndpoints()[0], "")
	a := seqTokens(0, 49) // 4 blocks, 3 of them full
	complete(t, s, map[string]any{"prompt": a})
	_, ba := recvBatch(t, sub)
	ha := wireInts(ba.Events[0].Stored.BlockHashes)
	if len(ha) != 3 {
		t.Fatalf("A stored %d blocks, want 3", len(ha))
	}
	// B needs 3 blocks: the free queue holds A's blocks tail first (partial, A2, A1, A0), so the
	// partial block and then A2 and A1 are reused, each eviction before the store that reuses it.
	b := seqTokens(500, 33)
	complete(t, s, map[string]any{"prompt": b})
	_, bb := recvBatch(t, sub)
	if len(bb.Events) != 3 || bb.Events[0].Type != kvwire.EventBlockRemoved || bb.Events[1].Type != kvwire.EventBlockRemoved ||
		bb.Events[2].Type != kvwire.EventBlockStored {
		t.Fatalf("batch %+v, want Removed, Removed, Stored", bb.Events)
	}
	if r0, r1 := bb.Events[0].Removed.BlockHashes[0].Uint64(), bb.Events[1].Removed.BlockHashes[0].Uint64(); r0 != ha[2] || r1 != ha[1] {
		t.Errorf("evicted %d, %d; want A2 %d then A1 %d", r0, r1, ha[2], ha[1])
	}
	st := s.CacheState().Ranks[0]
	want := append([]uint64{ha[0]}, engineWire(t, "sha256", "0", b, blockkey.Identity{})...)
	if len(st.Hashes) != 3 || !containsAll(st.Hashes, want) {
		t.Errorf("debug cache %v, want %v", st.Hashes, want)
	}
	// A's first block survived: a request on A's prefix still hits it.
	c := complete(t, s, map[string]any{"prompt": a})
	if c.Usage.PromptTokensDetails.CachedTokens != 16 {
		t.Errorf("A again hit %d tokens, want 16", c.Usage.PromptTokensDetails.CachedTokens)
	}
}

func containsAll(have, want []uint64) bool {
	set := map[uint64]bool{}
	for _, h := range have {
		set[h] = true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}

func TestFullReportModeReannouncesHits(t *testing.T) {
	s := startSim(t, eventConfig())
	sub := subscribe(t, s.EventEndpoints()[0], "")
	a := seqTokens(0, 40)
	complete(t, s, map[string]any{"prompt": a})
	recvBatch(t, sub)
	complete(t, s, map[string]any{"prompt": a})
	noMessage(t, sub, 200*time.Millisecond) // incremental mode: a pure hit stores nothing new
	complete(t, s, map[string]any{"prompt": a, "vllm_xargs": map[string]any{"kv_cache_report_mode": "full"}})
	_, b := recvBatch(t, sub)
	st := b.Events[0].Stored
	want := engineWire(t, "sha256", "0", a, blockkey.Identity{})
	if len(b.Events) != 1 || st.ParentBlockHash.OK || !equalU64(wireInts(st.BlockHashes), want) || len(st.TokenIDs) != 32 || st.TokenIDs[0] != 0 {
		t.Fatalf("full mode event %+v, want a re-announcement of %v from token 0", b.Events, want)
	}
}

func TestResetPrefixCacheAndRestart(t *testing.T) {
	s := startSim(t, eventConfig())
	sub := subscribe(t, s.EventEndpoints()[0], "")
	complete(t, s, map[string]any{"prompt": seqTokens(0, 40)})
	recvBatch(t, sub)
	if r := post(t, s, "/reset_prefix_cache", ""); r.status != http.StatusOK {
		t.Fatalf("reset: %d %s", r.status, r.body)
	}
	m, b := recvBatch(t, sub)
	if m.Seq != 1 || len(b.Events) != 1 || b.Events[0].Type != kvwire.EventAllBlocksCleared {
		t.Fatalf("seq %d events %+v, want AllBlocksCleared", m.Seq, b.Events)
	}
	if n := len(s.CacheState().Ranks[0].Hashes); n != 0 {
		t.Errorf("%d blocks cached after reset", n)
	}
	complete(t, s, map[string]any{"prompt": seqTokens(0, 40)})
	recvBatch(t, sub) // seq 2
	if r := post(t, s, "/debug/restart", ""); r.status != http.StatusOK {
		t.Fatalf("restart: %d", r.status)
	}
	if n := len(s.CacheState().Ranks[0].Hashes); n != 0 {
		t.Errorf("%d blocks cached after restart", n)
	}
	c := complete(t, s, map[string]any{"prompt": seqTokens(0, 40)})
	m, _ = recvBatch(t, sub)
	if m.Seq != 0 || c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("after restart: seq %d cached %d, want 0 and 0", m.Seq, c.Usage.PromptTokensDetails.CachedTokens)
	}
}

func TestStalledPublisherHoldsBatches(t *testing.T) {
	cfg := eventConfig()
	cfg.StallEventsAfter = 1
	s := startSim(t, cfg)
	sub := subscribe(t, s.EventEndpoints()[0], "")
	complete(t, s, map[string]any{"prompt": seqTokens(0, 20)})
	complete(t, s, map[string]any{"prompt": seqTokens(100, 20)})
	if m, _ := recvBatch(t, sub); m.Seq != 0 {
		t.Fatalf("first seq %d", m.Seq)
	}
	noMessage(t, sub, 300*time.Millisecond)
	if r := post(t, s, "/debug/events", map[string]any{"stall": false}); r.status != http.StatusOK {
		t.Fatalf("unstall: %d", r.status)
	}
	if m, _ := recvBatch(t, sub); m.Seq != 1 {
		t.Errorf("after unstall seq %d, want 1", m.Seq)
	}
	// Stalling by hand works the same way.
	if r := post(t, s, "/debug/events", map[string]any{"stall": true}); r.status != http.StatusOK {
		t.Fatalf("stall: %d", r.status)
	}
	complete(t, s, map[string]any{"prompt": seqTokens(200, 20)})
	noMessage(t, sub, 300*time.Millisecond)
	s.SetEventsStalled(false)
	if m, _ := recvBatch(t, sub); m.Seq != 2 {
		t.Errorf("after second unstall seq %d, want 2", m.Seq)
	}
	if r := post(t, s, "/debug/events", `{"stall": "yes"}`); r.status != http.StatusBadRequest {
		t.Errorf("bad stall body: status %d", r.status)
	}
}

func TestDataParallelRanksPublishOnTheirOwnPorts(t *testing.T) {
	cfg := eventConfig()
	cfg.DataParallelSize = 2
	s := startSim(t, cfg)
	eps := s.EventEndpoints()
	if len(eps) != 2 || eps[0] == eps[1] || len(s.ReplayEndpoints()) != 2 {
		t.Fatalf("endpoints %v replay %v", eps, s.ReplayEndpoints())
	}
	sub0, sub1 := subscribe(t, eps[0], ""), subscribe(t, eps[1], "")
	complete(t, s, map[string]any{"prompt": seqTokens(0, 20)}, "X-data-parallel-rank", "1")
	m, b := recvBatch(t, sub1)
	if m.Seq != 0 || b.DataParallelRank.V != 1 {
		t.Errorf("rank 1 stream: seq %d rank %v", m.Seq, b.DataParallelRank)
	}
	noMessage(t, sub0, 200*time.Millisecond)
	complete(t, s, map[string]any{"prompt": seqTokens(0, 20)}, "X-data-parallel-rank", "0")
	if m, b := recvBatch(t, sub0); m.Seq != 0 || b.DataParallelRank.V != 0 {
		t.Errorf("rank 0 stream: seq %d rank %v (each rank numbers from 0)", m.Seq, b.DataParallelRank)
	}
}

func TestConnectModeDialsTheRouter(t *testing.T) {
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_ = sub.SetLinger(0)
	_ = sub.SetRcvtimeo(5 * time.Second)
	_ = sub.SetSubscribe("kv@")
	if err := sub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := sub.GetLastEndpoint()
	cfg := fastConfig()
	cfg.KVEventsConnect = ep
	s := startSim(t, cfg)
	// libzmq quirk (zeromq/libzmq#2267): a bound SUB sends its subscription to connecting PUBs
	// only when it processes commands (a poll or read) after the PUB attached; without this the
	// messages are lost.
	time.Sleep(200 * time.Millisecond)
	_, _ = sub.RecvMessageBytes(zmq.DONTWAIT)
	time.Sleep(100 * time.Millisecond)
	complete(t, s, map[string]any{"prompt": seqTokens(0, 20)})
	m, _ := recvBatch(t, sub)
	if want := DefaultTopic("127.0.0.1", mustPort(t, s.Addr()), "m"); string(m.Topic) != want {
		t.Errorf("topic %q, want %q", m.Topic, want)
	}
}

func mustPort(t *testing.T, addr string) int {
	t.Helper()
	var port int
	if _, err := fmt.Sscanf(addr[strings.LastIndex(addr, ":")+1:], "%d", &port); err != nil {
		t.Fatal(err)
	}
	return port
}
