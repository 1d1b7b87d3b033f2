package vllmsim

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/kvwire"
)

func snapshotConfig() Config {
	cfg := eventConfig()
	cfg.KVSnapshotPort = -1
	return cfg
}

// With a snapshot endpoint the sim frames every batch with a 24-byte sequence (seq and its
// process's publisher id) and, idle, sends an empty batch every second; a restart draws a new id.
func TestSnapshotModeFramesAndHeartbeats(t *testing.T) {
	s := startSim(t, snapshotConfig())
	sub := subscribe(t, s.EventEndpoints()[0], "")
	complete(t, s, map[string]any{"prompt": seqTokens(0, 40)})
	m, b := recvBatch(t, sub)
	for len(b.Events) == 0 { // heartbeats sent before the request's batch
		m, b = recvBatch(t, sub)
	}
	if !m.HasPublisher {
		t.Fatal("a batch without the publisher id")
	}
	hb, hbb := recvBatch(t, sub) // nothing else happens: the next message is a heartbeat
	if hb.Seq != m.Seq+1 || hb.Publisher != m.Publisher || len(hbb.Events) != 0 {
		t.Fatalf("heartbeat seq %d publisher %x events %d; want %d, %x, 0", hb.Seq, hb.Publisher, len(hbb.Events), m.Seq+1, m.Publisher)
	}
	if r := post(t, s, "/debug/restart", ""); r.status != http.StatusOK {
		t.Fatalf("restart: %d", r.status)
	}
	for {
		next, _ := recvBatch(t, sub)
		if next.Publisher != m.Publisher {
			if next.Seq != 0 {
				t.Fatalf("the new process's first batch has seq %d", next.Seq)
			}
			break
		}
	}
}

