package vllmsim

// blockPool is one rank's KV block pool with vLLM's prefix-cache bookkeeping
// (vllm/v1/core/block_pool.py): block 0 is the reserved null block; free blocks sit in a queue
// whose head is reused first; a freed block keeps its hash (still a cache hit) and goes to the
// tail, and is evicted (BlockRemoved) only when it is popped for reuse; blocks of running
// requests have a reference count and are never evicted. Not safe for concurrent use: the
// rank's lock guards it.
type blockPool struct {
	blockSize int
	blocks    []*kvBlock
	free      kvBlock // sentinel of the circular free queue
	numFree   int
	// cached maps a full digest to the physical blocks holding it, oldest first: vLLM keeps
	// duplicates (two requests computing the same block) and hits the first.
	cached map[string][]*kvBlock
	events []simEvent // produced since the last take, in order
}

type kvBlock struct {
	id         int
	ref        int
	hash       []byte // full digest while cached, nil otherwise
	extra      []string
	prev, next *kvBlock
}

// simEvent is one KV event as the pool produces it; the publisher turns it into vLLM's wire form.
type simEvent struct {
	kind      eventKind
	hashes    [][]byte // full digests (the wire form keeps the last 8 bytes)
	parent    []byte   // nil when the run starts at block 0
	tokens    []uint32
	extraKeys [][]string // one entry per hash, nil for a block without extras (None)
	loraID    *int
	loraName  *string
	blockSize int
}

type eventKind int

const (
	evStored eventKind = iota
	evRemoved
	evCleared
)

func newBlockPool(numBlocks, blockSize int) *blockPool {
	p := &blockPool{blockSize: blockSize, cached: map[string][]*kvBlock{}}
	p.free.prev, p.free.next = &p.free, &p.free
	p.blocks = make([]*kvBlock, numBlocks)
	for i := range p.blocks {
		p.blocks[i] = &kvBlock{id: i}
		if i > 0 { // block 0 is the null block, never handed out
			p.pushTail(p.blocks[i])
		}
	}
	return p
}

func (p *blockPool) pushTail(b *kvBlock) {
	b.prev, b.next = p.free.prev, &p.free
	p.free.prev.next = b
	p.free.prev = b
	p.numFree++
}

func (p *blockPool) unlink(b *kvBlock) {
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = nil, nil
	p.numFree--
}

// capacity is the number of usable blocks (all but the null block).
func (p *blockPool) capacity() int { return len(p.blocks) - 1 }

// usage is vLLM's kv_cache_usage_perc: the share of blocks referenced by requests.
func (p *blockPool) usage() float64 { return 1 - float64(p.numFree)/float64(p.capacity()) }

// lookup returns the cached blocks of the longest run of leading hashes, at most maxBlocks.
func (p *blockPool) lookup(hashes [][]byte, maxBlocks int) []*kvBlock {
	var hit []*kvBlock
	for i := 0; i < len(hashes) && i < maxBlocks; i++ {
		bs := p.cached[string(hashes[i])]
		if len(bs) == 0 {
			break
		}
		hit = append(hit, bs[0])
	}
	return hit
}

// canAllocate says whether n new blocks fit once the evictable blocks among hits are touched.
func (p *blockPool) canAllocate(n int, hits []*kvBlock) bool {
	evictableHits := 0
	for _, b := range hits {
		if b.ref == 0 {
			evictableHits++
		}
	}
	return n <= p.numFree-evictableHits
}

// touch takes a reference on hit blocks, taking free ones out of the queue.
func (p *blockPool) touch(bs []*kvBlock) {
	for _, b := range bs {
		if b.ref == 0 {
			p.unlink(b)
		}
		b.ref++
	}
}

// allocate pops n blocks from the head of the free queue, evicting their cached hashes.
func (p *blockPool) allocate(n int) []*kvBlock {
	out := make([]*kvBlock, 0, n)
	for range n {
		b := p.free.next
		p.unlink(b)
		p.evict(b)
		b.ref = 1
		out = append(out, b)
	}
	return out
}

func (p *blockPool) evict(b *kvBlock) {
	if b.hash == nil {
		return
	}
	key := string(b.hash)
	bs := p.cached[key]
	for i, x := range bs {
		if x == b {
			bs = append(bs[:i:i], bs[i+1:]...)
			break
		}
	}
	if len(bs) == 0 {
		delete(p.cached, key)
	} else {
		p.cached[key] = bs
	}
	p.events = append(p.events, simEvent{kind: evRemoved, hashes: [][]byte{b.hash}})
	b.hash, b.extra = nil, nil
}

// release drops one reference on each block; the caller passes them tail first (vLLM frees a
// request's blocks in reverse so its last blocks are evicted first).
func (p *blockPool) release(bs []*kvBlock) {
	for _, b := range bs {
		b.ref--
		if b.ref == 0 {
			p.pushTail(b)
		}
	}
}

// cacheFull registers blocks [from, to) of a request under their hashes and records one
// BlockStored for them (vLLM's cache_full_blocks).
func (p *blockPool) cacheFull(r *engineRequest, from, to int) {
	if to <= from {
		return
	}
	ev := simEvent{kind: evStored, blockSize: p.blockSize, loraID: r.loraID, loraName: r.loraName}
	if from > 0 {
		ev.parent = r.blockHashes[from-1]
	}
	for i := from; i < to; i++ {
		b := r.blocks[i]
		b.hash = r.blockHashes[i]
		b.extra = r.extraKeys(i, p.blockSize)
		p.cached[string(b.hash)] = append(p.cached[string(b.hash)], b)
		ev.hashes = append(ev.hashes, b.hash)
		ev.extraKeys = append(ev.extraKeys, b.extra)
	}
	ev.tokens = append([]uint32(nil), r.tokenRange(from*p.blockSize, to*p.blockSize)...)
	p.events = append(p.events, ev)
}

// reannounce records the full-report-mode BlockStored for a request's n hit blocks:
// parent nil, tokens from 0, no state change (spec §5).
func (p *blockPool) reannounce(r *engineRequest, n int) {
	ev := simEvent{kind: evStored, blockSize: p.blockSize, loraID: r.loraID, loraName: r.loraName}
	for i := range n {
		ev.hashes = append(ev.hashes, r.blockHashes[i])
		ev.extraKeys = append(ev.extraKeys, r.extraKeys(i, p.blockSize))
	}
	ev.tokens = append([]uint32(nil), r.tokenRange(0, n*p.blockSize)...)
	p.events = append(p.events, ev)
}

// reset empties the cache if no block is referenced (vLLM's reset_prefix_cache) and records
// AllBlocksCleared when emit is set.
func (p *blockPool) reset(emit bool) bool {
	if p.numFree != p.capacity() {
		return false
	}
	for _, b := range p.blocks {
		b.hash, b.extra = nil, nil
	}
	p.cached = map[string][]*kvBlock{}
	if emit {
		p.events = append(p.events, simEvent{kind: evCleared})
	}
	return true
}

// takeEvents hands over the events produced since the last call.
func (p *blockPool) takeEvents() []simEvent {
	ev := p.events
	p.events = nil
	return ev
}

// cachedHashes lists the distinct cached digests.
func (p *blockPool) cachedHashes() [][]byte {
	out := make([][]byte, 0, len(p.cached))
	for _, bs := range p.cached {
		out = append(out, bs[0].hash)
	}
	return out
}
