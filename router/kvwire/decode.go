package kvwire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/engine"
)

// maxDepth bounds nesting in skipped or unmodelled values, so hostile input cannot recurse deeply.
const maxDepth = 32

// maxInterned bounds the decoder's string table (media, kinds, LoRA names repeat on every event).
const maxInterned = 1024

// Decoder decodes KVEventBatch payloads. It reuses one msgpack decoder and every destination
// slice, so the batch it returns (and every slice and raw hash in it) is valid only until the
// next DecodeBatch call. Not safe for concurrent use: one per subscriber goroutine.
type Decoder struct {
	payload []byte
	r       bytes.Reader
	md      *msgpack.Decoder
	scratch []byte
	arena   []byte              // raw-bytes hashes and unmodelled extra keys
	extras  []blockkey.ExtraKey // backing store of every block's Extras
	intern  map[string]string
	batch   Batch
	// kind is the engine whose positional layout array events are read in (see arrayField).
	kind engine.Kind
	// libOnly turns the raw readers off so every value goes through the library; tests use it
	// to check that both paths decode every input alike.
	libOnly bool
}

// NewDecoder returns a decoder of vLLM's wire, ready for DecodeBatch.
func NewDecoder() *Decoder { return NewDecoderFor(engine.VLLM) }

// NewDecoderFor returns a decoder of kind's wire. Batches and map events read alike for every
// engine; what differs is an array event's positions (SGLang's seventh field is a metadata map
// where vLLM has lora_name) and SGLang's token pairs under speculative decoding.
func NewDecoderFor(kind engine.Kind) *Decoder {
	// A non-nil arena from the start: an empty bin hash or extra key sliced from a nil arena
	// would be nil, and a nil Bytes reads as an integer hash.
	d := &Decoder{intern: make(map[string]string), arena: make([]byte, 0, 256), kind: kind.Or(engine.VLLM)}
	d.md = msgpack.NewDecoder(&d.r) // bytes.Reader is a ByteScanner: no extra buffering
	return d
}

// DecodeBatch decodes one payload. Unknown map keys, extra trailing array elements and unknown
// event types are skipped; a wrong type, a truncated value or a length longer than the input is
// an error (and never a panic or an allocation larger than the input).
func (d *Decoder) DecodeBatch(payload []byte) (*Batch, error) {
	d.payload = payload
	d.r.Reset(payload)
	d.md.ResetReader(&d.r)
	d.arena = d.arena[:0]
	d.extras = d.extras[:0]
	b := &d.batch
	b.TS, b.DataParallelRank, b.Layout, b.BatchLayout = 0, Opt[int64]{}, LayoutUnknown, LayoutUnknown
	if err := d.decodeBatch(b); err != nil {
		return nil, fmt.Errorf("kvwire: %w", err)
	}
	if d.r.Len() != 0 {
		return nil, fmt.Errorf("kvwire: %d bytes after the batch", d.r.Len())
	}
	return b, nil
}

// decodeBatch reads the batch in either layout: KVEventBatch is [ts, events, data_parallel_rank]
// while its class is array_like (shapes E1, E3) and a map of the same fields once array_like is
// removed from it (E2; see Shape).
func (d *Decoder) decodeBatch(b *Batch) error {
	c, err := d.peek()
	if err != nil {
		return d.eof(err)
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		b.BatchLayout = LayoutArray
		return d.decodeArrayBatch(b)
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		b.BatchLayout = LayoutMap
		return d.decodeMapBatch(b)
	}
	return fmt.Errorf("batch is msgpack code 0x%02x, want an array or a map", c)
}

func (d *Decoder) decodeArrayBatch(b *Batch) error {
	n, err := d.arrayLen("batch")
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("batch has %d elements, want [ts, events, data_parallel_rank]", n)
	}
	if b.TS, err = d.float("ts"); err != nil {
		return err
	}
	if err := d.decodeEvents(b); err != nil {
		return err
	}
	if n >= 3 {
		if b.DataParallelRank, err = d.optInt("data_parallel_rank"); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ {
		if err := d.skip(0); err != nil {
			return err
		}
	}
	return nil
}

