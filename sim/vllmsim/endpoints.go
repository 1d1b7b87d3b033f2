package vllmsim

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
)

// handleCompletionsRender answers vLLM's /v1/completions/render: one GenerateRequest per prompt.
func (s *Sim) handleCompletionsRender(w http.ResponseWriter, r *http.Request) {
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
	id := s.requestID("cmpl")
	out := make([]any, len(prompts))
	for i, p := range prompts {
		out[i] = s.generateRequest(id+"-"+strconv.Itoa(i), p, j, req.commonParams)
	}
	writeJSON(w, http.StatusOK, out)
}

// handleChatRender answers vLLM's /v1/chat/completions/render: one GenerateRequest.
func (s *Sim) handleChatRender(w http.ResponseWriter, r *http.Request) {
	req, prompt, j, ok := s.chatJob(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, s.generateRequest(s.requestID("chatcmpl"), prompt, j, req.commonParams))
}

// generateRequest is vLLM's GenerateRequest JSON (spec §6.2); features is null (text only).
func (s *Sim) generateRequest(id string, tokens []uint32, j *genJob, p commonParams) map[string]any {
	var salt any
	if p.CacheSalt != nil {
		salt = *p.CacheSalt
	}
	var xargs any
	if len(p.VLLMXArgs) > 0 {
		xargs = p.VLLMXArgs
	}
	return map[string]any{
		"request_id": id, "token_ids": tokens, "assistant_tokens_mask": nil, "token_offsets": nil,
		"features": nil,
		"sampling_params": map[string]any{"n": j.n, "max_tokens": j.maxTokens, "seed": p.Seed,
			"extra_args": xargs},
		"model": j.model, "stream": p.Stream, "stream_options": p.StreamOptions, "cache_salt": salt,
		"priority": p.Priority, "kv_transfer_params": nil, "ec_transfer_params": nil,
	}
}

// tokenizeRequest is either vLLM form: completion (prompt) or chat (messages).
type tokenizeRequest struct {
	Model                string        `json:"model"`
	Prompt               *string       `json:"prompt"`
	Messages             []chatMessage `json:"messages"`
	AddGenerationPrompt  *bool         `json:"add_generation_prompt"`
	ContinueFinalMessage bool          `json:"continue_final_message"`
	AddSpecialTokens     *bool         `json:"add_special_tokens"` // no effect: no BOS is added
	ReturnTokenStrs      bool          `json:"return_token_strs"`
}

func (s *Sim) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := s.checkModel(req.Model, &genJob{}); err != nil {
		writeError(w, err)
		return
	}
	var toks []uint32
	switch {
	case req.Prompt != nil && req.Messages == nil:
		toks = Tokenize(*req.Prompt)
	case req.Messages != nil && req.Prompt == nil:
		addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
		text, err := renderChat(req.Messages, addGen, req.ContinueFinalMessage)
		if err != nil {
			writeError(w, badRequest("%v", err))
			return
		}
		toks = Tokenize(text)
	default:
		writeError(w, badRequest("give exactly one of prompt or messages"))
		return
	}
	var strs any
	if req.ReturnTokenStrs {
		ss := make([]string, len(toks))
		for i, t := range toks {
			ss[i], _ = TokenString(t)
		}
		strs = ss
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(toks), "max_model_len": s.cfg.MaxModelLen,
		"tokens": toks, "token_strs": strs})
}

func (s *Sim) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string  `json:"model"`
		Tokens []int64 `json:"tokens"`
	}
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := s.checkModel(req.Model, &genJob{}); err != nil {
		writeError(w, err)
		return
	}
	ids, err := toTokenIDs(req.Tokens)
	if err != nil {
		writeError(w, err)
		return
	}
	text, _ := Detokenize(ids)
	writeJSON(w, http.StatusOK, map[string]any{"prompt": text})
}

func (s *Sim) handleModels(w http.ResponseWriter, _ *http.Request) {
	model := func(id string, parent any) map[string]any {
		return map[string]any{"id": id, "object": "model", "created": s.created, "owned_by": "vllm",
			"root": s.cfg.Model, "parent": parent, "max_model_len": s.cfg.MaxModelLen,
			"permission": []any{}}
	}
	data := []any{model(s.cfg.Model, nil)}
	for _, l := range s.cfg.LoRAAdapters {
		data = append(data, model(l, s.cfg.Model))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// CacheState is GET /debug/cache: each rank's cached blocks as wire ints, sorted.
type CacheState struct {
	BlockSize int         `json:"block_size"`
	HashAlgo  string      `json:"hash_algo"`
	Ranks     []RankCache `json:"ranks"`
}

// RankCache is one rank's part of CacheState.
type RankCache struct {
	Rank           int      `json:"rank"`
	CapacityBlocks int      `json:"capacity_blocks"`
	FreeBlocks     int      `json:"free_blocks"`
	Running        int      `json:"running"`
	Waiting        int      `json:"waiting"`
	Hashes         []uint64 `json:"hashes"`
}

// CacheState snapshots every rank's cache (what GET /debug/cache returns).
func (s *Sim) CacheState() CacheState {
	st := CacheState{BlockSize: s.cfg.BlockSize, HashAlgo: s.cfg.HashAlgo}
	for _, rk := range s.ranks {
		rk.mu.Lock()
		rc := RankCache{Rank: rk.idx, CapacityBlocks: rk.pool.capacity(), FreeBlocks: rk.pool.numFree,
			Running: len(rk.running), Waiting: len(rk.waiting), Hashes: []uint64{}}
		for _, h := range rk.pool.cachedHashes() {
			rc.Hashes = append(rc.Hashes, wireHash(h))
		}
		rk.mu.Unlock()
		slices.Sort(rc.Hashes)
		st.Ranks = append(st.Ranks, rc)
	}
	return st
}

func (s *Sim) handleDebugCache(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.CacheState())
}

// handleReset is vLLM's POST /reset_prefix_cache on every rank. A rank with requests in flight
// cannot reset (vLLM refuses too); then the answer is 409 and the other ranks are still reset.
func (s *Sim) handleReset(w http.ResponseWriter, r *http.Request) {
	if !s.ResetPrefixCache(r.Context()) {
		writeError(w, &apiError{http.StatusConflict, "ConflictError", "prefix cache not reset on every rank: requests are running", ""})
		return
	}
	w.WriteHeader(http.StatusOK)
}

// ResetPrefixCache resets every rank's prefix cache; false if some rank was busy.
func (s *Sim) ResetPrefixCache(ctx context.Context) bool {
	ok := true
	for _, rk := range s.ranks {
		ok = rk.resetPrefixCache(ctx) && ok
	}
	return ok
}

// Restart simulates a process restart on every rank (see rank.restart); a restarted engine is
// awake.
func (s *Sim) Restart() {
	for _, rk := range s.ranks {
		rk.restart()
	}
	s.WakeUp(nil)
}

func (s *Sim) handleRestart(w http.ResponseWriter, _ *http.Request) {
	s.Restart()
	w.WriteHeader(http.StatusOK)
}

// SetEventsStalled stalls (or resumes) every rank's PUB side; held batches go out on resume.
func (s *Sim) SetEventsStalled(stalled bool) {
	for _, rk := range s.ranks {
		if rk.pub != nil {
			rk.pub.setStalled(stalled)
		}
	}
}

// handleDebugEvents takes {"stall": bool}.
func (s *Sim) handleDebugEvents(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stall *bool `json:"stall"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Stall == nil {
		writeError(w, badRequest(`body must be {"stall": true|false}`))
		return
	}
	s.SetEventsStalled(*req.Stall)
	w.WriteHeader(http.StatusOK)
}
