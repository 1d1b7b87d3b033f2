package vllmsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// genJob is one validated generation request: its prompts and how to run them.
type genJob struct {
	chat         bool
	id           string
	model        string
	prompts      [][]uint32
	maxTokens    int
	n            int
	stream       bool
	includeUsage bool
	ident        simIdentity
	loraID       *int
	fullMode     bool
	seed         uint64
	// dialect is the answer's API (dialectResponses, dialectMessages; "" for OpenAI's).
	dialect string
	// msgs and store: a Responses request's conversation and whether its answer is stored.
	msgs  []chatMessage
	store bool
	xfer  *kvTransferParams // nil without a connector
}

// newJob validates a generation request in vLLM's order: the model (OpenAIServing._check_model),
// the context length while rendering the prompt (OpenAIServing._validate_input), then the
// sampling parameters (SamplingParams._verify_args in vllm/sampling_params.py).
func (s *Sim) newJob(chat bool, p commonParams, maxTokens *int, prompts [][]uint32) (*genJob, error) {
	j := &genJob{chat: chat, model: p.Model, prompts: prompts, n: 1, stream: p.Stream}
	if err := s.checkModel(p.Model, j); err != nil {
		return nil, err
	}
	if p.N != nil {
		j.n = *p.N
	}
	j.maxTokens = 16 // vLLM's CompletionRequest default
	if chat {
		j.maxTokens = s.cfg.DefaultMaxTokens
	}
	if maxTokens != nil {
		j.maxTokens = *maxTokens
	}
	capacity := (s.cfg.NumGPUBlocks - 1) * s.cfg.BlockSize
	for _, pr := range prompts {
		if len(pr) == 0 {
			return nil, badRequest("prompt cannot be empty")
		}
		// vllm/entrypoints/openai/engine/serving.py _validate_input: a prompt may use at most
		// max_model_len - 1 tokens; then prompt + max_tokens must fit. Both are
		// VLLMValidationError, so 400 BadRequestError with param input_tokens / max_tokens.
		if len(pr) >= s.cfg.MaxModelLen {
			return nil, invalidParam("input_tokens", len(pr), "This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.",
				s.cfg.MaxModelLen, len(pr))
		}
		if chat && maxTokens == nil && len(pr)+j.maxTokens > s.cfg.MaxModelLen {
			// a chat request without max_tokens gets what is left of the context (vLLM's
			// get_max_tokens), not an error
			j.maxTokens = s.cfg.MaxModelLen - len(pr)
		}
		if len(pr)+j.maxTokens > s.cfg.MaxModelLen {
			return nil, invalidParam("max_tokens", j.maxTokens, "'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
				j.maxTokens, s.cfg.MaxModelLen, len(pr), j.maxTokens, s.cfg.MaxModelLen, len(pr))
		}
	}
	if err := checkSampling(j.n, j.maxTokens, p); err != nil {
		return nil, err
	}
	for _, pr := range prompts {
		if len(pr)+j.maxTokens > capacity {
			return nil, badRequest("request needs %d tokens of KV cache but a rank holds only %d (num-gpu-blocks %d)",
				len(pr)+j.maxTokens, capacity, s.cfg.NumGPUBlocks)
		}
	}
	if p.StreamOptions != nil {
		if !p.Stream {
			return nil, badRequest("stream_options can only be set when stream is true")
		}
		j.includeUsage = p.StreamOptions.IncludeUsage
	}
	if p.CacheSalt != nil {
		if *p.CacheSalt == "" {
			return nil, badRequest("cache_salt must not be empty")
		}
		j.ident.CacheSalt = *p.CacheSalt
	}
	if s.cfg.kind() == KindTRTLLM && len(p.VLLMXArgs) > 0 {
		// trtllm-serve's request models forbid unknown fields (kinds.go).
		return nil, badRequest("vllm_xargs: Extra inputs are not permitted")
	}
	full, err := reportMode(p.VLLMXArgs)
	if err != nil {
		return nil, err
	}
	j.fullMode = full
	if p.Seed != nil {
		j.seed = uint64(*p.Seed)
	}
	if s.cfg.KVTransfer != nil {
		j.xfer = p.KVTransferParams
	}
	return j, nil
}