// decodeMapBatch reads {"ts": .., "events": [..], "data_parallel_rank": ..} by name, in any key
// order. msgspec writes the keys in declaration order and, with omit_defaults, leaves
// data_parallel_rank out when it is None; keys it does not know (a subclass's extra fields, e.g.
// a plugin's instance id) are skipped. "ts" and "events" have no default, so msgspec always
// writes them: a batch without either, or with a field twice, is an error.
func (d *Decoder) decodeMapBatch(b *Batch) error {
	n, err := d.mapLen("batch")
	if err != nil {
		return err
	}
	const hasTS, hasEvents, hasRank = 1, 2, 4
	var seen uint8
	for i := 0; i < n; i++ {
		key, err := d.strBytes("batch key")
		if err != nil {
			return err
		}
		var bit uint8
		switch string(key) {
		case "ts":
			bit = hasTS
		case "events":
			bit = hasEvents
		case "data_parallel_rank":
			bit = hasRank
		}
		if seen&bit != 0 { // before the value is read: key may alias the scratch buffer
			return fmt.Errorf("map batch has key %q twice", key)
		}
		seen |= bit
		switch bit {
		case hasTS:
			b.TS, err = d.float("ts")
		case hasEvents:
			err = d.decodeEvents(b)
		case hasRank:
			b.DataParallelRank, err = d.optInt("data_parallel_rank")
		default:
			err = d.skip(0)
		}
		if err != nil {
			return err
		}
	}
	switch {
	case seen&hasTS == 0:
		return errors.New(`map batch lacks "ts"`)
	case seen&hasEvents == 0:
		return errors.New(`map batch lacks "events"`)
	}
	return nil
}

// decodeEvents reads the events array into b.Events and sets b.Layout from the first event.
func (d *Decoder) decodeEvents(b *Batch) error {
	ne, err := d.arrayLen("events")
	if err != nil {
		return err
	}
	if cap(b.Events) < ne {
		b.Events = append(b.Events[:cap(b.Events)], make([]Event, ne-cap(b.Events))...)
	}
	b.Events = b.Events[:ne]
	for i := range b.Events {
		e := &b.Events[i]
		layout, err := d.decodeEvent(e)
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if b.Layout == LayoutUnknown {
			b.Layout = layout
		}
	}
	return nil
}

func (d *Decoder) decodeEvent(e *Event) (Layout, error) {
	c, err := d.peek()
	if err != nil {
		return 0, d.eof(err)
	}
	switch {
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		return LayoutMap, d.decodeMapEvent(e)
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		return LayoutArray, d.decodeArrayEvent(e)
	}
	return 0, fmt.Errorf("event is msgpack code 0x%02x, want a map or an array", c)
}

// resetEvent clears e for reuse, keeping slice storage.
func resetEvent(e *Event) {
	clearStored(&e.Stored)
	e.Removed = BlockRemoved{BlockHashes: e.Removed.BlockHashes[:0]}
	e.Type, e.Tag = EventUnknown, ""
}

func (d *Decoder) setTag(e *Event, tag []byte) {
	switch string(tag) {
	case TagBlockStored:
		e.Type, e.Tag = EventBlockStored, TagBlockStored
	case TagBlockRemoved:
		e.Type, e.Tag = EventBlockRemoved, TagBlockRemoved
	case TagAllBlocksCleared:
		e.Type, e.Tag = EventAllBlocksCleared, TagAllBlocksCleared
	default:
		e.Type, e.Tag = EventUnknown, d.internBytes(tag)
	}
}

// Field indices of BlockStored in declaration order (= array position - 1 = map key order).
const (
	fBlockHashes = iota
	fParentBlockHash
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fKVCacheSpecKind
	fKVCacheSpecSlidingWindow
	fLocality
	fOwnership
	fSessionID
	// fCacheSalt and fMetadata are SGLang's (a map event's cache_salt; the metadata map that
	// ends a positional BlockStored); no vLLM array position reaches them.
	fCacheSalt
	fMetadata
	numStoredFields
)

// numVLLMArrayFields is how many BlockStored positions vLLM's array layout has.
const numVLLMArrayFields = fSessionID + 1

// sglangStoredFields are SGLang's BlockStored positions after the tag: its legacy array with
// medium, then the metadata map BlockStoredWithMetadata appends when a request carried a salt
// or a session (python/sglang/srt/disaggregation/kv_events.py; the seven-element base array
// stays as it was when no metadata is present).
var sglangStoredFields = [...]int{fBlockHashes, fParentBlockHash, fTokenIDs, fBlockSize, fLoRAID, fMedium, fMetadata}

var storedFields = [numStoredFields]string{
	"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
	"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality",
	"ownership", "session_id", "cache_salt", "metadata",
}