// End to end over real ZMQ: the router's subscriber indexes the sim's 24-byte-frame batches and
// takes a restart for what it is from the publisher id alone.
func TestRouterFollowsSnapshotFramesAndPublisherRestart(t *testing.T) {
	s := startSim(t, snapshotConfig())
	ix := index.New(index.Options{})
	sub, err := kvevents.New(kvevents.Options{Index: ix, ReplayTimeout: 2 * time.Second,
		Ingest: kvevents.IngestOptions{BlockSize: s.Config().BlockSize, CopyPerStore: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	if err := sub.Add(kvevents.StreamConfig{Engine: "sim", Endpoint: s.EventEndpoints()[0],
		ReplayEndpoint: s.ReplayEndpoints()[0], Topic: s.Topic()}); err != nil {
		t.Fatal(err)
	}
	stats := func() kvevents.Stats { st, _ := sub.Stats("sim", 0); return st }
	id, _ := ix.Replica("sim", 0)
	gpu := func() int { st, _ := ix.Stats(id); return st.Blocks[index.GPU] }
	// The SUB's first heartbeat shows the subscription is live.
	waitFor(t, "a heartbeat", func() bool { return stats().Heartbeats > 0 })
	complete(t, s, map[string]any{"prompt": seqTokens(0, 48)})
	waitFor(t, "3 blocks indexed", func() bool { return gpu() == 3 && stats().State == kvevents.Exact })
	first := stats().Publisher
	if len(first) != 2*kvwire.PublisherIDLen {
		t.Fatalf("publisher id %q", first)
	}

	if r := post(t, s, "/debug/restart", ""); r.status != http.StatusOK {
		t.Fatalf("restart: %d", r.status)
	}
	waitFor(t, "the restart seen", func() bool { return stats().PublisherRestarts == 1 })
	complete(t, s, map[string]any{"prompt": seqTokens(1000, 32)})
	waitFor(t, "the new process's 2 blocks, the old ones gone", func() bool { return gpu() == 2 && stats().State == kvevents.Exact })
	st := stats()
	if st.Publisher == first || st.Resets != 1 || st.Backwards+st.SilentRestarts != 0 {
		t.Fatalf("publisher %s (was %s) resets %d backwards %d silent %d", st.Publisher, first, st.Resets, st.Backwards, st.SilentRestarts)
	}
}

// A lone router started after the engine's ring wrapped: from the ring alone it could only
// start approximate (partial); from the engine's snapshot it is exact within seconds, its index
// holding exactly the engine's cache.
func TestLateRouterIsExactFromSnapshot(t *testing.T) {
	cfg := snapshotConfig()
	cfg.BufferSteps = 4
	cfg.NumGPUBlocks = 16 // evictions: the snapshot states removed copies too
	s := startSim(t, cfg)
	for i := range 12 { // a batch or more each: the 4-batch ring wraps
		complete(t, s, map[string]any{"prompt": seqTokens(100*i, 40)})
	}
	// The control: from the ring alone the router starts partial, not exact.
	ringOnly, err := kvevents.New(kvevents.Options{Index: index.New(index.Options{}), ReplayTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ringOnly.Close() })
	if err := ringOnly.Add(kvevents.StreamConfig{Engine: "sim", Endpoint: s.EventEndpoints()[0], ReplayEndpoint: s.ReplayEndpoints()[0],
		Topic: s.Topic()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ring-only router's replay", func() bool {
		st, _ := ringOnly.Stats("sim", 0)
		return st.Replays > 0 && st.State != kvevents.Replaying && st.Applied > 0
	})
	if st, _ := ringOnly.Stats("sim", 0); st.State == kvevents.Exact || !st.Partial {
		t.Fatalf("ring-only router: state %v partial %v; the ring should have wrapped", st.State, st.Partial)
	}

	ix := index.New(index.Options{})
	// CopyPerStore off (a router injecting full report mode): the snapshot's stores still count
	// as copies, so its trailing removals take away only the excess.
	sub, err := kvevents.New(kvevents.Options{Index: ix, ReplayTimeout: 2 * time.Second,
		Ingest: kvevents.IngestOptions{BlockSize: s.Config().BlockSize}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	if err := sub.Add(kvevents.StreamConfig{Engine: "sim", Endpoint: s.EventEndpoints()[0], ReplayEndpoint: s.ReplayEndpoints()[0],
		SnapshotEndpoint: s.SnapshotEndpoints()[0], Topic: s.Topic()}); err != nil {
		t.Fatal(err)
	}
	id, _ := ix.Replica("sim", 0)
	engine := func() map[uint64]bool {
		out := map[uint64]bool{}
		for _, h := range s.CacheState().Ranks[0].Hashes {
			out[h] = true
		}
		return out
	}
	mirrors := func() bool {
		st, _ := sub.Stats("sim", 0)
		if st.State != kvevents.Exact {
			return false
		}
		tiers, _ := ix.Export(id)
		want := engine()
		if len(tiers[index.GPU]) != len(want) {
			return false
		}
		for _, e := range tiers[index.GPU] {
			if !want[e.Hash] {
				return false
			}
		}
		return true
	}
	start := time.Now()
	waitFor(t, "the index to mirror the engine from its snapshot", mirrors)
	st, _ := sub.Stats("sim", 0)
	if st.SnapshotsInstalled != 1 || st.Partial || len(engine()) == 0 {
		t.Fatalf("snapshots installed %d partial %v engine blocks %d", st.SnapshotsInstalled, st.Partial, len(engine()))
	}
	t.Logf("exact %v after the router started, %d blocks", time.Since(start).Round(time.Millisecond), len(engine()))
	// It stays exact as the engine goes on.
	complete(t, s, map[string]any{"prompt": seqTokens(5000, 40)})
	before := s.CacheState().Ranks[0].Hashes
	complete(t, s, map[string]any{"prompt": seqTokens(6000, 40)})
	waitFor(t, "the next requests' blocks", func() bool { return mirrors() && !slices.Equal(s.CacheState().Ranks[0].Hashes, before) })
}
