package kvwire

import (
	"fmt"

	"github.com/kvroute/kvroute/router/engine"
)

// AppendEngineBatch appends the payload of b to dst as kind's publisher encodes it:
//
//   - vLLM: shape E3 (an array batch of map events), what a current vLLM sends.
//   - SGLang (python/sglang/srt/disaggregation/kv_events.py): an array batch [ts, events,
//     attn_dp_rank] of positional events. BlockStored is [tag, block_hashes, parent_block_hash,
//     token_ids, block_size, lora_id, medium], followed by a metadata map {cache_salt,
//     session_id} only when the request carried one (BlockStoredWithMetadata; the map leaves
//     unset keys out); BlockRemoved is [tag, block_hashes, medium]; AllBlocksCleared [tag]. With
//     events == LayoutMap, SGLang's newer tagged-map events instead: type, block_hashes,
//     parent_block_hash, token_ids, block_size, lora_id, then medium, cache_salt and session_id
//     when set.
//   - TensorRT-LLM (tensorrt_llm/_torch/pyexecutor/kv_cache_events.py): shape E3 with vLLM's
//     field set, hashes as signed int64.
//
// SGLang and TensorRT-LLM both send hashes as signed int64 (Hash.Int's bits). events is
// LayoutUnknown for each engine's default.
func (enc *Encoder) AppendEngineBatch(dst []byte, b *Batch, kind engine.Kind, events Layout) ([]byte, error) {
	switch kind.Or(engine.VLLM) {
	case engine.VLLM:
		return enc.AppendBatchShape(dst, b, ShapeE3)
	case engine.TRTLLM:
		enc.signed = true
		defer func() { enc.signed = false }()
		return enc.AppendBatchShape(dst, b, ShapeE3)
	}
	enc.signed = true
	defer func() { enc.signed = false }()
	enc.buf.Reset()
	e := enc.e
	_ = e.EncodeArrayLen(3)
	_ = e.EncodeFloat64(b.TS)
	_ = e.EncodeArrayLen(len(b.Events))
	for i := range b.Events {
		if err := enc.sglangEvent(&b.Events[i], events == LayoutMap); err != nil {
			return dst, fmt.Errorf("kvwire: encode event %d: %w", i, err)
		}
	}
	enc.optInt(b.DataParallelRank)
	return append(dst, enc.buf.Bytes()...), nil
}

func (enc *Encoder) sglangEvent(ev *Event, asMap bool) error {
	e := enc.e
	layout := LayoutArray
	if asMap {
		layout = LayoutMap
	}
	switch ev.Type {
	case EventBlockStored:
		s := &ev.Stored
		meta := s.CacheSalt.OK || s.SessionID.OK
		if asMap {
			_ = e.EncodeMapLen(6 + count(s.Medium.OK, s.CacheSalt.OK, s.SessionID.OK))
			enc.key("type")
		} else {
			_ = e.EncodeArrayLen(7 + count(meta))
		}
		_ = e.EncodeString(TagBlockStored)
		enc.storedCore(layout, s)
		if asMap {
			enc.trailingStrs(layout, []string{"medium", "cache_salt", "session_id"}, s.Medium, s.CacheSalt, s.SessionID)
			return nil
		}
		enc.optStr(s.Medium)
		if meta {
			_ = e.EncodeMapLen(count(s.CacheSalt.OK, s.SessionID.OK))
			enc.trailingStrs(LayoutMap, []string{"cache_salt", "session_id"}, s.CacheSalt, s.SessionID)
		}
	case EventBlockRemoved:
		r := &ev.Removed
		if asMap {
			_ = e.EncodeMapLen(2 + count(r.Medium.OK))
			enc.key("type")
		} else {
			_ = e.EncodeArrayLen(3)
		}
		_ = e.EncodeString(TagBlockRemoved)
		enc.key2(layout, "block_hashes")
		enc.hashes(r.BlockHashes)
		if asMap {
			enc.trailingStrs(layout, []string{"medium"}, r.Medium)
		} else {
			enc.optStr(r.Medium)
		}
	case EventAllBlocksCleared:
		if asMap {
			_ = e.EncodeMapLen(1)
			enc.key("type")
		} else {
			_ = e.EncodeArrayLen(1)
		}
		_ = e.EncodeString(TagAllBlocksCleared)
	default:
		return fmt.Errorf("cannot encode event type %q", ev.Tag)
	}
	return nil
}
