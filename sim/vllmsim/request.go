package vllmsim

import (
	"sync"
	"time"
)

type reqState int

const (
	stateWaiting reqState = iota
	stateRunning
	stateDone
)

// engineRequest is one sequence inside a rank's scheduler (a choice of an HTTP request). The
// scheduling fields are guarded by the rank's lock; the delivery fields by their own.
type engineRequest struct {
	id        string
	prompt    []uint32
	output    []uint32
	maxTokens int
	seed      uint64 // drives the generated tokens
	identity  simIdentity
	loraID    *int
	loraName  *string
	fullMode  bool // vllm_xargs kv_cache_report_mode "full"
	// remoteDecode: a prefill-role request whose blocks are held for a decoder when it ends;
	// remoteLoaded: a decode-role request whose prompt arrived computed from a producer.
	remoteDecode bool
	remoteLoaded bool
	xferBlockIDs []int // the held block ids (set before the last token is delivered)

	state           reqState
	numComputed     int
	blocks          []*kvBlock
	numCachedBlocks int
	blockHashes     [][]byte // full digests of every full block of prompt+output
	preemptions     int
	counted         bool // prefix-cache query recorded
	cachedTokens    int  // set when first scheduled
	arrival         time.Time
	aborted         bool

	dmu     sync.Mutex
	dtokens []uint32
	dcached int
	ddone   bool
	derr    error
	dnotify chan struct{}
}

func newEngineRequest(id string, prompt []uint32, maxTokens int, seed uint64, ident simIdentity) *engineRequest {
	r := &engineRequest{id: id, prompt: prompt, maxTokens: maxTokens, seed: seed, identity: ident,
		cachedTokens: -1, dnotify: make(chan struct{}, 1)}
	if ident.LoRAName != "" {
		name := ident.LoRAName
		r.loraName = &name
	}
	return r
}

func (r *engineRequest) numTokens() int { return len(r.prompt) + len(r.output) }

// tokenRange returns all_token_ids[from:to] (prompt then output).
func (r *engineRequest) tokenRange(from, to int) []uint32 {
	if to <= len(r.prompt) {
		return r.prompt[from:to]
	}
	out := make([]uint32, 0, to-from)
	if from < len(r.prompt) {
		out = append(out, r.prompt[from:]...)
		from = len(r.prompt)
	}
	return append(out, r.output[from-len(r.prompt):to-len(r.prompt)]...)
}

// extraKeys is block i's extra_keys tuple (LoRA name, cache salt on block 0).
func (r *engineRequest) extraKeys(i int, _ int) []string {
	return r.identity.blockExtras(i)
}

// extendHashes hashes every full block not yet hashed (prompt and generated tokens alike).
func (r *engineRequest) extendHashes(h *blockHasher, blockSize int) error {
	for (len(r.blockHashes)+1)*blockSize <= r.numTokens() {
		i := len(r.blockHashes)
		var parent []byte
		if i > 0 {
			parent = r.blockHashes[i-1]
		}
		d, err := h.block(parent, r.tokenRange(i*blockSize, (i+1)*blockSize), r.extraKeys(i, blockSize))
		if err != nil {
			return err
		}
		r.blockHashes = append(r.blockHashes, d)
	}
	return nil
}

// deliver hands one generated token to the HTTP side without ever blocking the scheduler.
func (r *engineRequest) deliver(tok uint32, cached int) {
	r.dmu.Lock()
	r.dtokens = append(r.dtokens, tok)
	r.dcached = cached
	r.dmu.Unlock()
	r.notify()
}

// deliverLast hands over the last token and the request's end together (see rank.update).
func (r *engineRequest) deliverLast(tok uint32, cached int) {
	r.dmu.Lock()
	r.dtokens = append(r.dtokens, tok)
	r.dcached = cached
	r.ddone = true
	r.dmu.Unlock()
	r.notify()
}

// end marks the request finished (err nil) or failed.
func (r *engineRequest) end(err error) {
	r.dmu.Lock()
	if !r.ddone {
		r.ddone, r.derr = true, err
	}
	r.dmu.Unlock()
	r.notify()
}

func (r *engineRequest) notify() {
	select {
	case r.dnotify <- struct{}{}:
	default:
	}
}

// take returns the tokens delivered after the first `from`, whether the request ended and how.
func (r *engineRequest) take(from int) (toks []uint32, cached int, done bool, err error) {
	r.dmu.Lock()
	defer r.dmu.Unlock()
	return r.dtokens[from:], r.dcached, r.ddone, r.derr
}
