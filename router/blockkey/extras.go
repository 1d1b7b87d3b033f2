package blockkey

import (
	"errors"
	"fmt"
	"sort"
)

// ExtraKind says which Python value one element of vLLM's per-block extra_keys tuple is.
type ExtraKind uint8

const (
	// ExtraString is a Python str: a LoRA adapter name or a cache salt (vLLM does not tell them
	// apart inside the tuple; their position does).
	ExtraString ExtraKind = iota + 1
	// ExtraMM is a multimodal item: the 2-tuple (identifier, offset of the item from the block start).
	ExtraMM
	// ExtraBytes is a Python bytes value (a prompt-embeds digest); only seen in events.
	ExtraBytes
	// ExtraOther is a form kvroute does not model, kept as its msgpack encoding in Bytes. It takes
	// part in router keys (so such blocks never match a request we can describe), but the engine
	// hash refuses it.
	ExtraOther
)

// ExtraKey is one element of a block's extra_keys tuple.
type ExtraKey struct {
	Kind   ExtraKind
	Str    string // ExtraString value, ExtraMM identifier
	Offset int64  // ExtraMM: item offset minus block start (negative when the item began earlier)
	Bytes  []byte // ExtraBytes value, ExtraOther msgpack encoding
}

// Extras is a block's extra_keys tuple in vLLM's order (LoRA name, multimodal items, cache salt).
// An empty Extras is Python's None: vLLM sends None, never (), for a block without extras.
type Extras []ExtraKey

// String returns a new ExtraString key.
func String(s string) ExtraKey { return ExtraKey{Kind: ExtraString, Str: s} }

// MM returns a new ExtraMM key.
func MM(identifier string, offsetFromBlockStart int64) ExtraKey {
	return ExtraKey{Kind: ExtraMM, Str: identifier, Offset: offsetFromBlockStart}
}

// Equal reports whether two extras tuples are the same value.
func (e Extras) Equal(o Extras) bool {
	if len(e) != len(o) {
		return false
	}
	for i := range e {
		a, b := e[i], o[i]
		if a.Kind != b.Kind || a.Str != b.Str || a.Offset != b.Offset || string(a.Bytes) != string(b.Bytes) {
			return false
		}
	}
	return true
}

// MMItem is one multimodal input of a request: its identifier (vLLM's mm_hash, prefixed with
// "<lora_name>:" only when tower-connector LoRA is on) and its placeholder token range.
type MMItem struct {
	ID     string
	Offset int
	Length int
}

// Identity is what besides token ids changes a request's KV content and so its block hashes.
type Identity struct {
	LoRAName  string   // adapter name (not its integer id); "" for the base model
	CacheSalt string   // "" for none; applies to block 0 only
	MM        []MMItem // placeholder ranges; sorted by Normalize
}

// Normalize sorts the multimodal items by offset (in place, copying first so a caller's slice is
// never reordered) and checks them: vLLM walks them in offset order with a cursor, which equals the
// plain overlap test BlockExtras uses only for positive, non-overlapping ranges.
func (id *Identity) Normalize() error {
	if !sort.SliceIsSorted(id.MM, func(i, j int) bool { return id.MM[i].Offset < id.MM[j].Offset }) {
		id.MM = append([]MMItem(nil), id.MM...)
		sort.SliceStable(id.MM, func(i, j int) bool { return id.MM[i].Offset < id.MM[j].Offset })
	}
	for i, it := range id.MM {
		if it.Offset < 0 || it.Length <= 0 {
			return fmt.Errorf("multimodal item %q: offset %d and length %d must be >= 0 and > 0", it.ID, it.Offset, it.Length)
		}
		if i > 0 {
			prev := id.MM[i-1]
			if prev.Offset+prev.Length > it.Offset {
				return fmt.Errorf("multimodal items %q and %q overlap", prev.ID, it.ID)
			}
		}
	}
	return nil
}

// IsZero reports whether the identity adds nothing to any block.
func (id *Identity) IsZero() bool { return id.LoRAName == "" && id.CacheSalt == "" && len(id.MM) == 0 }

// BlockExtras appends to dst[:0] the extras of the block covering tokens [block*blockSize,
// (block+1)*blockSize), in vLLM's order: the LoRA name on every block, (identifier, offset -
// block start) for each multimodal item the block overlaps, the cache salt on block 0. The
// identity must be normalized. A block without extras returns an empty slice (Python None).
func (id *Identity) BlockExtras(dst Extras, block, blockSize int) Extras {
	dst = dst[:0]
	if id.LoRAName != "" {
		dst = append(dst, String(id.LoRAName))
	}
	start, end := block*blockSize, (block+1)*blockSize
	for _, it := range id.MM {
		if it.Offset+it.Length <= start {
			continue
		}
		if it.Offset >= end {
			break
		}
		dst = append(dst, MM(it.ID, int64(it.Offset-start)))
	}
	if block == 0 && id.CacheSalt != "" {
		dst = append(dst, String(id.CacheSalt))
	}
	return dst
}

// ExtrasFromEvent returns block i's extras as a decoded BlockStored event describes them, so the
// index can re-key the event with NextKey. extraKeys is the event's extra_keys (nil when the event
// does not carry it or carries None); vLLM ≥ 0.17 fills it per block, LoRA name included. Older
// engines (0.14–0.16) and some connectors send only lora_name: then the LoRA name alone is the
// block's extras, which is what vLLM hashed for a text-only LoRA request. dst is reused for that
// fallback.
func ExtrasFromEvent(dst Extras, loraName string, extraKeys []Extras, i int) (Extras, error) {
	if extraKeys != nil {
		if i < 0 || i >= len(extraKeys) {
			return nil, fmt.Errorf("extra_keys has %d entries, block %d asked", len(extraKeys), i)
		}
		return extraKeys[i], nil
	}
	dst = dst[:0]
	if loraName != "" {
		dst = append(dst, String(loraName))
	}
	return dst, nil
}

var errBlockSize = errors.New("block size must be > 0")
