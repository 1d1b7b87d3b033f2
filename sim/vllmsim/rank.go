package vllmsim

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// errRestarted fails the requests a simulated process restart kills.
var errRestarted = errors.New("engine restarted")

// rank is one data-parallel engine core: its own block pool, scheduler and event stream.
// One goroutine (run) steps the scheduler; HTTP handlers submit and abort under mu.
type rank struct {
	idx    int
	cfg    *Config
	hasher *blockHasher
	pub    *publisher // nil when events are off
	obs    *rankMetrics

	mu      sync.Mutex
	pool    *blockPool
	waiting []*engineRequest // head is scheduled first (preempted requests go back to the head)
	running []*engineRequest
	aborts  []*engineRequest
	stats   rankStats
	gen     uint64 // process generation, bumped by restart
	paused  pauseState
	wake    chan struct{}

	held     map[string]*heldTransfer // prefill requests' blocks awaiting a decoder
	xfer     *transferStats
	sideHost string // side channel as a decoder dials it
	sidePort int
}

// rankStats are the counters /metrics exports, in tokens like vLLM's.
type rankStats struct {
	prefixQueries, prefixHits uint64
	promptTokens, genTokens   uint64
	preemptions               uint64
	finished                  uint64
}

func newRank(idx int, cfg *Config, h *blockHasher, obs *rankMetrics) *rank {
	return &rank{idx: idx, cfg: cfg, hasher: h, obs: obs,
		pool: newBlockPool(cfg.NumGPUBlocks, cfg.BlockSize), wake: make(chan struct{}, 1)}
}

func (rk *rank) poke() {
	select {
	case rk.wake <- struct{}{}:
	default:
	}
}

// submit queues requests (the choices of one HTTP request) at the tail of the waiting queue.
func (rk *rank) submit(rs ...*engineRequest) {
	now := time.Now()
	rk.mu.Lock()
	for _, r := range rs {
		r.arrival = now
		r.state = stateWaiting
		rk.waiting = append(rk.waiting, r)
	}
	rk.mu.Unlock()
	rk.poke()
}

// abort drops a request whose client went away; its blocks are freed at the next step.
func (rk *rank) abort(r *engineRequest) {
	rk.mu.Lock()
	if r.state != stateDone && !r.aborted {
		r.aborted = true
		rk.aborts = append(rk.aborts, r)
	}
	rk.mu.Unlock()
	rk.poke()
}

// load is vLLM's DP coordinator score: waiting requests weigh four times running ones.
func (rk *rank) load() int {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	return len(rk.waiting)*4 + len(rk.running)
}

// scheduled is one request's share of a step.
type scheduled struct {
	r      *engineRequest
	tokens int
	decode bool
}

// run steps the scheduler until ctx ends: schedule under the lock, spend the step's model time
// outside it, then apply the outputs and publish the step's events as one batch.
func (rk *rank) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		rk.mu.Lock()
		rk.applyAborts()
		if (len(rk.waiting) == 0 || rk.paused != unpaused) && (len(rk.running) == 0 || rk.paused == pausedAll) {
			rk.setGauges()
			evs, gen := rk.pool.takeEvents(), rk.gen
			rk.mu.Unlock()
			rk.publish(ctx, evs, gen)
			select {
			case <-ctx.Done():
				return
			case <-rk.wake:
				continue
			}
		}
		step := rk.schedule()
		dur := rk.stepTime(step)
		rk.setGauges()
		rk.mu.Unlock()

		if dur > 0 {
			timer.Reset(dur)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
		} else if len(step) == 0 {
			// Nothing fits this step (cannot happen for admitted requests); wait for a change.
			select {
			case <-ctx.Done():
				return
			case <-rk.wake:
			case <-time.After(time.Millisecond):
			}
		}

		rk.mu.Lock()
		rk.update(step)
		evs, gen := rk.pool.takeEvents(), rk.gen
		rk.setGauges()
		rk.mu.Unlock()
		rk.publish(ctx, evs, gen)
		if ctx.Err() != nil {
			return
		}
	}
}

