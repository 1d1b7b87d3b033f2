package kvtest

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvwire"
)

// Cache models one engine's GPU prefix cache closely enough to check an index against: which
// block hashes are resident, with how many physical copies, and the router key of each. Its
// methods return the events vLLM's block pool would publish for the change.
type Cache struct {
	h         *blockkey.EngineHasher
	blockSize int
	res       map[uint64]*entry
}

type entry struct {
	key    blockkey.Key
	copies int
}

// NewCache returns an empty cache hashing as vLLM does with algo and PYTHONHASHSEED seed.
func NewCache(algo blockkey.Algo, seed string, blockSize int) (*Cache, error) {
	h, err := blockkey.NewEngineHasher(algo, seed)
	if err != nil {
		return nil, err
	}
	if blockSize <= 0 {
		return nil, fmt.Errorf("kvtest: block size %d", blockSize)
	}
	return &Cache{h: h, blockSize: blockSize, res: map[uint64]*entry{}}, nil
}

// BlockSize is the cache's block size.
func (c *Cache) BlockSize() int { return c.blockSize }

// chain returns the wire hashes and router keys of every full block of tokens.
func (c *Cache) chain(tokens []uint32) ([]uint64, []blockkey.Key, error) {
	digests, err := c.h.HashPrompt(tokens, c.blockSize, blockkey.Identity{})
	if err != nil {
		return nil, nil, err
	}
	keys, err := blockkey.AppendPromptKeys(nil, tokens, c.blockSize, blockkey.Identity{})
	if err != nil {
		return nil, nil, err
	}
	hs := make([]uint64, len(digests))
	for i, d := range digests {
		hs[i] = blockkey.WireInt(d)
	}
	return hs, keys, nil
}

// Hashes returns the wire hashes of every full block of tokens.
func (c *Cache) Hashes(tokens []uint32) []uint64 {
	hs, _, err := c.chain(tokens)
	if err != nil {
		panic(err) // test helper: tokens and block size were checked by the caller
	}
	return hs
}

func (c *Cache) stored(tokens []uint32, from int, hs []uint64) kvwire.Event {
	n := len(hs)
	s := kvwire.BlockStored{
		TokenIDs:        append([]uint32(nil), tokens[from*c.blockSize:n*c.blockSize]...),
		BlockSize:       int64(c.blockSize),
		LoRAID:          kvwire.Opt[int64]{},
		Medium:          kvwire.Some("GPU"),
		ExtraKeys:       kvwire.Some(make([]blockkey.Extras, n-from)),
		GroupIdx:        kvwire.Some(int64(0)),
		KVCacheSpecKind: kvwire.Some("full_attention"),
	}
	for _, h := range hs[from:] {
		s.BlockHashes = append(s.BlockHashes, kvwire.IntHash(h))
	}
	if from > 0 {
		s.ParentBlockHash = kvwire.Some(kvwire.IntHash(hs[from-1]))
	}
	return kvwire.Event{Type: kvwire.EventBlockStored, Stored: s}
}

// Store caches a new physical copy of every full block of tokens from block from on (the first
// from blocks were prefix-cache hits), as cache_full_blocks does, and returns its BlockStored:
// parent nil when from is 0, else the hash of block from-1.
func (c *Cache) Store(tokens []uint32, from int) (kvwire.Event, error) {
	hs, keys, err := c.chain(tokens)
	if err != nil {
		return kvwire.Event{}, err
	}
	if from < 0 || from >= len(hs) {
		return kvwire.Event{}, fmt.Errorf("kvtest: store from block %d of %d", from, len(hs))
	}
	for i := from; i < len(hs); i++ {
		e := c.res[hs[i]]
		if e == nil {
			e = &entry{key: keys[i]}
			c.res[hs[i]] = e
		}
		e.copies++
	}
	return c.stored(tokens, from, hs), nil
}

// Reannounce returns the full-mode BlockStored of the first n blocks of tokens (parent nil, from
// token 0), which changes nothing in the cache; the blocks must be resident.
func (c *Cache) Reannounce(tokens []uint32, n int) (kvwire.Event, error) {
	hs, _, err := c.chain(tokens[:n*c.blockSize])
	if err != nil {
		return kvwire.Event{}, err
	}
	for _, h := range hs {
		if c.res[h] == nil {
			return kvwire.Event{}, fmt.Errorf("kvtest: re-announcing block %#x that is not resident", h)
		}
	}
	return c.stored(tokens, 0, hs), nil
}

// Evict drops one physical copy of the block and returns its BlockRemoved.
func (c *Cache) Evict(hash uint64) (kvwire.Event, error) {
	e := c.res[hash]
	if e == nil {
		return kvwire.Event{}, fmt.Errorf("kvtest: evicting block %#x that is not resident", hash)
	}
	if e.copies--; e.copies == 0 {
		delete(c.res, hash)
	}
	return kvwire.Event{Type: kvwire.EventBlockRemoved, Removed: kvwire.BlockRemoved{
		BlockHashes: []kvwire.Hash{kvwire.IntHash(hash)},
		Medium:      kvwire.Some("GPU"),
		GroupIdx:    kvwire.Some(int64(0)),
	}}, nil
}

// Clear empties the cache and returns AllBlocksCleared.
func (c *Cache) Clear() kvwire.Event {
	clear(c.res)
	return kvwire.Event{Type: kvwire.EventAllBlocksCleared}
}

// Resident returns engine hash -> router key of every resident block.
func (c *Cache) Resident() map[uint64]blockkey.Key {
	out := make(map[uint64]blockkey.Key, len(c.res))
	for h, e := range c.res {
		out[h] = e.key
	}
	return out
}

// Diff compares a replica's GPU tier in ix with want (engine hash -> router key) and returns ""
// when they hold the same blocks, else what differs first.
func Diff(ix *index.Index, id index.ReplicaID, want map[uint64]blockkey.Key) string {
	st, err := ix.Stats(id)
	if err != nil {
		return err.Error()
	}
	if st.Blocks[index.GPU] != len(want) {
		return fmt.Sprintf("index holds %d GPU blocks, want %d", st.Blocks[index.GPU], len(want))
	}
	for _, h := range sortedKeys(want) {
		k, ok := ix.ParentKey(id, h)
		if !ok {
			return fmt.Sprintf("block %#x missing", h)
		}
		if k != want[h] {
			return fmt.Sprintf("block %#x has key %#x, want %#x", h, k, want[h])
		}
	}
	return ""
}

func sortedKeys(m map[uint64]blockkey.Key) []uint64 { return slices.Sorted(maps.Keys(m)) }
