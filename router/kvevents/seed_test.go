package kvevents

import (
	"testing"

	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/peersnap"
)

// snapshotOf takes router r's snapshot of one stream through the wire format, as a peer would
// receive it.
func snapshotOf(t *testing.T, r *rig, engine string) *peersnap.Stream {
	t.Helper()
	b := peersnap.Encode(nil, &peersnap.Snapshot{KeyScheme: peersnap.KeyScheme, Streams: r.sub.Snapshot()})
	s, err := peersnap.Decode(b, peersnap.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range s.Streams {
		if s.Streams[i].Engine == engine {
			return &s.Streams[i]
		}
	}
	t.Fatalf("no stream %s in the snapshot", engine)
	return nil
}

// A router started after the engine's ring wrapped is exact from a peer's snapshot, where on its
// own it would be approximate (partial); what the engine publishes next keeps it exact.
func TestSeedFromPeerAfterRingWrapped(t *testing.T) {
	pub := newPub(t, kvtest.Options{Ring: 50})
	eng := newEngineSim(t, pub, 1, 64)
	a := newRig(t, Options{})
	a.add("e0", pub, 0)
	eng.publish(200) // four times the ring
	a.waitMirror("e0", 0, eng.cache, Exact)
	sn := snapshotOf(t, a, "e0")
	if !sn.Exact || sn.LastSeq != 199 || len(sn.Tiers[0]) != 64 {
		t.Fatalf("snapshot: exact %v last seq %d, %d GPU blocks; want exact, 199, 64", sn.Exact, sn.LastSeq, len(sn.Tiers[0]))
	}

	// Alone, a second router only gets the ring: approximate, partial.
	alone := newRig(t, Options{})
	alone.add("e0", pub, 0)
	if s := alone.stats("e0", 0); s.State != Approximate || !s.Partial {
		t.Fatalf("without a snapshot: state %v partial %v, want approximate partial", s.State, s.Partial)
	}

	b := newRig(t, Options{})
	cfg := StreamConfig{Engine: "e0", Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Topic: pub.Topic(), Seed: sn}
	if err := b.sub.Add(cfg); err != nil {
		t.Fatal(err)
	}
	eng.publish(5) // published while the identity replay may still run: held, applied after
	s := b.waitMirror("e0", 0, eng.cache, Exact)
	if !s.Seeded || s.SeedRejected != 0 || s.Partial {
		t.Fatalf("seeded stream: %+v", s)
	}
	eng.publish(30)
	b.waitMirror("e0", 0, eng.cache, Exact)
	a.waitMirror("e0", 0, eng.cache, Exact)
}

// A snapshot taken before the engine restarted is never applied to the new process: the ring
// does not return its last batch as it was, so the stream starts from the new ring instead.
func TestSeedRejectedAfterEngineRestart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after int // batches the new process publishes before the starting router asks
	}{
		{"new ring shorter than the snapshot", 5},
		{"new ring past the snapshot's seq, other bytes", 260},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := newPub(t, kvtest.Options{Ring: 1000})
			eng := newEngineSim(t, pub, 2, 64)
			a := newRig(t, Options{})
			a.add("e0", pub, 0)
			eng.publish(250)
			a.waitMirror("e0", 0, eng.cache, Exact)
			sn := snapshotOf(t, a, "e0")

			pub.Restart()
			fresh := newEngineSim(t, pub, 3, 64)
			fresh.publish(tc.after)

			b := newRig(t, Options{})
			cfg := StreamConfig{Engine: "e0", Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Topic: pub.Topic(), Seed: sn}
			if err := b.sub.Add(cfg); err != nil {
				t.Fatal(err)
			}
			s := b.waitMirror("e0", 0, fresh.cache, Exact)
			if s.Seeded || s.SeedRejected != 1 {
				t.Fatalf("stream after a restart: seeded %v, seed rejected %d; want false, 1", s.Seeded, s.SeedRejected)
			}
		})
	}
}

// A snapshot is refused without a replay socket: nothing could confirm the engine process.
func TestSeedNeedsReplay(t *testing.T) {
	pub := newPub(t, kvtest.Options{NoReplay: true})
	b := newRig(t, Options{})
	sn := &peersnap.Stream{Engine: "e0", HaveSeq: true, LastSeq: 9, Exact: true}
	if err := b.sub.Add(StreamConfig{Engine: "e0", Endpoint: pub.Endpoint(), Topic: pub.Topic(), Seed: sn}); err != nil {
		t.Fatal(err)
	}
	s := b.waitStats("e0", 0, "seed refused", func(s Stats) bool { return s.SeedRejected == 1 })
	if s.Seeded || s.State == Exact {
		t.Fatalf("stream without replay took a snapshot: %+v", s)
	}
}