// publish hands a step's events to the publisher outside the lock; gen is the process
// generation they were produced in, so batches of a pre-restart cache are never numbered as
// the restarted process's.
func (rk *rank) publish(ctx context.Context, evs []simEvent, gen uint64) {
	if rk.pub != nil && len(evs) > 0 {
		rk.pub.publish(ctx, evs, gen)
	}
}

// stepTime is the model time of one step under the time scale: a calibrated model
// (stepmodel.go, by Config.StepModel) or the flat one, uncached prefill tokens at the prefill rate plus one
// decode-token time when the batch decodes (all running sequences decode together).
func (rk *rank) stepTime(step []scheduled) time.Duration {
	if c, ok := stepModels[rk.cfg.StepModel]; ok {
		return rk.cfg.scaled(c.ms(shapeOf(step).scaled(rk.cfg.StepTokenScale)) / 1000)
	}
	prefill, decode := 0, false
	for _, s := range step {
		if s.decode {
			decode = true
		} else {
			prefill += s.tokens
		}
	}
	secs := float64(prefill) / rk.cfg.PrefillTokensPerS
	if decode {
		secs += rk.cfg.DecodeMsPerToken / 1000
	}
	return rk.cfg.scaled(secs)
}

// schedule is a simplified vLLM v1 Scheduler.schedule: running requests first (preempting from
// the tail when blocks run out), then waiting ones in order while seats and token budget last;
// a prefill longer than the budget is chunked over several steps.
func (rk *rank) schedule() []scheduled {
	bs := rk.cfg.BlockSize
	budget := rk.cfg.MaxBatchedTokens
	var step []scheduled
	preempted := false
	for i := 0; i < len(rk.running) && budget > 0; {
		r := rk.running[i]
		n := min(r.numTokens()-r.numComputed, budget)
		decode := n == 1 && len(r.output) > 0 && r.numComputed == r.numTokens()-1
		ok := true
		for !rk.allocate(r, n, nil) {
			victim := rk.running[len(rk.running)-1]
			rk.preempt(victim)
			preempted = true
			if victim == r {
				ok = false
				break
			}
		}
		if !ok {
			break
		}
		r.numComputed += n
		budget -= n
		step = append(step, scheduled{r: r, tokens: n, decode: decode})
		i++
	}
	if preempted || rk.paused != unpaused {
		return step
	}
	for len(rk.waiting) > 0 && len(rk.running) < rk.cfg.MaxNumSeqs && budget > 0 {
		r := rk.waiting[0]
		if r.remoteLoaded {
			if !rk.admitRemote(r) {
				break
			}
			budget--
			step = append(step, scheduled{r: r, tokens: 1})
			continue
		}
		// The last token is always recomputed, so at most numTokens-1 tokens hit, in whole blocks.
		hits := rk.pool.lookup(r.blockHashes, (r.numTokens()-1)/bs)
		base := len(hits) * bs
		n := min(r.numTokens()-base, budget)
		if !rk.pool.canAllocate(rk.blocksNeeded(r, base+n, len(hits)), hits) {
			break
		}
		if r.fullMode && len(hits) > 0 {
			rk.pool.reannounce(r, len(hits))
		}
		rk.allocate(r, n, hits)
		if !r.counted && r.preemptions == 0 {
			r.counted = true
			rk.stats.prefixQueries += uint64(r.numTokens())
			rk.stats.prefixHits += uint64(base)
			rk.stats.promptTokens += uint64(len(r.prompt))
		}
		if r.cachedTokens < 0 {
			r.cachedTokens = base
		}
		rk.waiting = rk.waiting[1:]
		r.state = stateRunning
		rk.running = append(rk.running, r)
		r.numComputed = base + n
		budget -= n
		step = append(step, scheduled{r: r, tokens: n})
	}
	return step
}

