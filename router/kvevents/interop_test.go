package kvevents

import (
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

// llm-d-inference-sim writes parent_block_hash 0 for "no parent" (kvwire's noParentZero): such a
// run is indexed from the root, in either event layout, and not skipped as an unknown parent.
func TestIngestParentZeroIsRoot(t *testing.T) {
	for _, layout := range []kvwire.Layout{kvwire.LayoutArray, kvwire.LayoutMap} {
		t.Run(layout.String(), func(t *testing.T) {
			g, ix, id := newIngest(t, IngestOptions{BlockSize: testBS})
			c := newCache(t)
			st := must[kvwire.Event](t)
			a := toks(1, 3*testBS)
			root := st(c.Store(a, 0))
			root.Stored.ParentBlockHash = kvwire.Some(kvwire.IntHash(0))
			// A child chained to a real parent still needs that parent.
			child := append(append([]uint32(nil), a...), toks(2, testBS)...)
			next := st(c.Store(child, 3))
			payload, err := kvwire.NewEncoder().AppendBatch(nil, &kvwire.Batch{TS: 1, Events: []kvwire.Event{root, next}}, layout)
			if err != nil {
				t.Fatal(err)
			}
			b, err := kvwire.NewDecoder().DecodeBatch(payload)
			if err != nil {
				t.Fatal(err)
			}
			g.Apply(b)
			s := g.Stats()
			if s.UnknownParent != 0 || s.BlocksStored != 4 {
				t.Fatalf("unknown parent %d, blocks stored %d; want 0, 4", s.UnknownParent, s.BlocksStored)
			}
			if d := kvtest.Diff(ix, id, c.Resident()); d != "" {
				t.Error(d)
			}
			keys, _ := blockkey.AppendPromptKeys(nil, child, testBS, blockkey.Identity{})
			if m := ix.Match(keys, nil); len(m) <= int(id) || m[id].Blocks != 4 {
				t.Errorf("match %+v, want 4 blocks on replica %d", m, id)
			}
		})
	}
}