// removedFields are BlockRemoved's fields in declaration order, as BlockStored field indices
// (vLLM's contract test, tests/v1/core/test_kv_events_contract.py at commit a0db8d8a0eb8, pins
// block_hashes, medium required and group_idx, locality, ownership optional, in that order).
var removedFields = [...]int{fBlockHashes, fMedium, fGroupIdx, fLocality, fOwnership}

const storedRequired = 1<<fBlockHashes | 1<<fParentBlockHash | 1<<fTokenIDs | 1<<fBlockSize

func classHas(t EventType, f int) bool {
	switch t {
	case EventBlockStored:
		return f >= 0
	case EventBlockRemoved:
		for _, r := range removedFields {
			if r == f {
				return true
			}
		}
	}
	return false
}

// fieldIndex maps a map key to its field (-1 when unknown); a switch, not a loop over
// storedFields, because it runs for every key of every event.
func fieldIndex(name []byte) int {
	switch string(name) {
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParentBlockHash
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fKVCacheSpecKind
	case "kv_cache_spec_sliding_window":
		return fKVCacheSpecSlidingWindow
	case "locality":
		return fLocality
	case "ownership":
		return fOwnership
	case "session_id":
		return fSessionID
	case "cache_salt":
		return fCacheSalt
	}
	return -1
}

// storedField decodes field f into s, which holds the fields of either event class.
func (d *Decoder) storedField(s *BlockStored, f int) (err error) {
	switch f {
	case fBlockHashes:
		s.BlockHashes, err = d.hashes(s.BlockHashes[:0])
	case fParentBlockHash:
		s.ParentBlockHash, err = d.optHash()
	case fTokenIDs:
		if d.kind == engine.SGLang {
			s.TokenIDs, err = d.sglangTokens(s.TokenIDs[:0])
		} else {
			s.TokenIDs, err = d.tokens(s.TokenIDs[:0])
		}
	case fBlockSize:
		s.BlockSize, err = d.int("block_size")
	case fLoRAID:
		s.LoRAID, err = d.optInt("lora_id")
	case fMedium:
		s.Medium, err = d.optStr("medium")
	case fLoRAName:
		s.LoRAName, err = d.optStr("lora_name")
	case fExtraKeys:
		s.ExtraKeys, err = d.extraKeys(s.ExtraKeys.V[:0])
	case fGroupIdx:
		s.GroupIdx, err = d.optInt("group_idx")
	case fKVCacheSpecKind:
		s.KVCacheSpecKind, err = d.optStr("kv_cache_spec_kind")
	case fKVCacheSpecSlidingWindow:
		s.KVCacheSpecSlidingWindow, err = d.optInt("kv_cache_spec_sliding_window")
	case fLocality:
		s.Locality, err = d.optStr("locality")
	case fOwnership:
		s.Ownership, err = d.optStr("ownership")
	case fSessionID:
		s.SessionID, err = d.optStr("session_id")
	case fCacheSalt:
		s.CacheSalt, err = d.optStr("cache_salt")
	case fMetadata:
		err = d.sglangMetadata(s)
	default:
		err = d.skip(0)
	}
	if err != nil && f >= 0 {
		return fmt.Errorf("field %s: %w", storedFields[f], err)
	}
	return err
}

// decodeMapEvent reads {"type": tag, field: value, ...} by name, in any key order; unknown keys
// (and fields the event class does not have) are skipped.
func (d *Decoder) decodeMapEvent(e *Event) error {
	resetEvent(e)
	n, err := d.mapLen("event")
	if err != nil {
		return err
	}
	// The type first, wherever its key stands (msgspec writes it first, so this is usually
	// one key), so every field is read as its class has it or skipped for an unknown class.
	start := d.pos()
	if err := d.scanType(e, n); err != nil {
		return err
	}
	d.seek(start)
	var seen uint32
	for i := 0; i < n; i++ {
		key, err := d.strBytes("event key")
		if err != nil {
			return err
		}
		f := -1 // "type" (already read), unknown keys, and other classes' fields are skipped
		if string(key) != "type" {
			if g := fieldIndex(key); classHas(e.Type, g) {
				f = g
			}
		}
		if err := d.storedField(&e.Stored, f); err != nil {
			return err
		}
		if f >= 0 {
			seen |= 1 << f
		}
	}
	return finishEvent(e, seen)
}