// admitRemote schedules a decode-side request whose prompt arrived from a producer, as vLLM's
// scheduler does once the transfer finished (_update_waiting_for_remote_kv): local prefix hits
// first, the transferred blocks cached (BlockStored) with the prompt computed but its last
// token, which this step recomputes; num_cached_tokens is that count. Local hits alone are
// the prefix-cache stats' hits.
func (rk *rank) admitRemote(r *engineRequest) bool {
	bs := rk.cfg.BlockSize
	hits := rk.pool.lookup(r.blockHashes, (r.numTokens()-1)/bs)
	need := rk.blocksNeeded(r, r.numTokens(), len(hits))
	if !rk.pool.canAllocate(need, hits) {
		return false
	}
	computed := r.numTokens() - 1
	rk.pool.touch(hits)
	r.blocks = append(append(r.blocks, hits...), rk.pool.allocate(need)...)
	r.numCachedBlocks = len(hits)
	received := min(computed/bs, len(r.blockHashes))
	if received > r.numCachedBlocks {
		rk.pool.cacheFull(r, r.numCachedBlocks, received)
		r.numCachedBlocks = received
	}
	if full := min(r.numTokens()/bs, len(r.blockHashes)); full > r.numCachedBlocks {
		rk.pool.cacheFull(r, r.numCachedBlocks, full) // allocate_slots for the recomputed token
		r.numCachedBlocks = full
	}
	if !r.counted {
		r.counted = true
		rk.stats.prefixQueries += uint64(r.numTokens())
		rk.stats.prefixHits += uint64(len(hits) * bs)
		rk.stats.promptTokens += uint64(len(r.prompt))
	}
	if r.cachedTokens < 0 {
		r.cachedTokens = computed
	}
	r.remoteLoaded = false // a preempted request recomputes like any other
	rk.waiting = rk.waiting[1:]
	r.state = stateRunning
	rk.running = append(rk.running, r)
	r.numComputed = r.numTokens()
	return true
}

// blocksNeeded is how many new blocks a request needs to hold total tokens.
func (rk *rank) blocksNeeded(r *engineRequest, total, hits int) int {
	bs := rk.cfg.BlockSize
	return max(0, (total+bs-1)/bs-len(r.blocks)-hits)
}

// allocate is vLLM's allocate_slots: take the hit blocks, add new blocks for n more tokens, and
// register every block that becomes full under its hash (BlockStored).
func (rk *rank) allocate(r *engineRequest, n int, hits []*kvBlock) bool {
	base := r.numComputed + len(hits)*rk.cfg.BlockSize
	need := rk.blocksNeeded(r, base+n, len(hits))
	if !rk.pool.canAllocate(need, hits) {
		return false
	}
	if len(hits) > 0 {
		rk.pool.touch(hits)
		r.blocks = append(r.blocks, hits...)
		r.numCachedBlocks = len(r.blocks)
	}
	r.blocks = append(r.blocks, rk.pool.allocate(need)...)
	full := min(min(base+n, r.numTokens())/rk.cfg.BlockSize, len(r.blockHashes))
	if full > r.numCachedBlocks {
		rk.pool.cacheFull(r, r.numCachedBlocks, full)
		r.numCachedBlocks = full
	}
	return true
}

// freeBlocks returns a request's blocks, last block first (vLLM's order: tails evict first).
func (rk *rank) freeBlocks(r *engineRequest) {
	slices.Reverse(r.blocks)
	rk.pool.release(r.blocks)
	r.blocks = nil
	r.numCachedBlocks = 0
}

// preempt sends a running request back to the head of the waiting queue; its KV is recomputed
// (with whatever prefix hits remain) when it is scheduled again.
func (rk *rank) preempt(r *engineRequest) {
	rk.freeBlocks(r)
	r.numComputed = 0
	r.preemptions++
	rk.stats.preemptions++
	rk.running = slices.DeleteFunc(rk.running, func(x *engineRequest) bool { return x == r })
	r.state = stateWaiting
	rk.waiting = append([]*engineRequest{r}, rk.waiting...)
}

