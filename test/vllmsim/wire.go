package vllmsim

import (
	"github.com/kvroute/kvroute/router/kvwire"
)

// toWireBatch turns one step's pool events into vLLM's KVEventBatch as the GPU block pool
// fills it: int hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), medium "GPU", group 0,
// full attention, extra_keys always a list.
func toWireBatch(ts float64, evs []simEvent, rank int) *kvwire.Batch {
	b := &kvwire.Batch{TS: ts, DataParallelRank: kvwire.Some(int64(rank)), Events: make([]kvwire.Event, 0, len(evs))}
	for _, ev := range evs {
		switch ev.kind {
		case evStored:
			st := kvwire.BlockStored{
				BlockHashes:     wireHashes(ev.hashes),
				TokenIDs:        ev.tokens,
				BlockSize:       int64(ev.blockSize),
				Medium:          kvwire.Some("GPU"),
				ExtraKeys:       kvwire.Some(ev.extraKeys),
				GroupIdx:        kvwire.Some(int64(0)),
				KVCacheSpecKind: kvwire.Some("full_attention"),
			}
			if ev.parent != nil {
				st.ParentBlockHash = kvwire.Some(kvwire.IntHash(wireHash(ev.parent)))
			}
			if ev.loraID != nil {
				st.LoRAID = kvwire.Some(int64(*ev.loraID))
			}
			if ev.loraName != nil {
				st.LoRAName = kvwire.Some(*ev.loraName)
			}
			b.Events = append(b.Events, kvwire.Event{Type: kvwire.EventBlockStored, Stored: st})
		case evRemoved:
			b.Events = append(b.Events, kvwire.Event{Type: kvwire.EventBlockRemoved, Removed: kvwire.BlockRemoved{
				BlockHashes: wireHashes(ev.hashes), Medium: kvwire.Some("GPU"), GroupIdx: kvwire.Some(int64(0))}})
		case evCleared:
			b.Events = append(b.Events, kvwire.Event{Type: kvwire.EventAllBlocksCleared})
		}
	}
	return b
}

func wireHashes(ds [][]byte) []kvwire.Hash {
	out := make([]kvwire.Hash, len(ds))
	for i, d := range ds {
		out[i] = kvwire.IntHash(wireHash(d))
	}
	return out
}

func wireLayout(layout string) kvwire.Layout {
	if layout == "array" {
		return kvwire.LayoutArray
	}
	return kvwire.LayoutMap
}