// scanType reads the keys of a map event of n keys from the current position up to "type",
// skipping the values before it, and sets the event's tag from it.
func (d *Decoder) scanType(e *Event, n int) error {
	for i := 0; i < n; i++ {
		key, err := d.strBytes("event key")
		if err != nil {
			return err
		}
		if string(key) == "type" {
			tag, err := d.strBytes("type")
			if err != nil {
				return err
			}
			d.setTag(e, tag)
			return nil
		}
		if err := d.skip(0); err != nil {
			return err
		}
	}
	return errors.New(`map event without "type"`)
}

// decodeArrayEvent reads [tag, field1, ...] by position; trailing fields a version lacks stay
// unset, extra trailing elements are skipped.
func (d *Decoder) decodeArrayEvent(e *Event) error {
	resetEvent(e)
	n, err := d.arrayLen("event")
	if err != nil {
		return err
	}
	if n < 1 {
		return errors.New("empty event array")
	}
	tag, err := d.strBytes("event tag")
	if err != nil {
		return err
	}
	d.setTag(e, tag)
	var seen uint32
	for p := 1; p < n; p++ {
		f := d.arrayField(e.Type, p-1)
		if err := d.storedField(&e.Stored, f); err != nil {
			return err
		}
		if f >= 0 {
			seen |= 1 << f
		}
	}
	return finishEvent(e, seen)
}

// arrayField is the field at position i (after the tag) of an array event of class t in the
// decoder's engine layout, or -1 for a position to skip.
func (d *Decoder) arrayField(t EventType, i int) int {
	switch t {
	case EventBlockStored:
		if d.kind == engine.SGLang {
			if i < len(sglangStoredFields) {
				return sglangStoredFields[i]
			}
		} else if i < numVLLMArrayFields {
			return i
		}
	case EventBlockRemoved:
		if i < len(removedFields) {
			return removedFields[i]
		}
	}
	return -1
}

// finishEvent checks required fields and moves BlockRemoved's fields into place.
func finishEvent(e *Event, seen uint32) error {
	s := &e.Stored
	switch e.Type {
	case EventBlockStored:
		if seen&storedRequired != storedRequired {
			return errors.New("BlockStored lacks one of block_hashes, parent_block_hash, token_ids, block_size")
		}
		noParentZero(s)
		return checkStored(s)
	case EventBlockRemoved:
		if seen&(1<<fBlockHashes) == 0 {
			return errors.New("BlockRemoved lacks block_hashes")
		}
		r := &e.Removed
		r.BlockHashes, s.BlockHashes = s.BlockHashes, r.BlockHashes[:0]
		r.Medium, r.GroupIdx, r.Locality, r.Ownership = s.Medium, s.GroupIdx, s.Locality, s.Ownership
		clearStored(s)
	default:
		clearStored(s)
	}
	return nil
}

// noParentZero reads an integer parent_block_hash of 0 as no parent, in both event layouts.
// vLLM sends None (vllm/distributed/kv_events.py: ExternalBlockHash | None), but
// llm-d-inference-sim's array layout writes 0 for "no parent" (pkg/kv-cache/kv_cache_sender.go:
// kvblock.EmptyBlockHash, which is 0), and llm-d-kv-cache's vLLM adapter
// (pkg/kvevents/engineadapter/vllm_adapter.go) reads None as that same 0, so to llm-d 0 and None
// are one value whatever the layout. Read as a real parent, every such
// event names a block no replica holds and is skipped. The map layout gets the same rule (there
// llm-d-inference-sim writes nil, but any publisher built on llm-d's uint64 ParentHash can only
// say 0): a real vLLM integer hash is the low 64 bits of a sha256 or xxh3-128 digest
// (vllm/v1/core/kv_cache_utils.py), so it is 0 with probability 2^-64, and misreading one would
// only key that one event from the root. Raw-bytes hashes are left alone: no publisher sends
// zero bytes for none.
func noParentZero(s *BlockStored) {
	if p := &s.ParentBlockHash; p.OK && !p.V.IsBytes() && p.V.Int == 0 {
		*p = Opt[Hash]{}
	}
}

// clearStored clears the BlockStored half after its fields were used for another class.
func clearStored(s *BlockStored) {
	*s = BlockStored{BlockHashes: s.BlockHashes[:0], TokenIDs: s.TokenIDs[:0], ExtraKeys: Opt[[]blockkey.Extras]{V: s.ExtraKeys.V[:0]}}
}

