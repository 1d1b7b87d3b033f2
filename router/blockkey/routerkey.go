package blockkey

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/zeebo/xxh3"
)

// RootKey is the parent of block 0 in every chain (the router's counterpart of vLLM's NONE_HASH).
// Any fixed value works; this one is "kvroute!" in ASCII.
const RootKey Key = 0x6b76726f75746521

// stackTokens is how many tokens NextKey hashes from a stack buffer; larger blocks are streamed.
// 256 is the largest block size the operator allows.
const stackTokens = 256

// NextKey returns the key of a block from its parent's key, its token ids and its extras. It is the
// one step both the request path (AppendPromptKeys) and event re-keying use, so equal KV gives
// equal keys. It does not allocate.
//
// Key = XXH3-64(parent LE | extras digest LE | tokens as uint32 LE).
func NextKey(parent Key, blockTokens []uint32, extras Extras) Key {
	var buf keyBuf
	return buf.next(parent, blockTokens, ExtrasDigest(extras))
}

// KeyHasher is NextKey with its scratch buffer kept between calls: use one for a run of blocks
// (an event's, a prompt's). The zero value is ready.
type KeyHasher struct{ buf keyBuf }

// Next is NextKey.
func (h *KeyHasher) Next(parent Key, blockTokens []uint32, extras Extras) Key {
	return h.buf.next(parent, blockTokens, ExtrasDigest(extras))
}

// keyBuf is the scratch NextKey hashes from. AppendPromptKeys keeps one for the whole prompt:
// a fresh 1 KiB array per block is zeroed every time, which cost as much as the hash itself at
// 16-token blocks.
type keyBuf [16 + 4*stackTokens]byte

func (buf *keyBuf) next(parent Key, blockTokens []uint32, extrasDigest uint64) Key {
	if len(blockTokens) == 16 { // same value, without the buffer (hashBlock16)
		return hashBlock16(uint64(parent), extrasDigest, (*[16]uint32)(blockTokens))
	}
	binary.LittleEndian.PutUint64(buf[0:], uint64(parent))
	binary.LittleEndian.PutUint64(buf[8:], extrasDigest)
	if len(blockTokens) <= stackTokens {
		p := buf[16 : 16+4*len(blockTokens)]
		for i, t := range blockTokens {
			binary.LittleEndian.PutUint32(p[4*i:], t)
		}
		return Key(xxh3.Hash(buf[:16+4*len(blockTokens)]))
	}
	// Streaming gives the same value as one-shot hashing of the same bytes.
	var h xxh3.Hasher
	_, _ = h.Write(buf[:16])
	for len(blockTokens) > 0 {
		n := min(len(blockTokens), stackTokens)
		for i, t := range blockTokens[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		_, _ = h.Write(buf[:4*n])
		blockTokens = blockTokens[n:]
	}
	return Key(h.Sum64())
}

// ExtrasDigest is the 64-bit digest of a block's extras that NextKey mixes in: 0 for none, else a
// chain of seeded XXH3 over each element's kind and value (no allocation). Elements are
// length-delimited by the chaining, so ("ab","c") and ("a","bc") differ.
func ExtrasDigest(extras Extras) uint64 {
	if len(extras) == 0 {
		return 0
	}
	d := uint64(0x9e3779b97f4a7c15) // any non-zero start, so a lone "" still differs from none
	for i := range extras {
		k := &extras[i]
		d = xxh3.HashStringSeed(k.Str, d^uint64(k.Kind)<<56)
		switch k.Kind {
		case ExtraMM:
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], uint64(k.Offset))
			d = xxh3.HashSeed(b[:], d)
		case ExtraBytes, ExtraOther:
			d = xxh3.HashSeed(k.Bytes, d)
		}
	}
	if d == 0 { // keep 0 meaning "no extras"
		d = 1
	}
	return d
}

// AppendPromptKeys appends to dst the router keys of every full block of tokens (a partial last
// block has no key, as in vLLM), chained from RootKey, with the identity's extras per block.
// Blocks without extras (the common text case) cost one XXH3 over the block and nothing else.
func AppendPromptKeys(dst []Key, tokens []uint32, blockSize int, id Identity) ([]Key, error) {
	if blockSize <= 0 {
		return dst, errBlockSize
	}
	n := len(tokens) / blockSize
	dst = slices.Grow(dst, n)
	var buf keyBuf
	if id.IsZero() {
		parent := RootKey
		if blockSize == 16 { // vLLM's default: hashed from the tokens in place (hashBlock16)
			for b := 0; b < n; b++ {
				parent = hashBlock16(uint64(parent), 0, (*[16]uint32)(tokens[b*16:]))
				dst = append(dst, parent)
			}
			return dst, nil
		}
		for b := 0; b < n; b++ {
			parent = buf.next(parent, tokens[b*blockSize:(b+1)*blockSize], 0)
			dst = append(dst, parent)
		}
		return dst, nil
	}
	if err := id.Normalize(); err != nil {
		return dst, fmt.Errorf("identity: %w", err)
	}
	var stack [4]ExtraKey
	extras := Extras(stack[:0])
	parent := RootKey
	for b := 0; b < n; b++ {
		extras = id.BlockExtras(extras, b, blockSize)
		parent = buf.next(parent, tokens[b*blockSize:(b+1)*blockSize], ExtrasDigest(extras))
		dst = append(dst, parent)
	}
	return dst, nil
}
