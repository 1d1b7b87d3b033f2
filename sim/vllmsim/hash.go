package vllmsim

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/fxamacker/cbor/v2"
	"github.com/zeebo/xxh3"
)

// The block hasher below is written for the simulator alone, independently of router/blockkey
// (TestIndependentOfRouterCodecs keeps it that way), from the spec's §2 and vLLM's
// vllm/utils/hashing.py and vllm/v1/core/kv_cache_utils.py (hash_block_tokens, init_none_hash,
// generate_block_hash_extra_keys). Two implementations that agree with the spec's vectors
// (TestBlockHashesMatchVLLMVectors) are a real cross-check; one shared implementation is not.

// simIdentity is what besides token ids enters a simulated request's block hashes: the LoRA
// adapter name (every block) and the cache salt (block 0). The sim has no multimodal input.
type simIdentity struct {
	LoRAName  string
	CacheSalt string
}

// blockExtras is block i's extra_keys tuple in vLLM's order (LoRA name, then the salt on block
// 0); nil is Python's None, what vLLM uses for a block without extras.
func (id simIdentity) blockExtras(i int) []string {
	var out []string
	if id.LoRAName != "" {
		out = append(out, id.LoRAName)
	}
	if i == 0 && id.CacheSalt != "" {
		out = append(out, id.CacheSalt)
	}
	return out
}

// blockHasher computes vLLM's engine block hash: digest(serialize((parent, tokens, extras)))
// with parent NONE_HASH = digest(serialize(PYTHONHASHSEED string)) at a chain's start. Safe for
// concurrent use (it keeps no scratch state).
type blockHasher struct {
	useCBOR bool
	digest  func([]byte) []byte
	cbor    cbor.EncMode
	none    []byte
}

func newBlockHasher(algo, seed string) (*blockHasher, error) {
	h := &blockHasher{}
	switch algo {
	case "sha256", "sha256_cbor":
		h.digest = func(b []byte) []byte { d := sha256.Sum256(b); return d[:] }
	case "xxhash", "xxhash_cbor":
		// xxhash.xxh3_128_digest: seed 0, canonical big-endian (high 64 bits first).
		h.digest = func(b []byte) []byte {
			u := xxh3.Hash128(b)
			out := binary.BigEndian.AppendUint64(make([]byte, 0, 16), u.Hi)
			return binary.BigEndian.AppendUint64(out, u.Lo)
		}
	default:
		// vllm/utils/hashing.py get_hash_fn_by_name accepts exactly these four names.
		return nil, fmt.Errorf("unknown hash algorithm %q (sha256, sha256_cbor, xxhash, xxhash_cbor)", algo)
	}
	if algo == "sha256_cbor" || algo == "xxhash_cbor" {
		em, err := cbor.CanonicalEncOptions().EncMode() // cbor2.dumps(x, canonical=True)
		if err != nil {
			return nil, err
		}
		h.useCBOR, h.cbor = true, em
	}
	in, err := h.serialize(seed)
	if err != nil {
		return nil, err
	}
	h.none = h.digest(in) // init_none_hash: the seed string itself, hashed
	return h, nil
}

// serialize is pickle.dumps(v, protocol=5) or cbor2.dumps(v, canonical=True) of a seed string
// (v string) or a block input (v blockInput).
func (h *blockHasher) serialize(v any) ([]byte, error) {
	if h.useCBOR {
		if in, ok := v.(blockInput); ok {
			var extras any // None
			if in.extras != nil {
				extras = in.extras
			}
			return h.cbor.Marshal([]any{in.parent, in.tokens, extras})
		}
		return h.cbor.Marshal(v)
	}
	return pickleDumps(v)
}

type blockInput struct {
	parent []byte
	tokens []uint32
	extras []string
}

// block returns the digest of one full block; parent nil means the chain start (NONE_HASH).
func (h *blockHasher) block(parent []byte, tokens []uint32, extras []string) ([]byte, error) {
	if parent == nil {
		parent = h.none
	}
	in, err := h.serialize(blockInput{parent: parent, tokens: tokens, extras: extras})
	if err != nil {
		return nil, err
	}
	return h.digest(in), nil
}

