package vllmsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
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
}

func (s *Sim) newJob(chat bool, p commonParams, maxTokens *int, prompts [][]uint32) (*genJob, error) {
	j := &genJob{chat: chat, model: p.Model, prompts: prompts, n: 1, stream: p.Stream}
	if err := s.checkModel(p.Model, j); err != nil {
		return nil, err
	}
	if p.N != nil {
		j.n = *p.N
	}
	if j.n < 1 || j.n > 128 {
		return nil, badRequest("n must be between 1 and 128, got %d", j.n)
	}
	j.maxTokens = 16 // vLLM's CompletionRequest default
	if chat {
		j.maxTokens = s.cfg.DefaultMaxTokens
	}
	if maxTokens != nil {
		j.maxTokens = *maxTokens
	}
	if j.maxTokens < 1 {
		return nil, badRequest("max_tokens must be at least 1, got %d", j.maxTokens)
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
	full, err := reportMode(p.VLLMXArgs)
	if err != nil {
		return nil, err
	}
	j.fullMode = full
	if p.Seed != nil {
		j.seed = uint64(*p.Seed)
	}
	capacity := (s.cfg.NumGPUBlocks - 1) * s.cfg.BlockSize
	for _, pr := range prompts {
		if len(pr) == 0 {
			return nil, badRequest("prompt cannot be empty")
		}
		if len(pr)+j.maxTokens > s.cfg.MaxModelLen {
			return nil, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
				s.cfg.MaxModelLen, len(pr)+j.maxTokens, len(pr), j.maxTokens)
		}
		if len(pr)+j.maxTokens > capacity {
			return nil, badRequest("request needs %d tokens of KV cache but a rank holds only %d (num-gpu-blocks %d)",
				len(pr)+j.maxTokens, capacity, s.cfg.NumGPUBlocks)
		}
	}
	return j, nil
}

// checkModel accepts the served model (or no model, like vLLM) or one of its LoRA adapters.
func (s *Sim) checkModel(model string, j *genJob) error {
	if model == "" || model == s.cfg.Model {
		j.model = s.cfg.Model
		return nil
	}
	if i := slices.Index(s.cfg.LoRAAdapters, model); i >= 0 {
		id := i + 1
		j.loraID = &id
		j.ident.LoRAName = model
		return nil
	}
	return &apiError{http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model)}
}

func (s *Sim) requestID(prefix string) string {
	return fmt.Sprintf("%s-%016x", prefix, s.nextID.Add(1)^uint64(s.created)<<20)
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

func (s *Sim) handleChat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	prompt, err := s.chatPrompt(&req)
	if err != nil {
		writeError(w, err)
		return
	}
	maxTokens := req.MaxCompletionTokens
	if maxTokens == nil {
		maxTokens = req.MaxTokens
	}
	j, err := s.newJob(true, req.commonParams, maxTokens, [][]uint32{prompt})
	if err != nil {
		writeError(w, err)
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
		writeError(w, &apiError{http.StatusInternalServerError, "InternalServerError", "injected failure (--fail-rate)"})
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
			if err := er.extendHashes(s.hasher, s.cfg.BlockSize); err != nil {
				writeError(w, badRequest("hashing the prompt: %v", err))
				return
			}
			reqs = append(reqs, er)
		}
	}
	w.Header().Set("x-vllm-sim-rank", strconv.Itoa(rk.idx))
	out := &output{sim: s, j: j, reqs: reqs, w: w, sent: make([]int, len(reqs)),
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
				out.streamError(&apiError{http.StatusInternalServerError, "InternalServerError", "injected failure (--fail-rate)"})
				return
			}
		}
	}
	rk.submit(reqs...)
	var keepAlive <-chan time.Time
	if j.stream && s.cfg.SSEKeepAliveInterval > 0 {
		t := time.NewTicker(s.cfg.SSEKeepAliveInterval)
		defer t.Stop()
		keepAlive = t.C
	}
	for {
		select {
		case <-r.Context().Done():
			for _, er := range reqs {
				rk.abort(er)
			}
			return
		case <-keepAlive:
			if !out.wrote {
				out.comment("keep-alive")
			}
			out.wrote = false
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
			} else {
				writeError(w, err)
			}
			return
		}
		if done {
			if j.stream {
				if j.includeUsage {
					out.event(out.envelope(nil, out.usage()))
				}
				out.done()
			} else {
				writeJSON(w, http.StatusOK, out.final())
			}
			return
		}
	}
}

// output collects or streams the tokens of a job's engine requests.
type output struct {
	sim      *Sim
	j        *genJob
	reqs     []*engineRequest
	w        http.ResponseWriter
	sent     []int  // tokens already streamed per request
	finished []bool // finish_reason already streamed per request
	wrote    bool   // something was written since the last keep-alive tick
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
				fmt.Sprintf("injected in-stream error after %d tokens (--stream-error-after)", total)}
		}
	}
	all := true
	for i, er := range o.reqs {
		toks, _, done, err := er.take(o.sent[i])
		if err != nil {
			return false, err
		}
		if o.j.stream {
			if o.sent[i] == 0 && len(toks) > 0 && o.j.chat {
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
	return all, nil
}

// chunk streams one token's text for choice i; the last one carries finish_reason "length".
func (o *output) chunk(i int, text string, last bool) {
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
	o.wrote = true
	if f, ok := o.w.(http.Flusher); ok {
		f.Flush()
	}
}

// streamError ends a stream the way vLLM's stream generators do when something fails after the
// headers: one `data: {"error": {...}}` event (ErrorResponse: message, type, param, code = the
// HTTP status it would have had), then `data: [DONE]`, under the 200 already sent.
func (o *output) streamError(err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{http.StatusInternalServerError, "InternalServerError", err.Error()}
	}
	o.event(map[string]any{"error": map[string]any{"message": ae.msg, "type": ae.typ, "param": nil, "code": ae.status}})
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
	return map[string]any{"prompt_tokens": prompt, "completion_tokens": completion,
		"total_tokens": prompt + completion, "prompt_tokens_details": map[string]any{"cached_tokens": cached}}
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
	return map[string]any{"id": o.j.id, "object": obj, "created": time.Now().Unix(), "model": o.j.model,
		"choices": choices, "usage": o.usage(), "system_fingerprint": nil, "kv_transfer_params": nil}
}
