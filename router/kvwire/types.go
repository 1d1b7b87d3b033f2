// Package kvwire is vLLM's KV-cache event wire format: the ZMQ frames of the PUB stream and of
// replay replies, and the msgpack KVEventBatch payload in each of the three shapes known (see
// Shape: array or map batch, array or map events), decoded and encoded.
package kvwire

import (
	"fmt"

	"github.com/kvroute/kvroute/router/blockkey"
)

// Opt is a field vLLM may leave out or send as None: OK is false then, so an absent field is never
// mistaken for a zero value.
type Opt[T any] struct {
	V  T
	OK bool
}

// Some returns a set Opt.
func Some[T any](v T) Opt[T] { return Opt[T]{V: v, OK: true} }

// Hash is a block hash as sent: a uint64 (vLLM's default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1)
// or the raw digest bytes (=0).
type Hash struct {
	Int   uint64
	Bytes []byte // non-nil for raw-bytes hashes; owned by the Decoder until its next call
}

// IntHash returns an integer hash.
func IntHash(v uint64) Hash { return Hash{Int: v} }

// BytesHash returns a raw-bytes hash.
func BytesHash(b []byte) Hash {
	if b == nil {
		b = []byte{}
	}
	return Hash{Bytes: b}
}

// IsBytes reports whether the engine sent the raw digest.
func (h Hash) IsBytes() bool { return h.Bytes != nil }

// Uint64 is the value the index keys engine hashes by: the wire int itself, or for raw digests
// their last 8 bytes big-endian, which is how vLLM derives wire ints, so both modes agree.
func (h Hash) Uint64() uint64 {
	if h.Bytes != nil {
		return blockkey.WireInt(h.Bytes)
	}
	return h.Int
}

// EventType is an event's class.
type EventType uint8

// Event classes vLLM publishes; EventUnknown is any other tag (a newer vLLM), kept so callers can
// count it, with its fields skipped.
const (
	EventUnknown EventType = iota
	EventBlockStored
	EventBlockRemoved
	EventAllBlocksCleared
)

// Tag names on the wire (msgspec's tag value: the class name).
const (
	TagBlockStored      = "BlockStored"
	TagBlockRemoved     = "BlockRemoved"
	TagAllBlocksCleared = "AllBlocksCleared"
)

func (t EventType) String() string {
	switch t {
	case EventBlockStored:
		return TagBlockStored
	case EventBlockRemoved:
		return TagBlockRemoved
	case EventAllBlocksCleared:
		return TagAllBlocksCleared
	}
	return "Unknown"
}

// Layout is how a msgpack struct is encoded: as a map keyed by field name or as a positional
// array. Batch.Layout is the events' layout, Batch.BatchLayout the batch's own; which pairs occur
// is Shape's doc.
type Layout uint8

const (
	// LayoutUnknown: not decoded, or a batch with no events shows no event layout.
	LayoutUnknown Layout = iota
	// LayoutMap: a msgpack map keyed by field name; an event's first key is "type", and
	// defaulted fields whose value is None are left out (msgspec omit_defaults without
	// array_like).
	LayoutMap
	// LayoutArray: a positional array; an event is [tag, field1, ...] with every field present
	// (msgspec array_like).
	LayoutArray
)

func (l Layout) String() string {
	switch l {
	case LayoutMap:
		return "map"
	case LayoutArray:
		return "array"
	}
	return "unknown"
}

// Shape is the encoding of a whole batch: the batch's layout and its events'. Three shapes are
// known, named as in testdata/vllm/vllm-batch-shapes.json, whose bytes vLLM's own classes
// (vllm/distributed/kv_events.py) produced through msgspec. Which vLLM release sends which is
// not settled (only E3 was seen from a live engine), so a decoder reads all three and the names
// carry no version numbers.
type Shape uint8

const (
	// ShapeUnknown: an array batch without events (E1 and E3 look alike then), a map batch of
	// array events (no known publisher), or a Batch that was not decoded.
	ShapeUnknown Shape = iota
	// ShapeE1: array batch [ts, events, data_parallel_rank] of array events: kv_events.py with
	// array_like on every class (vLLM's source up to about v0.22; llm-d-inference-sim's array
	// mode).
	ShapeE1
	// ShapeE2: map batch {"ts", "events", "data_parallel_rank"} of map events: array_like
	// removed from the batch class too (the newest upstream kv_events.py in public indexes).
	ShapeE2
	// ShapeE3: array batch of map events: array_like removed from the event classes only (a live
	// v0.26.0 capture; llm-d-inference-sim's map mode).
	ShapeE3
)

func (s Shape) String() string {
	switch s {
	case ShapeE1:
		return "E1"
	case ShapeE2:
		return "E2"
	case ShapeE3:
		return "E3"
	}
	return "unknown"
}

// Layouts returns the batch and event layouts of s (LayoutUnknown for ShapeUnknown).
func (s Shape) Layouts() (batch, events Layout) {
	switch s {
	case ShapeE1:
		return LayoutArray, LayoutArray
	case ShapeE2:
		return LayoutMap, LayoutMap
	case ShapeE3:
		return LayoutArray, LayoutMap
	}
	return LayoutUnknown, LayoutUnknown
}