func checkStored(s *BlockStored) error {
	if !blockkey.ValidBlockSize(s.BlockSize) {
		return fmt.Errorf("BlockStored block_size %d, want 1..%d", s.BlockSize, blockkey.MaxBlockSize)
	}
	if s.ExtraKeys.OK && len(s.ExtraKeys.V) != len(s.BlockHashes) {
		return fmt.Errorf("BlockStored has %d extra_keys entries for %d block hashes", len(s.ExtraKeys.V), len(s.BlockHashes))
	}
	return nil
}

// --- primitives -----------------------------------------------------------------------------

func (d *Decoder) pos() int { return len(d.payload) - d.r.Len() }

// seek moves the library's reader to payload offset p (0 <= p <= len(payload)), past what a raw
// reader consumed.
func (d *Decoder) seek(p int) { _, _ = d.r.Seek(int64(p), io.SeekStart) }

// rest is the unread payload, for the raw readers; empty when libOnly.
func (d *Decoder) rest() []byte {
	if d.libOnly {
		return nil
	}
	return d.payload[d.pos():]
}

var errTruncated = errors.New("input ends inside a value")

// peek returns the next msgpack code without consuming it (the library's PeekCode without its
// two interface calls).
func (d *Decoder) peek() (byte, error) {
	if p := d.pos(); p < len(d.payload) {
		return d.payload[p], nil
	}
	return 0, errTruncated
}

func (d *Decoder) eof(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errTruncated
	}
	return err
}

func (d *Decoder) isNil() (bool, error) {
	c, err := d.peek()
	if err != nil {
		return false, d.eof(err)
	}
	if c == msgpcode.Nil {
		_, _ = d.r.ReadByte()
		return true, nil
	}
	return false, nil
}

// fixLen reads a fixarray or fixmap header (mask: its length bits) straight from the payload;
// ok is false for any other code, which the library then reads.
func (d *Decoder) fixLen(fixed func(byte) bool, mask byte) (n int, ok bool) {
	if d.libOnly {
		return 0, false
	}
	p := d.pos()
	if p >= len(d.payload) || !fixed(d.payload[p]) {
		return 0, false
	}
	d.seek(p + 1)
	return int(d.payload[p] & mask), true
}

// checkLen refuses a length header that claims more items than bytes are left (each item takes
// at least one byte), so no allocation is driven by a hostile header.
func (d *Decoder) checkLen(what string, n, perItem int) error {
	if n < 0 || n > d.r.Len()/perItem {
		return fmt.Errorf("%s claims %d items with %d bytes left", what, n, d.r.Len())
	}
	return nil
}

func (d *Decoder) arrayLen(what string) (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, d.eof(err)
	}
	if !(msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32) {
		return 0, fmt.Errorf("%s is msgpack code 0x%02x, want an array", what, c)
	}
	if n, ok := d.fixLen(msgpcode.IsFixedArray, msgpcode.FixedArrayMask); ok {
		return n, d.checkLen(what, n, 1)
	}
	n, err := d.md.DecodeArrayLen()
	if err != nil {
		return 0, d.eof(err)
	}
	return n, d.checkLen(what, n, 1)
}

func (d *Decoder) mapLen(what string) (int, error) {
	if n, ok := d.fixLen(msgpcode.IsFixedMap, msgpcode.FixedMapMask); ok {
		return n, d.checkLen(what, n, 2)
	}
	n, err := d.md.DecodeMapLen()
	if err != nil {
		return 0, d.eof(err)
	}
	return n, d.checkLen(what, n, 2)
}

func isStr(c byte) bool {
	return msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32
}

func isBin(c byte) bool { return c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32 }

// rawBytes reads a str or bin body after checking its length against the input; the result
// aliases the payload or d.scratch and is valid until the next read.
func (d *Decoder) rawBytes(what string) ([]byte, error) {
	if b := d.rest(); len(b) > 0 {
		if n, w := rawBytesHeader(b); w > 0 {
			d.seek(d.pos() + w + n)
			return b[w : w+n : w+n], nil
		}
	}
	n, err := d.md.DecodeBytesLen()
	if err != nil {
		return nil, d.eof(err)
	}
	if err := d.checkLen(what, n, 1); err != nil {
		return nil, err
	}
	if cap(d.scratch) < n {
		d.scratch = make([]byte, n)
	}
	b := d.scratch[:n]
	if err := d.md.ReadFull(b); err != nil {
		return nil, d.eof(err)
	}
	return b, nil
}

