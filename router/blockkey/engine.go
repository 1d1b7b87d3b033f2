package blockkey

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"
)

// Algo is a vLLM --prefix-caching-hash-algo value.
type Algo string

// The four algorithms vLLM accepts (spec §2.2).
const (
	AlgoSHA256     Algo = "sha256"      // SHA-256 over pickle protocol 5 (vLLM's default)
	AlgoSHA256CBOR Algo = "sha256_cbor" // SHA-256 over canonical CBOR
	AlgoXXHash     Algo = "xxhash"      // XXH3-128 over pickle protocol 5
	AlgoXXHashCBOR Algo = "xxhash_cbor" // XXH3-128 over canonical CBOR
)

// Algos lists the algorithms in a stable order.
var Algos = []Algo{AlgoSHA256, AlgoSHA256CBOR, AlgoXXHash, AlgoXXHashCBOR}

// ParseAlgo checks an algorithm name, rejecting what vLLM's get_hash_fn_by_name rejects.
func ParseAlgo(s string) (Algo, error) {
	for _, a := range Algos {
		if string(a) == s {
			return a, nil
		}
	}
	return "", fmt.Errorf("unknown hash algorithm %q (want sha256, sha256_cbor, xxhash or xxhash_cbor)", s)
}

func (a Algo) cbor() bool { return a == AlgoSHA256CBOR || a == AlgoXXHashCBOR }

// DigestSize is the length of a block hash: 32 for the SHA-256 algorithms, 16 for XXH3-128.
func (a Algo) DigestSize() int {
	if a == AlgoXXHash || a == AlgoXXHashCBOR {
		return 16
	}
	return 32
}

// EngineHasher computes vLLM's exact block hashes for one algorithm and PYTHONHASHSEED. It reuses
// one serialization buffer, so it is not safe for concurrent use; make one per goroutine.
type EngineHasher struct {
	algo Algo
	none []byte
	pk   []byte       // pickle scratch, appended into
	buf  bytes.Buffer // CBOR scratch (the library writes into a Buffer)
}

// NewEngineHasher returns a hasher whose chains start at NONE_HASH = hash(seed), the seed string
// hashed as a Python str, as vLLM does when PYTHONHASHSEED is set.
func NewEngineHasher(algo Algo, seed string) (*EngineHasher, error) {
	if _, err := ParseAlgo(string(algo)); err != nil {
		return nil, err
	}
	h := &EngineHasher{algo: algo}
	var in []byte
	var err error
	if algo.cbor() {
		err = appendCBORStr(&h.buf, seed)
		in = h.buf.Bytes()
	} else {
		in, err = appendPickleStr(nil, seed)
	}
	if err != nil {
		return nil, fmt.Errorf("serialize seed: %w", err)
	}
	h.none = h.digest(nil, in)
	return h, nil
}

// Algo returns the hasher's algorithm.
func (h *EngineHasher) Algo() Algo { return h.algo }

// NoneHash returns NONE_HASH, the parent of block 0 (do not modify it).
func (h *EngineHasher) NoneHash() []byte { return h.none }

func (h *EngineHasher) digest(dst, in []byte) []byte {
	if h.algo == AlgoXXHash || h.algo == AlgoXXHashCBOR {
		d := xxh3.Hash128(in).Bytes() // canonical big-endian: hi64 then lo64, as xxhash.xxh3_128_digest
		return append(dst, d[:]...)
	}
	d := sha256.Sum256(in)
	return append(dst, d[:]...)
}

// Serialize returns the exact bytes vLLM hashes for one block: pickle-5 or canonical CBOR of
// (parent, tuple(tokens), extras or None). An empty parent means NONE_HASH. The result is valid
// until the next call on h.
func (h *EngineHasher) Serialize(parent []byte, tokens []uint32, extras Extras) ([]byte, error) {
	if len(parent) == 0 {
		parent = h.none
	}
	if h.algo.cbor() {
		h.buf.Reset()
		if err := appendCBORBlock(&h.buf, parent, tokens, extras); err != nil {
			return nil, err
		}
		return h.buf.Bytes(), nil
	}
	var err error
	h.pk, err = appendPickleBlock(h.pk[:0], parent, tokens, extras)
	return h.pk, err
}

// HashBlock appends to dst the block hash of one block (vLLM's hash_block_tokens). An empty parent
// means NONE_HASH; otherwise parent must be the full digest of the previous block, never a wire int.
func (h *EngineHasher) HashBlock(dst, parent []byte, tokens []uint32, extras Extras) ([]byte, error) {
	in, err := h.Serialize(parent, tokens, extras)
	if err != nil {
		return dst, err
	}
	return h.digest(dst, in), nil
}

// HashPrompt returns the block hash of every full block of tokens, chained from NONE_HASH, with
// the identity's extras per block (vLLM's request block hasher over a whole prompt).
func (h *EngineHasher) HashPrompt(tokens []uint32, blockSize int, id Identity) ([][]byte, error) {
	if blockSize <= 0 {
		return nil, errBlockSize
	}
	if err := id.Normalize(); err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	n := len(tokens) / blockSize
	size := h.algo.DigestSize()
	all := make([]byte, 0, n*size)
	out := make([][]byte, n)
	var extras Extras
	parent := h.none
	for b := 0; b < n; b++ {
		extras = id.BlockExtras(extras, b, blockSize)
		var err error
		if all, err = h.HashBlock(all, parent, tokens[b*blockSize:(b+1)*blockSize], extras); err != nil {
			return nil, fmt.Errorf("block %d: %w", b, err)
		}
		out[b] = all[b*size : (b+1)*size : (b+1)*size]
		parent = out[b]
	}
	return out, nil
}

// WireInt is the uint64 vLLM publishes for a block hash by default
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): the last 8 bytes of the digest, big-endian. Shorter
// inputs are read as a big-endian number.
func WireInt(digest []byte) uint64 {
	if len(digest) >= 8 {
		return binary.BigEndian.Uint64(digest[len(digest)-8:])
	}
	var v uint64
	for _, b := range digest {
		v = v<<8 | uint64(b)
	}
	return v
}