// checkSampling is SamplingParams._verify_args (vllm/sampling_params.py) for the fields the
// simulator reads: n is a plain ValueError (400, param null); temperature, top_p and max_tokens
// are VLLMValidationError (400, param named). Messages are vLLM's.
func checkSampling(n, maxTokens int, p commonParams) error {
	if n < 1 {
		return badRequest("n must be at least 1, got %d.", n)
	}
	if n > maxN {
		return badRequest("n must be at most %d, got %d. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable.", maxN, n)
	}
	if t := p.Temperature; t != nil {
		switch {
		case math.IsNaN(*t) || math.IsInf(*t, 0):
			return invalidParam("temperature", *t, "temperature must be a finite number, got %s.", pyRepr(*t))
		case *t < 0:
			return invalidParam("temperature", *t, "temperature must be non-negative, got %s.", pyRepr(*t))
		case *t > 2:
			return invalidParam("temperature", *t, "temperature must be in [0, 2], got %s.", pyRepr(*t))
		}
	}
	if tp := p.TopP; tp != nil && !(*tp > 0 && *tp <= 1) {
		return invalidParam("top_p", *tp, "top_p must be in (0, 1], got %s.", pyRepr(*tp))
	}
	if maxTokens < 1 {
		return invalidParam("max_tokens", maxTokens, "max_tokens must be at least 1, got %d.", maxTokens)
	}
	return nil
}

// maxN bounds n like vLLM's VLLM_MAX_N_SEQUENCES (the simulator keeps its historical 128).
const maxN = 128

// checkModel accepts the served model (or no model, like vLLM) or one of its LoRA adapters.
func (s *Sim) checkModel(model string, j *genJob) error {
	if model == "" || model == s.cfg.Model {
		j.model = s.cfg.Model
		return nil
	}
	if s.cfg.kind() == KindTRTLLM {
		// trtllm-serve serves one model and never checks the request's name against it: its
		// completion and chat handlers pass the request on and answer with request.model
		// (tensorrt_llm/serve/openai_server.py at 00057725d959, postprocess_handlers.py
		// CompletionPostprocArgs.from_request), so any name is that model.
		j.model = model
		return nil
	}
	if i := slices.Index(s.cfg.LoRAAdapters, model); i >= 0 {
		id := i + 1
		j.loraID = &id
		j.ident.LoRAName = model
		return nil
	}
	// OpenAIServing._check_model (vllm/entrypoints/openai/engine/serving.py): 404 NotFoundError,
	// param "model".
	return &apiError{http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model), "model"}
}

// requestID is unique across simulators, as vLLM's random_uuid ids are: two simulators
// started in the same second must not answer with the same response id, or a router that
// learns ids from answers would pin a follow-up to the wrong one.
func (s *Sim) requestID(prefix string) string {
	return fmt.Sprintf("%s-%016x%08x", prefix, s.nextID.Add(1)^uint64(s.created)<<20, rand.Uint32())
}

func (s *Sim) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	prompts, err := parsePrompts(req.Prompt)
	if err != nil {
		writeError(w, err)
		return
	}
	j, err := s.newJob(false, req.commonParams, req.MaxTokens, prompts)
	if err != nil {
		writeError(w, err)
		return
	}
	j.id = s.requestID("cmpl")
	s.run(w, r, j)
}

func (s *Sim) chatPrompt(req *chatRequest) ([]uint32, error) {
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	text, err := renderChat(req.Messages, addGen, req.ContinueFinalMessage)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return Tokenize(text), nil
}

// chatJob reads a chat request, renders its prompt and validates it as vLLM does before it
// answers: the same steps for /v1/chat/completions and its render endpoint. On an error it has
// already written the answer.
func (s *Sim) chatJob(w http.ResponseWriter, r *http.Request) (*chatRequest, []uint32, *genJob, bool) {
	var req chatRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return nil, nil, nil, false
	}
	prompt, err := s.chatPrompt(&req)
	if err != nil {
		writeError(w, err)
		return nil, nil, nil, false
	}
	maxTokens := req.MaxCompletionTokens
	if maxTokens == nil {
		maxTokens = req.MaxTokens
	}
	j, err := s.newJob(true, req.commonParams, maxTokens, [][]uint32{prompt})
	if err != nil {
		writeError(w, err)
		return nil, nil, nil, false
	}
	return &req, prompt, j, true
}

