package fleet

import "strconv"

// The "step" engine: each replica runs vLLM v1's continuous batching in virtual time, as
// vllm-sim's rank does in wall time (sim/vllmsim/rank.go, schedule and update, after
// vllm/v1/core/sched/scheduler.py). One scheduler step is one forward pass holding every
// running request's next tokens (a decode token, or the next chunk of a prompt) and then new
// requests from the waiting queue, under a token budget (max_num_batched_tokens) and a
// sequence limit (max_num_seqs). A step's time is vllm-sim's flat model (rank.stepTime): its
// prefill tokens at the prefill rate plus one decode-token time when it decodes, so decodes
// slow down while prompts are prefilled beside them, and a request's first token comes at the
// end of the step that computes its last prompt token.
//
// Why not vllm-sim's own scheduler: its rank steps real engine requests (token ids, SHA-256
// block hashes at 16-token blocks, a block pool that publishes KV events) on a goroutine that
// sleeps each step's duration; the fleet model's requests are trace rows of 512-token block
// ids, at thousands of replicas. Sharing it would mean making rank's scheduling generic over
// the request and the pool; this file instead follows the same rules, and
// TestStepEngineMatchesFleetModel (sim/vllmsim) steps vllm-sim's scheduler by hand on the same
// requests and checks every TTFT and the prefix hits against this file.
//
// What it leaves out of vLLM: preemption (a request is admitted only when its whole prompt's
// blocks fit next to the running requests', the serial engine's rule, so nothing is preempted)
// and output blocks (a request's KV is its prompt's blocks).

// stepReq is one request inside a replica's scheduler.
type stepReq struct {
	i        int // trace index
	prompt   int // prompt tokens
	computed int // prompt tokens computed or scheduled (vLLM's num_computed_tokens, prompt part)
	pinned   int // leading blocks of the prompt held (pinned) in the replica's cache
	outputs  int // tokens sampled
	tokens   int // tokens scheduled in the current step
}

// stepArrive queues request i at replica r and starts a step if the replica is idle.
func (s *sim) stepArrive(i, r int, now float64) {
	q := &s.tr.Requests[i]
	rep := s.reps[r]
	rep.waiting = append(rep.waiting, &stepReq{i: i, prompt: q.InputLength})
	if !rep.busy && !rep.kicked {
		// The step starts once every request arriving at this instant is queued: vLLM's engine
		// core, woken by a request, drains its whole input queue before it schedules
		// (EngineCore._process_input_queue), and a trace's millisecond timestamps make
		// simultaneous arrivals common (a burst of siblings).
		rep.kicked = true
		s.kicks = append(s.kicks, r)
		s.kickAt = now
	}
}

// flushKicks starts the steps of replicas woken by arrivals before time t.
func (s *sim) flushKicks(t float64) {
	if len(s.kicks) == 0 || t <= s.kickAt {
		return
	}
	for _, r := range s.kicks {
		s.reps[r].kicked = false
		if !s.reps[r].busy {
			s.stepStart(r, s.kickAt)
		}
	}
	s.kicks = s.kicks[:0]
}

// stepStart schedules one step on replica r at time now (rank.schedule): running requests
// first, in order, each its next chunk or decode token while the budget lasts; then waiting
// requests in order while a sequence slot, budget and KV room are free.
func (s *sim) stepStart(r int, now float64) {
	rep := s.reps[r]
	budget := s.cfg.MaxBatchedTokens
	rep.step = rep.step[:0]
	prefill, decodes := 0, 0
	for _, sr := range rep.seqs {
		if budget <= 0 {
			break
		}
		n := 1 // a decode
		if sr.computed < sr.prompt {
			n = min(sr.prompt-sr.computed, budget)
			s.stepPrefill(rep, sr, n)
			prefill += n
		} else {
			decodes++
		}
		sr.tokens = n
		budget -= n
		rep.step = append(rep.step, sr)
	}
	for len(rep.waiting) > 0 && len(rep.seqs) < s.cfg.MaxNumSeqs && budget > 0 {
		sr := rep.waiting[0]
		q := &s.tr.Requests[sr.i]
		// KV room for the whole prompt beside what the running requests still need; a request
		// always starts on an idle replica, however large.
		if len(rep.seqs) > 0 && rep.cache.pinned+rep.reserved+rep.cache.unpinnedNeeded(q.HashIDs) > s.perRep {
			break
		}
		rep.waiting = rep.waiting[1:]
		rep.seqs = append(rep.seqs, sr)
		hits := rep.cache.prefix(q.HashIDs)
		for _, h := range q.HashIDs[:hits] {
			rep.cache.pin(h)
		}
		sr.pinned = hits
		rep.reserved += len(q.HashIDs) - hits
		// The last prompt token is always computed, even on a full hit.
		sr.computed = min(sr.prompt-uncachedTokens(q, hits), sr.prompt-1)
		s.admitted(sr.i, r, hits)
		n := min(sr.prompt-sr.computed, budget)
		s.stepPrefill(rep, sr, n)
		prefill += n
		sr.tokens = n
		budget -= n
		rep.step = append(rep.step, sr)
	}
	if len(rep.step) == 0 {
		rep.busy = false
		return
	}
	dur := float64(prefill) / s.cfg.PrefillTokensPerS
	if decodes > 0 {
		dur += s.cfg.DecodeMsPerToken / 1000
	}
	rep.busy = true
	s.push(event{t: now + dur, kind: evStepDone, rep: r})
}

// stepPrefill schedules n more prompt tokens of sr; the blocks they fill are cached from now on
// (vLLM's allocate_slots registers a block's hash when the step that fills it is scheduled, so a
// request scheduled later in the same step already hits it). The last block, partial or not,
// counts once the whole prompt is scheduled.
func (s *sim) stepPrefill(rep *replica, sr *stepReq, n int) {
	q := &s.tr.Requests[sr.i]
	sr.computed += n
	full := sr.computed / TraceBlockTokens
	if sr.computed >= sr.prompt {
		full = len(q.HashIDs)
	}
	for ; sr.pinned < min(full, len(q.HashIDs)); sr.pinned++ {
		rep.cache.pin(q.HashIDs[sr.pinned])
		rep.reserved--
	}
}

// stepDone ends replica r's step at time now (rank.update): every request whose prompt is all
// computed samples a token; the first moves its load from prefill to decode in the ledger, the
// last (its output length reached) ends it and frees its blocks. Then the next step starts.
func (s *sim) stepDone(r int, now float64) {
	rep := s.reps[r]
	for _, sr := range rep.step {
		if sr.computed < sr.prompt {
			continue // a chunk of a longer prompt: no token yet
		}
		sr.outputs++
		if sr.outputs == 1 {
			s.ttft[sr.i] = now - s.arrival[sr.i]
			if err := s.ledger.FirstToken(s.ids[sr.i]); err != nil {
				panic("fleet: request " + strconv.Itoa(sr.i) + ": " + err.Error())
			}
		}
		if sr.outputs >= max(s.tr.Requests[sr.i].OutputLength, 1) {
			s.finished(r, sr.i)
			for k, x := range rep.seqs {
				if x == sr {
					rep.seqs = append(rep.seqs[:k], rep.seqs[k+1:]...)
					break
				}
			}
		}
	}
	s.stepStart(r, now)
}
