package kvwire

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/router/blockkey"
)

// Encoder writes KVEventBatch payloads as vLLM's msgspec encoder does (spec §4.4), in each
// Shape. An array batch is [ts as float64, events, data_parallel_rank] with every field written;
// a map batch (E2) is {"ts", "events", "data_parallel_rank"} in that order with the rank left out
// when None (omit_defaults). Ints take their shortest form. In LayoutMap an event is a map whose
// first key is "type", then fields in declaration order, required fields always written (nil for
// None) and defaulted ones left out when None. In LayoutArray an event is [tag, every field of
// the set before locality (block_hashes .. kv_cache_spec_sliding_window)], plus locality only
// when set. Not safe for concurrent use.
type Encoder struct {
	buf bytes.Buffer
	e   *msgpack.Encoder
	// signed writes integer hashes as int64 (the bits read as two's complement), as SGLang and
	// TensorRT-LLM send them; vLLM's are unsigned.
	signed bool
}

// NewEncoder returns an encoder.
func NewEncoder() *Encoder {
	enc := &Encoder{}
	enc.e = msgpack.NewEncoder(&enc.buf) // *bytes.Buffer is written to directly, unbuffered
	return enc
}

// AppendBatch appends the payload of b to dst as an array batch whose events are in the given
// layout: LayoutArray is shape E1, LayoutMap E3.
func (enc *Encoder) AppendBatch(dst []byte, b *Batch, layout Layout) ([]byte, error) {
	return enc.appendBatch(dst, b, LayoutArray, layout)
}

// AppendBatchShape appends the payload of b to dst in shape s (E1, E2 or E3).
func (enc *Encoder) AppendBatchShape(dst []byte, b *Batch, s Shape) ([]byte, error) {
	batch, events := s.Layouts()
	if batch == LayoutUnknown {
		return dst, fmt.Errorf("kvwire: encode: shape %v", s)
	}
	return enc.appendBatch(dst, b, batch, events)
}

func (enc *Encoder) appendBatch(dst []byte, b *Batch, batch, layout Layout) ([]byte, error) {
	if layout != LayoutMap && layout != LayoutArray {
		return dst, fmt.Errorf("kvwire: encode: layout %v", layout)
	}
	enc.buf.Reset()
	e := enc.e
	if batch == LayoutMap {
		_ = e.EncodeMapLen(2 + count(b.DataParallelRank.OK))
		enc.key("ts")
	} else {
		_ = e.EncodeArrayLen(3)
	}
	_ = e.EncodeFloat64(b.TS)
	enc.key2(batch, "events")
	_ = e.EncodeArrayLen(len(b.Events))
	for i := range b.Events {
		if err := enc.event(&b.Events[i], layout); err != nil {
			return dst, fmt.Errorf("kvwire: encode event %d: %w", i, err)
		}
	}
	if enc.field(batch, "data_parallel_rank", b.DataParallelRank.OK) {
		enc.optInt(b.DataParallelRank)
	}
	return append(dst, enc.buf.Bytes()...), nil
}