func (s *Sim) handleChat(w http.ResponseWriter, r *http.Request) {
	_, _, j, ok := s.chatJob(w, r)
	if !ok {
		return
	}
	j.id = s.requestID("chatcmpl")
	s.run(w, r, j)
}

// choiceSeed makes generated text depend only on the prompt, the choice and the request seed.
func choiceSeed(prompt []uint32, choice int, seed uint64) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, t := range prompt[max(0, len(prompt)-64):] {
		b[0], b[1], b[2], b[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
		h.Write(b[:])
	}
	return h.Sum64() ^ uint64(choice)*0x9e3779b97f4a7c15 ^ seed
}

// run submits a job's engine requests (every choice on one rank) and answers, streaming or not.
func (s *Sim) run(w http.ResponseWriter, r *http.Request, j *genJob) {
	if !(j.stream && !s.cfg.HoldHeaders) && s.shouldFail() {
		writeError(w, &apiError{http.StatusInternalServerError, "InternalServerError", "injected failure (--fail-rate)", ""})
		return
	}
	rk, err := s.pickRank(r)
	if err != nil {
		writeError(w, err)
		return
	}
	notify := make(chan struct{}, 1)
	var reqs []*engineRequest
	for pi, pr := range j.prompts {
		for c := range j.n {
			er := newEngineRequest(fmt.Sprintf("%s-%d-%d", j.id, pi, c), pr, j.maxTokens,
				choiceSeed(pr, c, j.seed), j.ident)
			er.loraID, er.fullMode, er.dnotify = j.loraID, j.fullMode, notify
			er.remoteDecode = j.xfer != nil && j.xfer.DoRemoteDecode
			if err := er.extendHashes(s.hasher, s.cfg.BlockSize); err != nil {
				writeError(w, badRequest("hashing the prompt: %v", err))
				return
			}
			reqs = append(reqs, er)
		}
	}
	w.Header().Set("x-vllm-sim-rank", strconv.Itoa(rk.idx))
	out := &output{sim: s, rk: rk, j: j, reqs: reqs, w: w, sent: make([]int, len(reqs)),
		finished: make([]bool, len(reqs))}
	if j.stream {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		if !s.cfg.HoldHeaders {
			// vLLM's StreamingResponse: the status goes out on acceptance; anything that goes
			// wrong later is an in-stream error event.
			out.flush()
			if s.shouldFail() {
				out.streamError(&apiError{http.StatusInternalServerError, "InternalServerError", "injected failure (--fail-rate)", ""})
				return
			}
		}
	}
	if j.xfer != nil && j.xfer.DoRemotePrefill && !j.xfer.DoRemoteDecode {
		loaded, err := s.remotePrefill(r.Context(), rk, j.xfer, reqs[0])
		if err != nil {
			if j.stream {
				out.streamError(err)
			} else {
				writeError(w, err)
			}
			return
		}
		for _, er := range reqs {
			er.remoteLoaded = loaded
		}
	}
	rk.submit(reqs...)
	// vLLM's with_sse_keep_alive (vllm/entrypoints/openai/sse_keep_alive.py, PR #51034) waits
	// `interval` for the next chunk and writes ": keep-alive\n\n" each time it waits in vain, so
	// a comment comes exactly one interval after the last bytes sent (or after acceptance).
	// The timer fires at the deadline it was set for; bytes written since only push the next
	// deadline back.
	interval := s.cfg.SSEKeepAliveInterval
	var keepAlive *time.Timer
	var keepAliveC <-chan time.Time
	if j.stream && interval > 0 {
		if out.lastWrite.IsZero() {
			out.lastWrite = time.Now() // headers held: the silence starts at submission
		}
		keepAlive = time.NewTimer(time.Until(out.lastWrite.Add(interval)))
		defer keepAlive.Stop()
		keepAliveC = keepAlive.C
	}
	for {
		select {
		case <-r.Context().Done():
			for _, er := range reqs {
				rk.abort(er)
			}
			return
		case <-keepAliveC:
			if time.Since(out.lastWrite) >= interval {
				out.comment("keep-alive")
			}
			keepAlive.Reset(time.Until(out.lastWrite.Add(interval)))
			continue
		case <-notify:
		}
		done, err := out.advance()
		if err != nil {
			if j.stream {
				for _, er := range reqs {
					rk.abort(er)
				}
				out.streamError(err)
			} else if j.dialect == dialectMessages {
				writeAnthropicError(w, err)
			} else {
				writeError(w, err)
			}
			return
		}
		if done {
			switch {
			case j.stream && j.dialect != dialectOpenAI:
				out.dialectEnd()
			case j.stream:
				if j.includeUsage {
					out.event(out.envelope(nil, out.usage()))
				}
				out.done()
			case j.dialect != dialectOpenAI:
				writeJSON(w, http.StatusOK, out.dialectFinal())
			default:
				writeJSON(w, http.StatusOK, out.final())
			}
			return
		}
	}
}