// wireHash is vLLM's int block hash on the wire (maybe_convert_block_hash with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default): the low 64 bits of the digest read
// big-endian, i.e. its last 8 bytes.
func wireHash(digest []byte) uint64 { return binary.BigEndian.Uint64(digest[len(digest)-8:]) }

// pickleDumps writes what CPython's C pickler emits for protocol 5 (spec §2.7.1): PROTO 5, one
// FRAME with its 8-byte little-endian length, the body, STOP. Only the values a block input
// holds are supported: str, bytes, ints (token ids), tuples, None. Strings and bytes are
// memoized once each; vLLM's inputs never repeat an object inside one block, so no BINGET is
// ever needed.
func pickleDumps(v any) ([]byte, error) {
	body := make([]byte, 0, 128)
	switch x := v.(type) {
	case string:
		body = pickleStr(body, x)
	case blockInput:
		body = pickleBytes(body, x.parent)
		// tuple(curr_block_token_ids)
		if len(x.tokens) >= 4 {
			body = append(body, '(')
		}
		for _, t := range x.tokens {
			body = pickleInt(body, t)
		}
		body = pickleTupleEnd(body, len(x.tokens))
		if x.extras == nil {
			body = append(body, 'N')
		} else {
			if len(x.extras) >= 4 {
				body = append(body, '(')
			}
			for _, s := range x.extras {
				body = pickleStr(body, s)
			}
			body = pickleTupleEnd(body, len(x.extras))
		}
		body = pickleTupleEnd(body, 3)
	default:
		return nil, fmt.Errorf("pickle: unsupported value %T", v)
	}
	body = append(body, '.') // STOP
	if len(body) > 64*1024 {
		// The C pickler would start a second frame here; block sizes that large are not simulated.
		return nil, fmt.Errorf("pickle: block input of %d bytes needs more than one frame", len(body))
	}
	out := make([]byte, 0, len(body)+11)
	out = append(out, 0x80, 5) // PROTO 5
	if len(body) >= 4 {
		out = append(out, 0x95) // FRAME
		out = binary.LittleEndian.AppendUint64(out, uint64(len(body)))
	}
	return append(out, body...), nil
}

func pickleInt(b []byte, t uint32) []byte {
	switch {
	case t < 1<<8:
		return append(b, 'K', byte(t)) // BININT1
	case t < 1<<16:
		return append(b, 'M', byte(t), byte(t>>8)) // BININT2
	case t < 1<<31:
		return binary.LittleEndian.AppendUint32(append(b, 'J'), t) // BININT
	default: // LONG1: minimal two's complement, little-endian; a sign byte keeps it positive
		return append(binary.LittleEndian.AppendUint32(append(b, 0x8a, 5), t), 0)
	}
}

func pickleStr(b []byte, s string) []byte {
	if len(s) < 256 {
		b = append(b, 0x8c, byte(len(s))) // SHORT_BINUNICODE
	} else {
		b = binary.LittleEndian.AppendUint32(append(b, 'X'), uint32(len(s))) // BINUNICODE
	}
	return append(append(b, s...), 0x94) // MEMOIZE
}

func pickleBytes(b []byte, p []byte) []byte {
	if len(p) < 256 {
		b = append(b, 'C', byte(len(p))) // SHORT_BINBYTES
	} else {
		b = binary.LittleEndian.AppendUint32(append(b, 'B'), uint32(len(p))) // BINBYTES
	}
	return append(append(b, p...), 0x94)
}

// pickleTupleEnd closes a tuple of n items already written (after a MARK when n >= 4).
func pickleTupleEnd(b []byte, n int) []byte {
	switch n {
	case 0:
		return append(b, ')') // EMPTY_TUPLE, not memoized
	case 1, 2, 3:
		return append(b, 0x85+byte(n-1), 0x94) // TUPLE1..3, MEMOIZE
	default:
		return append(b, 't', 0x94) // TUPLE, MEMOIZE
	}
}
