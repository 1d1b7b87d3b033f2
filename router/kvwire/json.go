package kvwire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math"
	"strconv"

	"github.com/kvroute/kvroute/router/blockkey"
)

// JSON form of a batch (what `kvroutectl decode` prints): fields in declaration order; integer
// hashes as JSON numbers (written from the uint64, never through float64), raw-bytes hashes as
// lowercase hex strings; required fields vLLM sent as None are null, defaulted fields it left
// out (or sent as None) are omitted. Extra keys: a str is a string, a multimodal item is
// [identifier, offset], bytes are {"bytes_hex": ".."}, an unmodelled value {"msgpack_hex": ".."}.
// A ts JSON cannot hold (NaN, ±Inf: msgpack can carry them, vLLM's time.time() never sends
// them, the router does not read ts) is the string "NaN", "+Inf" or "-Inf".

// MarshalJSON writes the hash as a JSON number or a hex string.
func (h Hash) MarshalJSON() ([]byte, error) {
	if h.Bytes != nil {
		return json.Marshal(hex.EncodeToString(h.Bytes))
	}
	return strconv.AppendUint(nil, h.Int, 10), nil
}

// kv is one member of an ordered JSON object.
type kv struct {
	k string
	v any
}

type object []kv

func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.k)
		b.Write(k)
		b.WriteByte(':')
		v, err := json.Marshal(m.v)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func optJSON[T any](o Opt[T]) any {
	if o.OK {
		return o.V
	}
	return nil
}

// add appends a defaulted field only when it is set.
func add[T any](o object, k string, v Opt[T]) object {
	if v.OK {
		return append(o, kv{k, v.V})
	}
	return o
}

type extrasJSON blockkey.Extras

func (e extrasJSON) MarshalJSON() ([]byte, error) {
	if len(e) == 0 {
		return []byte("null"), nil
	}
	items := make([]any, len(e))
	for i, k := range e {
		switch k.Kind {
		case blockkey.ExtraString:
			items[i] = k.Str
		case blockkey.ExtraMM:
			items[i] = []any{k.Str, k.Offset}
		case blockkey.ExtraBytes:
			items[i] = object{{"bytes_hex", hex.EncodeToString(k.Bytes)}}
		default:
			items[i] = object{{"msgpack_hex", hex.EncodeToString(k.Bytes)}}
		}
	}
	return json.Marshal(items)
}

func hashesJSON(hs []Hash) []Hash {
	if hs == nil {
		return []Hash{}
	}
	return hs
}

func eventJSON(e *Event) object {
	o := object{{"type", e.Tag}}
	switch e.Type {
	case EventBlockStored:
		s := &e.Stored
		tokens := s.TokenIDs
		if tokens == nil {
			tokens = []uint32{}
		}
		o = append(o,
			kv{"block_hashes", hashesJSON(s.BlockHashes)},
			kv{"parent_block_hash", optJSON(s.ParentBlockHash)},
			kv{"token_ids", tokens},
			kv{"block_size", s.BlockSize},
			kv{"lora_id", optJSON(s.LoRAID)},
			kv{"medium", optJSON(s.Medium)},
			kv{"lora_name", optJSON(s.LoRAName)},
		)
		if s.ExtraKeys.OK {
			ek := make([]extrasJSON, len(s.ExtraKeys.V))
			for i, ex := range s.ExtraKeys.V {
				ek[i] = extrasJSON(ex)
			}
			o = append(o, kv{"extra_keys", ek})
		}
		o = add(o, "group_idx", s.GroupIdx)
		o = add(o, "kv_cache_spec_kind", s.KVCacheSpecKind)
		o = add(o, "kv_cache_spec_sliding_window", s.KVCacheSpecSlidingWindow)
		o = add(o, "locality", s.Locality)
		o = add(o, "ownership", s.Ownership)
		o = add(o, "session_id", s.SessionID)
	case EventBlockRemoved:
		r := &e.Removed
		o = append(o, kv{"block_hashes", hashesJSON(r.BlockHashes)}, kv{"medium", optJSON(r.Medium)})
		o = add(o, "group_idx", r.GroupIdx)
		o = add(o, "locality", r.Locality)
		o = add(o, "ownership", r.Ownership)
	}
	return o
}

// MarshalJSON writes the batch in the normalized JSON form described above, with the event
// layout it was decoded from as "layout" and the batch's Shape as "shape" ("E1", "E2", "E3" or
// "unknown").
func (b *Batch) MarshalJSON() ([]byte, error) {
	events := make([]object, len(b.Events))
	for i := range b.Events {
		events[i] = eventJSON(&b.Events[i])
	}
	var ts any = b.TS
	if math.IsNaN(b.TS) || math.IsInf(b.TS, 0) {
		ts = strconv.FormatFloat(b.TS, 'g', -1, 64)
	}
	return json.Marshal(object{
		{"ts", ts},
		{"data_parallel_rank", optJSON(b.DataParallelRank)},
		{"layout", b.Layout.String()},
		{"shape", b.Shape().String()},
		{"events", events},
	})
}