// BlockStored is a newly cached (or, in full report mode, re-announced) run of full blocks.
type BlockStored struct {
	BlockHashes     []Hash
	ParentBlockHash Opt[Hash] // unset when the run starts at block 0 (None, or integer 0: see noParentZero)
	TokenIDs        []uint32  // every token of the run (masked blocks keep their tokens)
	BlockSize       int64
	LoRAID          Opt[int64]
	Medium          Opt[string] // "GPU", "CPU", and offload media ("STORAGE", "FS", "OBJ", ...)
	LoRAName        Opt[string]
	// ExtraKeys has one entry per block hash (an empty Extras is None); unset when the event does
	// not carry the field or carries None.
	ExtraKeys                Opt[[]blockkey.Extras]
	GroupIdx                 Opt[int64]
	KVCacheSpecKind          Opt[string]
	KVCacheSpecSlidingWindow Opt[int64]
	// Locality is "LOCAL" or "REMOTE" (vLLM #48281): a REMOTE copy is held by storage the
	// engine reaches, not by the engine itself.
	Locality Opt[string]
	// Ownership names who owns the copy (vLLM #52067; e.g. a KV connector); part of the
	// residency key copies are counted by.
	Ownership Opt[string]
	// SessionID is the session the blocks were cached for (vLLM #51381; SGLang's metadata).
	SessionID Opt[string]
	// CacheSalt is the salt of the request that stored the blocks, as SGLang sends it (its
	// metadata element or map field; vLLM puts the salt in extra_keys instead). On a run with no
	// parent it is block 0's extra key, as the router keys a salted request.
	CacheSalt Opt[string]
}

// BlockRemoved is the eviction of cached blocks.
type BlockRemoved struct {
	BlockHashes []Hash
	Medium      Opt[string]
	GroupIdx    Opt[int64]
	Locality    Opt[string]
	Ownership   Opt[string]
}

// Event is one event of a batch; Type says which of Stored and Removed is filled.
type Event struct {
	Type    EventType
	Tag     string // the wire tag, for EventUnknown
	Stored  BlockStored
	Removed BlockRemoved
}

// Batch is one KVEventBatch: [ts, events, data_parallel_rank] or the same as a map.
type Batch struct {
	TS               float64
	Events           []Event
	DataParallelRank Opt[int64]
	Layout           Layout // of the events (the first event's), as decoded
	BatchLayout      Layout // of the batch itself, as decoded
}

// Shape is the batch's shape as decoded, from BatchLayout and Layout.
func (b *Batch) Shape() Shape {
	switch {
	case b.BatchLayout == LayoutMap && b.Layout != LayoutArray:
		return ShapeE2 // no events still shows the map batch, which only E2 has
	case b.BatchLayout == LayoutArray && b.Layout == LayoutArray:
		return ShapeE1
	case b.BatchLayout == LayoutArray && b.Layout == LayoutMap:
		return ShapeE3
	}
	return ShapeUnknown
}

// BlockExtras returns block i's extras as the event gives them, for re-keying with
// blockkey.NextKey (see blockkey.ExtrasFromEvent).
func (s *BlockStored) BlockExtras(dst blockkey.Extras, i int) (blockkey.Extras, error) {
	var ek []blockkey.Extras
	if s.ExtraKeys.OK {
		ek = s.ExtraKeys.V
		if ek == nil {
			ek = []blockkey.Extras{}
		}
	}
	ex, err := blockkey.ExtrasFromEvent(dst, s.LoRAName.V, ek, i)
	if err != nil || i != 0 || s.ParentBlockHash.OK || !s.CacheSalt.OK || s.CacheSalt.V == "" {
		return ex, err
	}
	// A copy: ex may be the decoder's own extra_keys entry.
	out := append(append(dst[:0:0], ex...), blockkey.String(s.CacheSalt.V))
	return out, nil
}

// CheckTokens reports whether the event's sizes are consistent: a block size in
// 1..blockkey.MaxBlockSize and exactly one block of token ids per hash. Every size here comes
// from the wire, so the check divides instead of multiplying: hashes x block_size can overflow
// (4 x 2^62 wraps to 0, which matched an empty token list and then sliced past it).
func (s *BlockStored) CheckTokens() error {
	n := len(s.BlockHashes)
	if !blockkey.ValidBlockSize(s.BlockSize) {
		return fmt.Errorf("kvwire: BlockStored block size %d is outside 1..%d", s.BlockSize, blockkey.MaxBlockSize)
	}
	bs := int(s.BlockSize) // fits: at most MaxBlockSize
	if len(s.TokenIDs)%bs != 0 || len(s.TokenIDs)/bs != n {
		return fmt.Errorf("kvwire: BlockStored has %d tokens for %d hashes of block size %d", len(s.TokenIDs), n, s.BlockSize)
	}
	return nil
}

// AppendRouterKeys appends the router keys of the event's blocks, chained from parent (the
// router key of the block before the run: blockkey.RootKey when ParentBlockHash is unset). It needs
// one BlockSize window of TokenIDs per hash, which holds for full-attention groups; events with
// masked blocks (sliding-window, Mamba) or partial entries cannot be re-keyed and get an error.
func (s *BlockStored) AppendRouterKeys(dst []blockkey.Key, parent blockkey.Key) ([]blockkey.Key, error) {
	if err := s.CheckTokens(); err != nil {
		return dst, err
	}
	n, bs := len(s.BlockHashes), int(s.BlockSize)
	var stack [4]blockkey.ExtraKey
	scratch := blockkey.Extras(stack[:0])
	var h blockkey.KeyHasher
	for i := 0; i < n; i++ {
		ex, err := s.BlockExtras(scratch, i)
		if err != nil {
			return dst, fmt.Errorf("kvwire: %w", err)
		}
		parent = h.Next(parent, s.TokenIDs[i*bs:(i+1)*bs], ex)
		dst = append(dst, parent)
	}
	return dst, nil
}
