package fleet

// blockCache is one replica's prefix cache: an LRU of block ids in which blocks used by running
// requests are pinned (taken out of the eviction order) until the request ends. Written by hand
// because the general-purpose LRUs (golang-lru) have no pinning and the model needs it fast at
// 1,000 replicas; nodes live in one slice, linked by index.
type blockCache struct {
	capacity int
	index    map[uint64]int32
	nodes    []cacheNode
	free     []int32
	head     int32 // least recently used unpinned block, -1 when none
	tail     int32 // most recently used unpinned block
	pinned   int   // resident blocks with pins > 0
}

type cacheNode struct {
	key        uint64
	prev, next int32
	pins       int32
}

func newBlockCache(capacity int) *blockCache {
	return &blockCache{capacity: capacity, index: make(map[uint64]int32, capacity), head: -1, tail: -1}
}

func (c *blockCache) len() int { return len(c.index) }

func (c *blockCache) contains(k uint64) bool { _, ok := c.index[k]; return ok }

// prefix is the number of leading ids resident.
func (c *blockCache) prefix(ids []uint64) int {
	n := 0
	for n < len(ids) && c.contains(ids[n]) {
		n++
	}
	return n
}

// unpinnedNeeded is how many of ids would need a slot not already held by a pinned block.
func (c *blockCache) unpinnedNeeded(ids []uint64) int {
	n := 0
	for _, k := range ids {
		if i, ok := c.index[k]; !ok || c.nodes[i].pins == 0 {
			n++
		}
	}
	return n
}

func (c *blockCache) unlink(i int32) {
	n := &c.nodes[i]
	if n.prev >= 0 {
		c.nodes[n.prev].next = n.next
	} else {
		c.head = n.next
	}
	if n.next >= 0 {
		c.nodes[n.next].prev = n.prev
	} else {
		c.tail = n.prev
	}
	n.prev, n.next = -1, -1
}

func (c *blockCache) pushMRU(i int32) {
	n := &c.nodes[i]
	n.prev, n.next = c.tail, -1
	if c.tail >= 0 {
		c.nodes[c.tail].next = i
	} else {
		c.head = i
	}
	c.tail = i
}

// evictOne drops the least recently used unpinned block; false when every block is pinned.
func (c *blockCache) evictOne() bool {
	i := c.head
	if i < 0 {
		return false
	}
	c.unlink(i)
	delete(c.index, c.nodes[i].key)
	c.free = append(c.free, i)
	return true
}

// pin makes k resident and pinned. A new block evicts unpinned blocks to stay within capacity;
// if everything is pinned the cache runs over capacity (admission control normally prevents it).
func (c *blockCache) pin(k uint64) {
	if i, ok := c.index[k]; ok {
		if c.nodes[i].pins == 0 {
			c.unlink(i)
			c.pinned++
		}
		c.nodes[i].pins++
		return
	}
	for len(c.index) >= c.capacity && c.evictOne() {
	}
	var i int32
	if n := len(c.free); n > 0 {
		i = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		i = int32(len(c.nodes))
		c.nodes = append(c.nodes, cacheNode{})
	}
	c.nodes[i] = cacheNode{key: k, prev: -1, next: -1, pins: 1}
	c.index[k] = i
	c.pinned++
}

// unpin releases one pin on k; a block with no pins left becomes the most recently used.
func (c *blockCache) unpin(k uint64) {
	i, ok := c.index[k]
	if !ok || c.nodes[i].pins == 0 {
		return
	}
	c.nodes[i].pins--
	if c.nodes[i].pins == 0 {
		c.pinned--
		c.pushMRU(i)
		for len(c.index) > c.capacity && c.evictOne() {
		}
	}
}

// lru is the timing-free cache of the global-lru reference line (no pins).
type lru struct{ c *blockCache }

func newLRU(capacity int) *lru { return &lru{newBlockCache(capacity)} }

func (l *lru) contains(k uint64) bool { return l.c.contains(k) }

// touch makes k resident and most recently used.
func (l *lru) touch(k uint64) {
	if l.c.capacity <= 0 {
		return
	}
	l.c.pin(k)
	l.c.unpin(k)
}
