package vllmsim

import (
	"sync"

	"github.com/kvroute/kvroute/router/blockkey"
)

// engineHasher gives concurrent callers (HTTP handlers, rank loops) vLLM's exact block hash
// from router/blockkey, whose hashers keep scratch buffers and so are pooled here.
type engineHasher struct {
	pool sync.Pool
}

func newEngineHasher(algo, seed string) (*engineHasher, error) {
	a, err := blockkey.ParseAlgo(algo)
	if err != nil {
		return nil, err
	}
	first, err := blockkey.NewEngineHasher(a, seed)
	if err != nil {
		return nil, err
	}
	h := &engineHasher{}
	h.pool.New = func() any {
		eh, _ := blockkey.NewEngineHasher(a, seed) // already checked above
		return eh
	}
	h.pool.Put(first)
	return h, nil
}

// block returns the digest of one full block; parent nil means the chain start (NONE_HASH).
func (h *engineHasher) block(parent []byte, tokens []uint32, extras blockkey.Extras) ([]byte, error) {
	eh := h.pool.Get().(*blockkey.EngineHasher)
	defer h.pool.Put(eh)
	return eh.HashBlock(nil, parent, tokens, extras)
}

// wireHash is vLLM's int block hash on the wire.
func wireHash(digest []byte) uint64 { return blockkey.WireInt(digest) }