// output collects or streams the tokens of a job's engine requests.
type output struct {
	sim       *Sim
	rk        *rank
	j         *genJob
	reqs      []*engineRequest
	w         http.ResponseWriter
	sent      []int     // tokens already streamed per request
	finished  []bool    // finish_reason already streamed per request
	lastWrite time.Time // when bytes last went out (keep-alive timing)
	seq       int       // the Responses stream's sequence_number
}

// advance streams new tokens (when streaming) and reports whether every request ended.
func (o *output) advance() (bool, error) {
	if n := o.sim.cfg.StreamErrorAfter; n > 0 && o.j.stream {
		total := 0
		for i := range o.reqs {
			total += o.sent[i]
		}
		if total >= n {
			return false, &apiError{http.StatusInternalServerError, "InternalServerError",
				fmt.Sprintf("injected in-stream error after %d tokens (--stream-error-after)", total), ""}
		}
	}
	// budget is what --stream-error-after still lets out (-1: no limit); one wake-up may find
	// several new tokens, and the error must come after exactly n.
	budget := -1
	if n := o.sim.cfg.StreamErrorAfter; n > 0 && o.j.stream {
		budget = n
		for i := range o.reqs {
			budget -= o.sent[i]
		}
	}
	all := true
	for i, er := range o.reqs {
		toks, _, done, err := er.take(o.sent[i])
		if err != nil {
			return false, err
		}
		if budget >= 0 && len(toks) >= budget {
			toks, done = toks[:budget], false
		}
		if budget > 0 {
			budget -= len(toks)
		}
		if o.j.stream {
			if o.sent[i] == 0 && len(toks) > 0 && o.j.dialect != dialectOpenAI {
				o.dialectStart()
			} else if o.sent[i] == 0 && len(toks) > 0 && o.j.chat {
				o.event(o.envelope([]any{o.chatChoice(i, map[string]any{"role": "assistant", "content": ""}, nil)}, nil))
			}
			for k, t := range toks {
				text, _ := TokenString(t)
				o.chunk(i, text, done && k == len(toks)-1)
			}
			if done && len(toks) == 0 && !o.finished[i] {
				o.chunk(i, "", true) // the last token went out before the end was known
			}
			o.finished[i] = done
		}
		o.sent[i] += len(toks)
		all = all && done
	}
	if budget == 0 {
		return false, &apiError{http.StatusInternalServerError, "InternalServerError",
			fmt.Sprintf("injected in-stream error after %d tokens (--stream-error-after)", o.sim.cfg.StreamErrorAfter), ""}
	}
	return all, nil
}