func (d *Decoder) strBytes(what string) ([]byte, error) {
	c, err := d.peek()
	if err != nil {
		return nil, d.eof(err)
	}
	if !isStr(c) {
		return nil, fmt.Errorf("%s is msgpack code 0x%02x, want a string", what, c)
	}
	return d.rawBytes(what)
}

func (d *Decoder) internBytes(b []byte) string {
	if s, ok := d.intern[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(d.intern) < maxInterned {
		d.intern[s] = s
	}
	return s
}

func (d *Decoder) optStr(what string) (Opt[string], error) {
	if null, err := d.isNil(); null || err != nil {
		return Opt[string]{}, err
	}
	b, err := d.strBytes(what)
	if err != nil {
		return Opt[string]{}, err
	}
	return Some(d.internBytes(b)), nil
}

func (d *Decoder) int(what string) (int64, error) {
	if v, u64, w := rawInt(d.rest()); w > 0 && !(u64 && v > math.MaxInt64) {
		d.seek(d.pos() + w)
		return int64(v), nil
	}
	c, err := d.peek()
	if err != nil {
		return 0, d.eof(err)
	}
	if c == msgpcode.Uint64 {
		v, err := d.md.DecodeUint64()
		if err != nil {
			return 0, d.eof(err)
		}
		if v > math.MaxInt64 {
			return 0, fmt.Errorf("%s %d out of range", what, v)
		}
		return int64(v), nil
	}
	if !isInt(c) {
		return 0, fmt.Errorf("%s is msgpack code 0x%02x, want an integer", what, c)
	}
	v, err := d.md.DecodeInt64()
	return v, d.eof(err)
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64) || (c >= msgpcode.Int8 && c <= msgpcode.Int64)
}

func (d *Decoder) optInt(what string) (Opt[int64], error) {
	if null, err := d.isNil(); null || err != nil {
		return Opt[int64]{}, err
	}
	v, err := d.int(what)
	if err != nil {
		return Opt[int64]{}, err
	}
	return Some(v), nil
}

func (d *Decoder) float(what string) (float64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, d.eof(err)
	}
	if c != msgpcode.Double && c != msgpcode.Float && !isInt(c) {
		return 0, fmt.Errorf("%s is msgpack code 0x%02x, want a number", what, c)
	}
	v, err := d.md.DecodeFloat64()
	return v, d.eof(err)
}

func (d *Decoder) hash() (Hash, error) {
	c, err := d.peek()
	if err != nil {
		return Hash{}, d.eof(err)
	}
	if isBin(c) {
		b, err := d.rawBytes("hash")
		if err != nil {
			return Hash{}, err
		}
		start := len(d.arena)
		d.arena = append(d.arena, b...)
		return Hash{Bytes: d.arena[start:len(d.arena):len(d.arena)]}, nil
	}
	if !isInt(c) {
		return Hash{}, fmt.Errorf("hash is msgpack code 0x%02x, want an integer or bytes", c)
	}
	if v, _, w := rawInt(d.rest()); w > 0 {
		d.seek(d.pos() + w)
		return Hash{Int: v}, nil
	}
	// Negative ints (only from vLLM ≤ 0.10.1's builtin hash) keep their two's-complement bits.
	v, err := d.md.DecodeUint64()
	return Hash{Int: v}, d.eof(err)
}

func (d *Decoder) optHash() (Opt[Hash], error) {
	if null, err := d.isNil(); null || err != nil {
		return Opt[Hash]{}, err
	}
	h, err := d.hash()
	if err != nil {
		return Opt[Hash]{}, err
	}
	return Some(h), nil
}

func (d *Decoder) hashes(dst []Hash) ([]Hash, error) {
	n, err := d.arrayLen("block_hashes")
	if err != nil {
		return dst, err
	}
	i := 0
	if b := d.rest(); len(b) > 0 {
		// Integer hashes straight from the payload; anything else from the first non-integer on
		// goes through d.hash.
		p := 0
		for ; i < n; i++ {
			v, _, w := rawInt(b[p:])
			if w == 0 {
				break
			}
			dst = append(dst, Hash{Int: v})
			p += w
		}
		d.seek(d.pos() + p)
	}
	for ; i < n; i++ {
		h, err := d.hash()
		if err != nil {
			return dst, fmt.Errorf("hash %d: %w", i, err)
		}
		dst = append(dst, h)
	}
	return dst, nil
}