// update applies one step's outputs: a request whose known tokens are all computed samples its
// next token; one that reached max_tokens finishes and frees its blocks (they stay cached).
func (rk *rank) update(step []scheduled) {
	now := time.Now()
	for _, s := range step {
		r := s.r
		if r.state != stateRunning || r.aborted || r.numComputed < r.numTokens() {
			continue
		}
		tok := outputToken(r.seed, len(r.output))
		r.output = append(r.output, tok)
		rk.stats.genTokens++
		if err := r.extendHashes(rk.hasher, rk.cfg.BlockSize); err != nil {
			rk.finish(r, err)
			continue
		}
		if len(r.output) == 1 && rk.obs != nil {
			rk.obs.ttft.Observe(now.Sub(r.arrival).Seconds())
		}
		if len(r.output) >= r.maxTokens {
			// The last token and the end go to the HTTP side in one hand-off: vLLM's scheduler
			// checks the stop condition on the token it just sampled and reports both in one
			// EngineCoreOutput (vllm/v1/core/sched/scheduler.py, update_from_output), so the
			// stream's last token chunk carries finish_reason. Handed over apart, a reader woken
			// in between sent the token and then an empty chunk with the finish_reason, and two
			// identical requests could stream differently.
			rk.retire(r, nil)
			r.deliverLast(tok, r.cachedTokens)
			continue
		}
		r.deliver(tok, r.cachedTokens)
	}
}

// finish ends a request (err nil: it reached max_tokens) and tells the HTTP side.
func (rk *rank) finish(r *engineRequest, err error) {
	rk.retire(r, err)
	r.end(err)
}

// retire takes a request out of the schedule and frees its blocks (they stay cached).
func (rk *rank) retire(r *engineRequest, err error) {
	rk.running = slices.DeleteFunc(rk.running, func(x *engineRequest) bool { return x == r })
	rk.waiting = slices.DeleteFunc(rk.waiting, func(x *engineRequest) bool { return x == r })
	if r.remoteDecode && err == nil && len(r.blocks) > 0 {
		// The NIXL scheduler's request_finished: a length-capped prefill for a remote decoder
		// keeps its blocks until the decoder has read them (or the abort timeout).
		rk.hold(r)
	} else {
		rk.freeBlocks(r)
	}
	r.state = stateDone
	if err == nil {
		rk.stats.finished++
	}
}

func (rk *rank) applyAborts() {
	for _, r := range rk.aborts {
		if r.state != stateDone {
			rk.finish(r, context.Canceled)
		}
	}
	rk.aborts = nil
}

// resetPrefixCache is vLLM's reset_prefix_cache: it succeeds only when no block is in use,
// and then announces AllBlocksCleared.
func (rk *rank) resetPrefixCache(ctx context.Context) bool {
	rk.mu.Lock()
	ok := rk.pool.reset(true)
	evs, gen := rk.pool.takeEvents(), rk.gen
	rk.mu.Unlock()
	// Published at once as its own batch: the router must not wait for the next step.
	rk.publish(ctx, evs, gen)
	return ok
}

// restart behaves like a killed and restarted engine process: every request fails, the cache is
// empty (with no event), the event sequence starts again at 0 with an empty replay ring, and the
// counters start from zero.
func (rk *rank) restart() {
	rk.mu.Lock()
	for _, r := range append(slices.Clone(rk.running), rk.waiting...) {
		rk.finish(r, errRestarted)
	}
	rk.aborts = nil
	rk.dropHeld()
	rk.pool = newBlockPool(rk.cfg.NumGPUBlocks, rk.cfg.BlockSize)
	rk.stats = rankStats{}
	if rk.obs != nil {
		rk.obs.reset()
	}
	rk.setGauges()
	if rk.pub != nil {
		rk.gen++
		rk.pub.restart(rk.gen)
	}
	rk.mu.Unlock()
}

// setGauges refreshes the gauges from the scheduler state (caller holds mu).
func (rk *rank) setGauges() {
	if rk.obs == nil {
		return
	}
	rk.obs.set(len(rk.running), len(rk.waiting), rk.pool.usage(), rk.stats)
}
