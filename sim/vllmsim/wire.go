package vllmsim

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// The event encoder below is the simulator's own, written independently of router/kvwire
// (TestIndependentOfRouterCodecs) with the msgpack library's primitives, from the spec's §4.4 and
// vLLM's vllm/distributed/kv_events.py encoded by msgspec. TestEncoderMatchesBatchShapes checks
// it byte for byte against testdata/vllm/vllm-batch-shapes.json, which vLLM's own classes
// produced.

// eventShape is one of the three KV-event batch shapes known (spec §4.4 erratum).
type eventShape int

const (
	// shapeE1: array batch of array events (array_like on batch and events): vLLM's
	// kv_events.py before #42892; every declared field written, positionally.
	shapeE1 eventShape = iota + 1
	// shapeE2: map batch {"ts","events","data_parallel_rank"} of map events: the newest upstream
	// kv_events.py in public indexes, with array_like removed from the batch too.
	shapeE2
	// shapeE3: array batch of map events: array_like removed from the events only (#42892);
	// the shape of a live v0.26.0 capture (spec §4.4 erratum). The sim's default.
	shapeE3
)

func (s eventShape) String() string { return [...]string{"?", "E1", "E2", "E3"}[s] }

// parseEventShape reads --event-layout: E1, E2, E3 (any case), and the older names "array" (E1)
// and "map" (E3) kept for compatibility.
func parseEventShape(layout string) (eventShape, error) {
	switch strings.ToUpper(layout) {
	case "E1", "ARRAY":
		return shapeE1, nil
	case "E2":
		return shapeE2, nil
	case "E3", "MAP":
		return shapeE3, nil
	}
	return 0, fmt.Errorf("event layout must be E1, E2 or E3 (or the aliases array = E1, map = E3), got %q", layout)
}

// wireBatch is vLLM's KVEventBatch as the simulator sends it.
type wireBatch struct {
	ts     float64
	events []wireEvent
	rank   *int64 // data_parallel_rank; nil is None
}

// wireEvent is one BlockStored, BlockRemoved or AllBlocksCleared. Pointer and slice fields
// that are nil are None.
type wireEvent struct {
	kind eventKind
	// BlockStored, in declaration order (array order = map key order)
	hashes     []uint64 // int hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1)
	parent     *uint64
	tokens     []uint32
	blockSize  int64
	loraID     *int64
	medium     *string
	loraName   *string
	extraKeys  [][]string // one entry per hash, nil entry = None; nil list = None
	hasExtras  bool       // extra_keys is a list (even of Nones), not None
	groupIdx   *int64
	specKind   *string
	specWindow *int64
}

// eventEncoder encodes batches; not safe for concurrent use.
type eventEncoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
	err error
	// signed writes hashes as int64 (their bits as two's complement), as SGLang and
	// TensorRT-LLM send them (kinds.go).
	signed bool
}