func (d *Decoder) tokens(dst []uint32) ([]uint32, error) {
	n, err := d.arrayLen("token_ids")
	if err != nil {
		return dst, err
	}
	return d.tokenBody(dst, n)
}

// sglangTokens reads SGLang's token_ids: token ids, or under EAGLE speculative decoding one
// [token, next token] pair per position (mem_cache/events.py keeps that payload for bigram
// keys). A pair's first element is the token at its position, so a page of pairs gives exactly
// the page's token ids, one per position, as the flat form does.
func (d *Decoder) sglangTokens(dst []uint32) ([]uint32, error) {
	n, err := d.arrayLen("token_ids")
	if err != nil || n == 0 {
		return dst, err
	}
	c, err := d.peek()
	if err != nil {
		return dst, d.eof(err)
	}
	if !isArray(c) {
		return d.tokenBody(dst, n)
	}
	for i := 0; i < n; i++ {
		m, err := d.arrayLen("token pair")
		if err != nil {
			return dst, fmt.Errorf("token %d: %w", i, err)
		}
		if m < 1 {
			return dst, fmt.Errorf("token %d: empty token pair", i)
		}
		v, err := d.int("token id")
		if err != nil {
			return dst, fmt.Errorf("token %d: %w", i, err)
		}
		if v < 0 || v > math.MaxUint32 {
			return dst, fmt.Errorf("token %d: id %d out of range 0..4294967295", i, v)
		}
		dst = append(dst, uint32(v))
		for j := 1; j < m; j++ {
			if err := d.skip(0); err != nil {
				return dst, err
			}
		}
	}
	return dst, nil
}