// chunk streams one token's text for choice i; the last one carries finish_reason "length".
func (o *output) chunk(i int, text string, last bool) {
	if o.j.dialect != dialectOpenAI {
		if text != "" {
			o.dialectChunk(text)
		}
		return
	}
	var finish any
	if last {
		finish = "length"
	}
	if o.j.chat {
		o.event(o.envelope([]any{o.chatChoice(i, map[string]any{"content": text}, finish)}, nil))
		return
	}
	o.event(o.envelope([]any{map[string]any{"index": i, "text": text, "logprobs": nil,
		"finish_reason": finish, "stop_reason": nil}}, nil))
}

func (o *output) chatChoice(i int, delta map[string]any, finish any) map[string]any {
	return map[string]any{"index": i, "delta": delta, "logprobs": nil, "finish_reason": finish}
}

func (o *output) envelope(choices []any, usage any) map[string]any {
	obj := "text_completion"
	if o.j.chat {
		obj = "chat.completion.chunk"
	}
	if choices == nil {
		choices = []any{}
	}
	return map[string]any{"id": o.j.id, "object": obj, "created": time.Now().Unix(), "model": o.j.model,
		"choices": choices, "usage": usage}
}

func (o *output) event(v any) {
	b, _ := json.Marshal(v)
	_, _ = o.w.Write(append(append([]byte("data: "), b...), '\n', '\n'))
	o.flush()
}

func (o *output) done() {
	_, _ = o.w.Write([]byte("data: [DONE]\n\n"))
	o.flush()
}

// comment writes an SSE comment line (ignored by SSE readers).
func (o *output) comment(text string) {
	_, _ = o.w.Write([]byte(": " + text + "\n\n"))
	o.flush()
}

func (o *output) flush() {
	o.lastWrite = time.Now()
	if f, ok := o.w.(http.Flusher); ok {
		f.Flush()
	}
}

// streamError ends a stream the way vLLM's stream generators do when something fails after the
// headers: one `data: {"error": {...}}` event (ErrorResponse: message, type, param, code = the
// HTTP status it would have had), then `data: [DONE]`, under the 200 already sent.
func (o *output) streamError(err error) {
	if o.j.dialect != dialectOpenAI {
		o.dialectError(err)
		return
	}
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{http.StatusInternalServerError, "InternalServerError", err.Error(), ""}
	}
	o.event(ae.body())
	o.done()
}

// usage counts each prompt once (not per choice); cached tokens come from each prompt's first
// choice, as vLLM reports num_cached_tokens of the request output.
func (o *output) usage() map[string]any {
	prompt, completion, cached := 0, 0, 0
	for i, er := range o.reqs {
		toks, c, _, _ := er.take(0)
		completion += len(toks)
		if i%o.j.n == 0 {
			prompt += len(er.prompt)
			cached += c
		}
	}
	u := map[string]any{"prompt_tokens": prompt, "completion_tokens": completion,
		"total_tokens": prompt + completion, "prompt_tokens_details": map[string]any{"cached_tokens": cached}}
	if o.sim.cfg.OmitPromptTokensDetails {
		delete(u, "prompt_tokens_details") // vLLM leaves it unset: absent from stream chunks, null in a whole body
	}
	return u
}

func (o *output) final() map[string]any {
	choices := make([]any, len(o.reqs))
	for i, er := range o.reqs {
		toks, _, _, _ := er.take(0)
		text, _ := Detokenize(toks)
		if o.j.chat {
			choices[i] = map[string]any{"index": i, "message": map[string]any{"role": "assistant",
				"content": text, "reasoning_content": nil, "tool_calls": []any{}},
				"logprobs": nil, "finish_reason": "length", "stop_reason": nil}
		} else {
			choices[i] = map[string]any{"index": i, "text": text, "logprobs": nil,
				"finish_reason": "length", "stop_reason": nil, "prompt_logprobs": nil}
		}
	}
	obj := "text_completion"
	if o.j.chat {
		obj = "chat.completion"
	}
	var xfer any
	if ids := o.reqs[0].xferBlockIDs; ids != nil {
		xfer = o.rk.transferParams(o.sim.engineID, o.reqs[0])
	}
	return map[string]any{"id": o.j.id, "object": obj, "created": time.Now().Unix(), "model": o.j.model,
		"choices": choices, "usage": o.usage(), "system_fingerprint": nil, "kv_transfer_params": xfer}
}