func newEventEncoder() *eventEncoder {
	e := &eventEncoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// encode returns msgspec's msgpack of the batch in the given shape (a fresh slice).
func (e *eventEncoder) encode(b *wireBatch, shape eventShape) ([]byte, error) {
	e.buf.Reset()
	e.err = nil
	if shape == shapeE2 {
		// msgspec with omit_defaults: data_parallel_rank left out when None.
		n := 2
		if b.rank != nil {
			n = 3
		}
		e.check(e.enc.EncodeMapLen(n))
		e.str("ts")
		e.check(e.enc.EncodeFloat64(b.ts)) // always cb + float64
		e.str("events")
		e.eventList(b.events, shape)
		if b.rank != nil {
			e.str("data_parallel_rank")
			e.check(e.enc.EncodeInt(*b.rank))
		}
	} else {
		// array_like writes every field, defaults included (msgspec issue #720).
		e.check(e.enc.EncodeArrayLen(3))
		e.check(e.enc.EncodeFloat64(b.ts))
		e.eventList(b.events, shape)
		e.optInt(b.rank)
	}
	if e.err != nil {
		return nil, e.err
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

func (e *eventEncoder) check(err error) {
	if err != nil && e.err == nil {
		e.err = err
	}
}

func (e *eventEncoder) str(s string) { e.check(e.enc.EncodeString(s)) }

func (e *eventEncoder) optInt(v *int64) {
	if v == nil {
		e.check(e.enc.EncodeNil())
		return
	}
	e.check(e.enc.EncodeInt(*v))
}

func (e *eventEncoder) optUint(v *uint64) {
	if v == nil {
		e.check(e.enc.EncodeNil())
		return
	}
	e.hash(*v)
}

func (e *eventEncoder) hash(h uint64) {
	if e.signed {
		e.check(e.enc.EncodeInt(int64(h)))
		return
	}
	e.check(e.enc.EncodeUint(h))
}

func (e *eventEncoder) optStr(v *string) {
	if v == nil {
		e.check(e.enc.EncodeNil())
		return
	}
	e.str(*v)
}

func (e *eventEncoder) eventList(evs []wireEvent, shape eventShape) {
	e.check(e.enc.EncodeArrayLen(len(evs)))
	for i := range evs {
		if shape == shapeE1 {
			e.arrayEvent(&evs[i])
		} else {
			e.mapEvent(&evs[i])
		}
	}
}

var eventTags = map[eventKind]string{evStored: "BlockStored", evRemoved: "BlockRemoved", evCleared: "AllBlocksCleared"}

// arrayEvent writes ["Tag", field...] with every field of the last array_like source (the
// kv_cache_spec fields included): BlockStored 11 fields, BlockRemoved 3, AllBlocksCleared none.
func (e *eventEncoder) arrayEvent(ev *wireEvent) {
	switch ev.kind {
	case evStored:
		e.check(e.enc.EncodeArrayLen(12))
		e.str(eventTags[ev.kind])
		e.storedFields(ev, true)
	case evRemoved:
		e.check(e.enc.EncodeArrayLen(4))
		e.str(eventTags[ev.kind])
		e.hashList(ev.hashes)
		e.optStr(ev.medium)
		e.optInt(ev.groupIdx)
	default:
		e.check(e.enc.EncodeArrayLen(1))
		e.str(eventTags[ev.kind])
	}
}

// mapEvent writes {"type": "Tag", field: value...} in declaration order: required fields always
// (None as nil), fields with a default of None only when set (omit_defaults=True).
func (e *eventEncoder) mapEvent(ev *wireEvent) {
	switch ev.kind {
	case evStored:
		n := 8 // type + the seven required fields
		for _, set := range []bool{ev.hasExtras, ev.groupIdx != nil, ev.specKind != nil, ev.specWindow != nil} {
			if set {
				n++
			}
		}
		e.check(e.enc.EncodeMapLen(n))
		e.str("type")
		e.str(eventTags[ev.kind])
		e.storedFields(ev, false)
	case evRemoved:
		n := 3
		if ev.groupIdx != nil {
			n++
		}
		e.check(e.enc.EncodeMapLen(n))
		e.str("type")
		e.str(eventTags[ev.kind])
		e.str("block_hashes")
		e.hashList(ev.hashes)
		e.str("medium")
		e.optStr(ev.medium)
		if ev.groupIdx != nil {
			e.str("group_idx")
			e.optInt(ev.groupIdx)
		}
	default:
		e.check(e.enc.EncodeMapLen(1))
		e.str("type")
		e.str(eventTags[ev.kind])
	}
}

// storedFields writes BlockStored's fields after the tag; all of them (array) or the map's.
func (e *eventEncoder) storedFields(ev *wireEvent, all bool) {
	key := func(k string) {
		if !all {
			e.str(k)
		}
	}
	key("block_hashes")
	e.hashList(ev.hashes)
	key("parent_block_hash")
	e.optUint(ev.parent)
	key("token_ids")
	e.check(e.enc.EncodeArrayLen(len(ev.tokens)))
	for _, t := range ev.tokens {
		e.check(e.enc.EncodeUint(uint64(t)))
	}
	key("block_size")
	e.check(e.enc.EncodeInt(ev.blockSize))
	key("lora_id")
	e.optInt(ev.loraID)
	key("medium")
	e.optStr(ev.medium)
	key("lora_name")
	e.optStr(ev.loraName)
	if all || ev.hasExtras {
		key("extra_keys")
		if !ev.hasExtras {
			e.check(e.enc.EncodeNil())
		} else {
			e.check(e.enc.EncodeArrayLen(len(ev.extraKeys)))
			for _, ks := range ev.extraKeys {
				if ks == nil { // a block without extras: None
					e.check(e.enc.EncodeNil())
					continue
				}
				e.check(e.enc.EncodeArrayLen(len(ks))) // the tuple arrives as an array
				for _, k := range ks {
					e.str(k)
				}
			}
		}
	}
	if all || ev.groupIdx != nil {
		key("group_idx")
		e.optInt(ev.groupIdx)
	}
	if all || ev.specKind != nil {
		key("kv_cache_spec_kind")
		e.optStr(ev.specKind)
	}
	if all || ev.specWindow != nil {
		key("kv_cache_spec_sliding_window")
		e.optInt(ev.specWindow)
	}
}

func (e *eventEncoder) hashList(hs []uint64) {
	e.check(e.enc.EncodeArrayLen(len(hs)))
	for _, h := range hs {
		e.hash(h)
	}
}

// toWireBatch turns one step's pool events into vLLM's KVEventBatch as the GPU block pool
// fills it (vllm/v1/core/block_pool.py, KVCacheManager.take_events): int hashes, medium "GPU",
// group 0, kv_cache_spec_kind "full_attention", extra_keys always a list.
func toWireBatch(ts float64, evs []simEvent, rank int) *wireBatch {
	r := int64(rank)
	b := &wireBatch{ts: ts, rank: &r, events: make([]wireEvent, 0, len(evs))}
	gpu, group, kind := "GPU", int64(0), "full_attention"
	for _, ev := range evs {
		w := wireEvent{kind: ev.kind}
		switch ev.kind {
		case evStored:
			w.hashes = wireHashes(ev.hashes)
			w.tokens = ev.tokens
			w.blockSize = int64(ev.blockSize)
			w.medium, w.groupIdx, w.specKind = &gpu, &group, &kind
			w.extraKeys, w.hasExtras = ev.extraKeys, true
			if ev.parent != nil {
				p := wireHash(ev.parent)
				w.parent = &p
			}
			if ev.loraID != nil {
				id := int64(*ev.loraID)
				w.loraID = &id
			}
			w.loraName = ev.loraName
		case evRemoved:
			w.hashes = wireHashes(ev.hashes)
			w.medium, w.groupIdx = &gpu, &group
		}
		b.events = append(b.events, w)
	}
	return b
}

func wireHashes(ds [][]byte) []uint64 {
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = wireHash(d)
	}
	return out
}