// sglangMetadata reads the metadata map SGLang appends to a positional BlockStored
// (BlockStoredMetadata: cache_salt, session_id; neither takes part in the block hash) or a
// None. Keys it does not know are skipped.
func (d *Decoder) sglangMetadata(s *BlockStored) error {
	if null, err := d.isNil(); null || err != nil {
		return err
	}
	n, err := d.mapLen("metadata")
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		key, err := d.strBytes("metadata key")
		if err != nil {
			return err
		}
		switch string(key) {
		case "cache_salt":
			s.CacheSalt, err = d.optStr("cache_salt")
		case "session_id":
			s.SessionID, err = d.optStr("session_id")
		default:
			err = d.skip(0)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

// tokenBody reads n token ids after the array header.
func (d *Decoder) tokenBody(dst []uint32, n int) ([]uint32, error) {
	i := 0
	if b := d.rest(); len(b) > 0 {
		// Token ids straight from the payload while they are integers in uint32 range; the rest
		// (and the error) from d.int.
		p := 0
		for ; i < n && p < len(b); i++ {
			// The forms vLLM's vocabularies produce, inline; rawInt for the others.
			switch c := b[p]; {
			case c <= msgpcode.PosFixedNumHigh:
				dst = append(dst, uint32(c))
				p++
				continue
			case c == msgpcode.Uint32 && len(b)-p >= 5:
				dst = append(dst, be32(b[p+1:]))
				p += 5
				continue
			case c == msgpcode.Uint16 && len(b)-p >= 3:
				dst = append(dst, uint32(be16(b[p+1:])))
				p += 3
				continue
			}
			v, _, w := rawInt(b[p:])
			if w == 0 || v > math.MaxUint32 {
				break
			}
			dst = append(dst, uint32(v))
			p += w
		}
		d.seek(d.pos() + p)
	}
	for ; i < n; i++ {
		v, err := d.int("token id")
		if err != nil {
			return dst, fmt.Errorf("token %d: %w", i, err)
		}
		if v < 0 || v > math.MaxUint32 {
			// vLLM's token ids are Python ints, but every vocabulary fits uint32, the type the
			// router keys and hashes them as; the request and render paths refuse the same ids.
			return dst, fmt.Errorf("token %d: id %d out of range 0..4294967295", i, v)
		}
		dst = append(dst, uint32(v))
	}
	return dst, nil
}

// extraKeys reads extra_keys: None, or one entry per block, each None or an array of str (LoRA
// name, cache salt), [str, int] (multimodal item), bin (prompt-embeds digest), or anything else
// (kept raw as blockkey.ExtraOther).
func (d *Decoder) extraKeys(dst []blockkey.Extras) (Opt[[]blockkey.Extras], error) {
	if null, err := d.isNil(); null || err != nil {
		return Opt[[]blockkey.Extras]{V: dst}, err
	}
	n, err := d.arrayLen("extra_keys")
	if err != nil {
		return Opt[[]blockkey.Extras]{V: dst}, err
	}
	for i := 0; i < n; i++ {
		ex, err := d.blockExtras()
		if err != nil {
			return Opt[[]blockkey.Extras]{V: dst}, fmt.Errorf("entry %d: %w", i, err)
		}
		dst = append(dst, ex)
	}
	return Opt[[]blockkey.Extras]{V: dst, OK: true}, nil
}

func (d *Decoder) blockExtras() (blockkey.Extras, error) {
	if null, err := d.isNil(); null || err != nil {
		return nil, err
	}
	m, err := d.arrayLen("extra keys")
	if err != nil {
		return nil, err
	}
	start := len(d.extras)
	for j := 0; j < m; j++ {
		k, err := d.extraKey()
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", j, err)
		}
		d.extras = append(d.extras, k)
	}
	return blockkey.Extras(d.extras[start:len(d.extras):len(d.extras)]), nil
}

func (d *Decoder) extraKey() (blockkey.ExtraKey, error) {
	c, err := d.peek()
	if err != nil {
		return blockkey.ExtraKey{}, d.eof(err)
	}
	switch {
	case isStr(c):
		b, err := d.rawBytes("extra key")
		if err != nil {
			return blockkey.ExtraKey{}, err
		}
		return blockkey.String(d.internBytes(b)), nil
	case isBin(c):
		b, err := d.rawBytes("extra key")
		if err != nil {
			return blockkey.ExtraKey{}, err
		}
		return blockkey.ExtraKey{Kind: blockkey.ExtraBytes, Bytes: d.keep(b)}, nil
	}
	// A multimodal item is [str, int]; anything else is kept as its raw msgpack.
	start := d.pos()
	if k, ok := d.tryMM(c); ok {
		return k, nil
	}
	if _, err := d.r.Seek(int64(start), io.SeekStart); err != nil {
		return blockkey.ExtraKey{}, err
	}
	if err := d.skip(0); err != nil {
		return blockkey.ExtraKey{}, err
	}
	return blockkey.ExtraKey{Kind: blockkey.ExtraOther, Bytes: d.keep(d.payload[start:d.pos()])}, nil
}

func (d *Decoder) tryMM(c byte) (blockkey.ExtraKey, bool) {
	if c != msgpcode.FixedArrayLow|2 {
		return blockkey.ExtraKey{}, false
	}
	_, _ = d.r.ReadByte()
	id, err := d.strBytes("identifier")
	if err != nil {
		return blockkey.ExtraKey{}, false
	}
	s := d.internBytes(id)
	off, err := d.int("offset")
	if err != nil {
		return blockkey.ExtraKey{}, false
	}
	return blockkey.MM(s, off), true
}

func (d *Decoder) keep(b []byte) []byte {
	start := len(d.arena)
	d.arena = append(d.arena, b...)
	return d.arena[start:len(d.arena):len(d.arena)]
}

// skip passes over one value of any type without allocating: lengths are checked against the
// input and bodies are seeked over; nesting is bounded.
func (d *Decoder) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("values nested deeper than %d", maxDepth)
	}
	c, err := d.peek()
	if err != nil {
		return d.eof(err)
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.arrayLen("value")
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.mapLen("value")
		if err != nil {
			return err
		}
		for i := 0; i < 2*n; i++ {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isStr(c) || isBin(c):
		n, err := d.md.DecodeBytesLen()
		if err != nil {
			return d.eof(err)
		}
		return d.advance("string", n)
	case c >= msgpcode.FixExt1 && c <= msgpcode.FixExt16, c == msgpcode.Ext8, c == msgpcode.Ext16, c == msgpcode.Ext32:
		_, n, err := d.md.DecodeExtHeader()
		if err != nil {
			return d.eof(err)
		}
		return d.advance("ext", n)
	}
	// Scalars: fixed size, the library reads them without allocating.
	return d.eof(d.md.Skip())
}

func (d *Decoder) advance(what string, n int) error {
	if err := d.checkLen(what, n, 1); err != nil {
		return err
	}
	_, err := d.r.Seek(int64(n), io.SeekCurrent)
	return err
}
