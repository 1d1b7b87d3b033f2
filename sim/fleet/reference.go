package fleet

import "container/heap"

// Reference lines are computed timing-free on one cache of the whole capacity, counting every
// requested block found in the cache (block-level hit rate). Each block is looked up and then
// made resident in turn, which reproduces the published reference figures exactly.

// GlobalLRU is the hit rate of one LRU cache of capacity blocks over the whole trace.
func GlobalLRU(t *Trace, capacity int) float64 {
	c := newLRU(capacity)
	found, total := 0, 0
	for i := range t.Requests {
		ids := t.Requests[i].HashIDs
		total += len(ids)
		for _, h := range ids {
			if c.contains(h) {
				found++
			}
			c.touch(h)
		}
	}
	return ratio(found, total)
}

// Belady is the hit rate of one cache of capacity blocks with optimal eviction: on a miss with a
// full cache, evict the resident block whose next use is farthest in the future (never used
// again counts as infinitely far). It needs the future, so next uses are precomputed.
func Belady(t *Trace, capacity int) float64 {
	// Flatten the trace into one access sequence and precompute, for each access, the position
	// of the next access to the same block.
	var seq []uint64
	for i := range t.Requests {
		seq = append(seq, t.Requests[i].HashIDs...)
	}
	next := make([]int, len(seq))
	last := make(map[uint64]int, len(seq)/2)
	const never = int(^uint(0) >> 1)
	for i := len(seq) - 1; i >= 0; i-- {
		if j, ok := last[seq[i]]; ok {
			next[i] = j
		} else {
			next[i] = never
		}
		last[seq[i]] = i
	}
	if capacity <= 0 {
		return 0
	}
	// resident: block -> its next use; a max-heap on next use with lazy deletion of stale entries.
	resident := make(map[uint64]int, capacity)
	h := &maxHeap{}
	found := 0
	for i, b := range seq {
		if _, ok := resident[b]; ok {
			found++
		} else if len(resident) >= capacity {
			for {
				top := heap.Pop(h).(heapItem)
				if nu, ok := resident[top.block]; ok && nu == top.next {
					delete(resident, top.block)
					break
				}
			}
		}
		resident[b] = next[i]
		heap.Push(h, heapItem{block: b, next: next[i]})
	}
	return ratio(found, len(seq))
}

type heapItem struct {
	block uint64
	next  int
}

type maxHeap []heapItem

func (h maxHeap) Len() int           { return len(h) }
func (h maxHeap) Less(i, j int) bool { return h[i].next > h[j].next }
func (h maxHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *maxHeap) Push(x any)        { *h = append(*h, x.(heapItem)) }
func (h *maxHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
