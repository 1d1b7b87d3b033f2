package kvevents

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

// The contract vectors (testdata/vllm/kv-contract, from vLLM's contract test and
// docs/features/kv_events.md; see testdata/vllm/README.md) through the ingester and a real ZMQ
// stream.
func loadContractFrames(t testing.TB) map[string][][]byte {
	t.Helper()
	raw, err := os.ReadFile("../../testdata/vllm/kv-contract/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Cases []struct {
			Name      string   `json:"name"`
			FramesHex []string `json:"frames_hex"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	out := map[string][][]byte{}
	for _, c := range f.Cases {
		for _, h := range c.FramesHex {
			b, err := hex.DecodeString(h)
			if err != nil {
				t.Fatal(err)
			}
			out[c.Name] = append(out[c.Name], b)
		}
	}
	return out
}

func TestContractVectorsIngest(t *testing.T) {
	frames := loadContractFrames(t)
	g, ix, id := newIngest(t, IngestOptions{CopyPerStore: true})
	d := kvwire.NewDecoder()
	apply := func(name string) {
		t.Helper()
		m, err := kvwire.ParseFrames(frames[name])
		if err != nil {
			t.Fatal(err)
		}
		b, err := d.DecodeBatch(m.Payload)
		if err != nil {
			t.Fatal(err)
		}
		g.Apply(b)
	}
	blocks := func() [index.NumTiers]int {
		ist, _ := ix.Stats(id)
		return ist.Blocks
	}
	apply("copies_stored")
	apply("copies_first_removed")
	if b := blocks(); b[index.GPU] != 2 {
		t.Fatalf("after the first copy's eviction %d GPU blocks, want 2 (a copy of each is left)", b[index.GPU])
	}
	apply("copies_last_removed")
	if b := blocks(); b[index.GPU] != 0 {
		t.Fatalf("after the last copy %d GPU blocks, want 0", b[index.GPU])
	}
	apply("shared_residency")
	apply("unknown_medium")
	s := g.Stats()
	if b := blocks(); b != [index.NumTiers]int{} {
		t.Fatalf("shared or unknown media entered the routing index: %v", b)
	}
	if s.SharedStored != 4 || s.SharedRemoved != 1 || s.SharedBlocks != 3 || s.SkippedMedia != 1 || s.SessionStores != 1 ||
		len(s.Owners) != 1 || s.Owners[0] != "kvcr" {
		t.Fatalf("shared stored %d removed %d blocks %d skipped media %d sessions %d owners %v",
			s.SharedStored, s.SharedRemoved, s.SharedBlocks, s.SkippedMedia, s.SessionStores, s.Owners)
	}
}

// The 24-byte-frame batch indexes its 3 blocks when it arrives over ZMQ (it indexed none when
// the frame had to be 8 bytes).
func TestContractSnapshotFrameOverZMQ(t *testing.T) {
	frames := loadContractFrames(t)
	live := frames["snapshot_live_store"]
	r := newRig(t, Options{}) // parity mismatches are counted only: the vector's hashes are not vLLM's of its tokens
	p := newPub(t, kvtest.Options{NoReplay: true, Topic: string(live[0])})
	r.add("e", p, 0)
	if err := p.SendFrames(live...); err != nil {
		t.Fatal(err)
	}
	s := r.waitStats("e", 0, "the 24-byte batch applied", func(s Stats) bool { return s.Applied == 1 })
	if s.BlocksStored != 3 || s.LastSeq != 7 || s.Publisher != "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf" {
		t.Fatalf("stored %d last seq %d publisher %q; want 3, 7, a0..af", s.BlocksStored, s.LastSeq, s.Publisher)
	}
	if err := p.SendFrames(frames["snapshot_heartbeat"]...); err != nil {
		t.Fatal(err)
	}
	r.waitStats("e", 0, "heartbeat", func(s Stats) bool { return s.Heartbeats == 1 && s.LastSeq == 8 })
	if ist, _ := r.ix.Stats(r.id("e", 0)); ist.Blocks[index.GPU] != 3 {
		t.Fatalf("%d GPU blocks, want 3", ist.Blocks[index.GPU])
	}
}

// contractSeeds are the contract vectors' frames, for the fuzz corpora.
func contractSeeds(t testing.TB) [][][]byte {
	var out [][][]byte
	for _, fr := range loadContractFrames(t) {
		out = append(out, fr)
	}
	return out
}