func (enc *Encoder) event(ev *Event, layout Layout) error {
	e := enc.e
	switch ev.Type {
	case EventBlockStored:
		s := &ev.Stored
		if s.ExtraKeys.OK && len(s.ExtraKeys.V) != len(s.BlockHashes) {
			return fmt.Errorf("%d extra_keys entries for %d block hashes", len(s.ExtraKeys.V), len(s.BlockHashes))
		}
		if layout == LayoutMap {
			n := 8 + count(s.ExtraKeys.OK, s.GroupIdx.OK, s.KVCacheSpecKind.OK, s.KVCacheSpecSlidingWindow.OK, s.Locality.OK,
				s.Ownership.OK, s.SessionID.OK)
			_ = e.EncodeMapLen(n)
			enc.key("type")
		} else {
			_ = e.EncodeArrayLen(12 + trailing(s.Locality.OK, s.Ownership.OK, s.SessionID.OK))
		}
		_ = e.EncodeString(TagBlockStored)
		enc.storedCore(layout, s)
		enc.key2(layout, "medium")
		enc.optStr(s.Medium)
		enc.key2(layout, "lora_name")
		enc.optStr(s.LoRAName)
		if enc.field(layout, "extra_keys", s.ExtraKeys.OK) {
			if err := enc.extraKeys(s.ExtraKeys); err != nil {
				return err
			}
		}
		if enc.field(layout, "group_idx", s.GroupIdx.OK) {
			enc.optInt(s.GroupIdx)
		}
		if enc.field(layout, "kv_cache_spec_kind", s.KVCacheSpecKind.OK) {
			enc.optStr(s.KVCacheSpecKind)
		}
		if enc.field(layout, "kv_cache_spec_sliding_window", s.KVCacheSpecSlidingWindow.OK) {
			enc.optInt(s.KVCacheSpecSlidingWindow)
		}
		// Newer than the array layout: written when set, and in an array up to the last one set
		// (msgspec leaves trailing defaults out of an array_like struct under omit_defaults).
		enc.trailingStrs(layout, []string{"locality", "ownership", "session_id"}, s.Locality, s.Ownership, s.SessionID)
	case EventBlockRemoved:
		r := &ev.Removed
		if layout == LayoutMap {
			_ = e.EncodeMapLen(3 + count(r.GroupIdx.OK, r.Locality.OK, r.Ownership.OK))
			enc.key("type")
		} else {
			_ = e.EncodeArrayLen(4 + trailing(r.Locality.OK, r.Ownership.OK))
		}
		_ = e.EncodeString(TagBlockRemoved)
		enc.key2(layout, "block_hashes")
		enc.hashes(r.BlockHashes)
		enc.key2(layout, "medium")
		enc.optStr(r.Medium)
		if enc.field(layout, "group_idx", r.GroupIdx.OK) {
			enc.optInt(r.GroupIdx)
		}
		enc.trailingStrs(layout, []string{"locality", "ownership"}, r.Locality, r.Ownership)
	case EventAllBlocksCleared:
		if layout == LayoutMap {
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

func count(flags ...bool) int {
	n := 0
	for _, f := range flags {
		if f {
			n++
		}
	}
	return n
}

func (enc *Encoder) key(k string) { _ = enc.e.EncodeString(k) }

// key2 writes a map key in LayoutMap; positions carry the name in LayoutArray.
func (enc *Encoder) key2(layout Layout, k string) {
	if layout == LayoutMap {
		enc.key(k)
	}
}

// field starts a defaulted field: in LayoutMap it is written only when set; in LayoutArray
// always, as nil when unset. It reports whether the caller should write the value.
func (enc *Encoder) field(layout Layout, k string, set bool) bool {
	if layout == LayoutMap {
		if set {
			enc.key(k)
		}
		return set
	}
	if !set {
		_ = enc.e.EncodeNil()
	}
	return set
}

func (enc *Encoder) optInt(v Opt[int64]) {
	if v.OK {
		_ = enc.e.EncodeInt(v.V)
	} else {
		_ = enc.e.EncodeNil()
	}
}

func (enc *Encoder) optStr(v Opt[string]) {
	if v.OK {
		_ = enc.e.EncodeString(v.V)
	} else {
		_ = enc.e.EncodeNil()
	}
}

func (enc *Encoder) hash(h Hash) {
	if h.Bytes != nil {
		_ = enc.e.EncodeBytes(h.Bytes)
	} else if enc.signed {
		_ = enc.e.EncodeInt(int64(h.Int))
	} else {
		_ = enc.e.EncodeUint(h.Int)
	}
}

func (enc *Encoder) hashes(hs []Hash) {
	_ = enc.e.EncodeArrayLen(len(hs))
	for _, h := range hs {
		enc.hash(h)
	}
}

func (enc *Encoder) extraKeys(ek Opt[[]blockkey.Extras]) error {
	e := enc.e
	_ = e.EncodeArrayLen(len(ek.V))
	for _, ex := range ek.V {
		if len(ex) == 0 {
			_ = e.EncodeNil()
			continue
		}
		_ = e.EncodeArrayLen(len(ex))
		for _, k := range ex {
			switch k.Kind {
			case blockkey.ExtraString:
				_ = e.EncodeString(k.Str)
			case blockkey.ExtraMM:
				_ = e.EncodeArrayLen(2)
				_ = e.EncodeString(k.Str)
				_ = e.EncodeInt(k.Offset)
			case blockkey.ExtraBytes:
				_ = e.EncodeBytes(k.Bytes)
			case blockkey.ExtraOther:
				if len(k.Bytes) == 0 {
					return fmt.Errorf("unmodelled extra key without its msgpack bytes")
				}
				enc.buf.Write(k.Bytes) // already msgpack
			default:
				return fmt.Errorf("extra key of kind %d", k.Kind)
			}
		}
	}
	return nil
}

// trailing is how many of the optional trailing fields an array event carries: up to the last
// one set.
func trailing(set ...bool) int {
	n := 0
	for i, ok := range set {
		if ok {
			n = i + 1
		}
	}
	return n
}

// trailingStrs writes the optional string fields after the array layout's fixed ones: in a map
// each one set, in an array every one up to the last set (nil for those unset before it).
func (enc *Encoder) trailingStrs(layout Layout, names []string, vals ...Opt[string]) {
	n := len(vals)
	if layout != LayoutMap {
		set := make([]bool, len(vals))
		for i, v := range vals {
			set[i] = v.OK
		}
		n = trailing(set...)
	}
	for i, v := range vals[:n] {
		if layout == LayoutMap && !v.OK {
			continue
		}
		enc.key2(layout, names[i])
		enc.optStr(v)
	}
}

// storedCore writes a BlockStored's fields every engine's encoding shares, in its order: the
// hashes, the parent, the token ids, the block size and the LoRA id.
func (enc *Encoder) storedCore(layout Layout, s *BlockStored) {
	e := enc.e
	enc.key2(layout, "block_hashes")
	enc.hashes(s.BlockHashes)
	enc.key2(layout, "parent_block_hash")
	if s.ParentBlockHash.OK {
		enc.hash(s.ParentBlockHash.V)
	} else {
		_ = e.EncodeNil()
	}
	enc.key2(layout, "token_ids")
	_ = e.EncodeArrayLen(len(s.TokenIDs))
	for _, t := range s.TokenIDs {
		_ = e.EncodeUint(uint64(t))
	}
	enc.key2(layout, "block_size")
	_ = e.EncodeInt(s.BlockSize)
	enc.key2(layout, "lora_id")
	enc.optInt(s.LoRAID)
}
