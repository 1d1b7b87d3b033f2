package vllmsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The Responses API (/v1/responses) and the Messages API (/v1/messages) as vLLM serves them: both
// become a chat prompt rendered with the chat template, then generate like chat; only the
// request's reading and the answer's shape differ. The simulator keeps stored responses in its
// own memory, as vLLM does (with VLLM_ENABLE_RESPONSES_API_STORE=1), so a follow-up naming a
// previous_response_id works only on the simulator that answered it.

// Answer dialects of a job.
const (
	dialectOpenAI    = ""
	dialectResponses = "responses"
	dialectMessages  = "messages"
)

// maxStoredResponses bounds the simulator's response store (vLLM's is unbounded; a test
// process need not be): past it the oldest entry goes.
const maxStoredResponses = 10000

// storedResponse is one stored Responses answer: the conversation it continued (its
// messages) and its output, which a follow-up prepends, and the answer itself for GET.
type storedResponse struct {
	msgs   []chatMessage
	output string
	answer map[string]any
}

// responseStore is the simulator's in-memory store of Responses answers.
type responseStore struct {
	mu    sync.Mutex
	m     map[string]*storedResponse
	order []string
}

func (rs *responseStore) get(id string) (*storedResponse, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.m[id]
	return r, ok
}

func (rs *responseStore) put(id string, r *storedResponse) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.m == nil {
		rs.m = map[string]*storedResponse{}
	}
	if _, ok := rs.m[id]; !ok {
		rs.order = append(rs.order, id)
	}
	rs.m[id] = r
	if len(rs.order) > maxStoredResponses {
		delete(rs.m, rs.order[0])
		rs.order = rs.order[1:]
	}
}

// responseNotFound is vLLM's answer for a response id its store does not hold.
func responseNotFound(id string) *apiError {
	return &apiError{http.StatusNotFound, "invalid_request_error", fmt.Sprintf("Response with id '%s' not found.", id), "response_id"}
}

type responsesRequest struct {
	commonParams
	Input              json.RawMessage `json:"input"`
	Instructions       string          `json:"instructions"`
	PreviousResponseID string          `json:"previous_response_id"`
	Store              *bool           `json:"store"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
}

// responsesMessages builds the chat messages of a Responses request: the instructions as a system
// message, a stored previous conversation and its output, then the input (a string is a user
// message; items are messages with a role).
func (s *Sim) responsesMessages(req *responsesRequest) ([]chatMessage, error) {
	var msgs []chatMessage
	if req.Instructions != "" {
		msgs = append(msgs, textMessage("system", req.Instructions))
	}
	if id := req.PreviousResponseID; id != "" {
		prev, ok := s.stored.get(id)
		if !ok {
			return nil, responseNotFound(id)
		}
		msgs = append(msgs, prev.msgs...)
		msgs = append(msgs, textMessage("assistant", prev.output))
	}
	if len(req.Input) == 0 || string(req.Input) == "null" {
		return nil, badRequest("input is required")
	}
	var text string
	if json.Unmarshal(req.Input, &text) == nil {
		return append(msgs, textMessage("user", text)), nil
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(req.Input, &items); err != nil {
		return nil, badRequest("input must be a string or a list of input items")
	}
	for _, it := range items {
		if it.Role == "" || (it.Type != "" && it.Type != "message") {
			return nil, badRequest("input item type %q is not supported by the simulator (messages only)", it.Type)
		}
		msgs = append(msgs, chatMessage{Role: it.Role, Content: it.Content})
	}
	return msgs, nil
}

func textMessage(role, text string) chatMessage {
	b, _ := json.Marshal(text)
	return chatMessage{Role: role, Content: b}
}

func (s *Sim) handleResponses(w http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	msgs, err := s.responsesMessages(&req)
	if err != nil {
		writeError(w, err)
		return
	}
	text, err := renderChat(msgs, true, false)
	if err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	req.N, req.StreamOptions = nil, nil
	j, err := s.newJob(true, req.commonParams, req.MaxOutputTokens, [][]uint32{Tokenize(text)})
	if err != nil {
		writeError(w, err)
		return
	}
	j.dialect, j.msgs = dialectResponses, msgs
	j.store = req.Store == nil || *req.Store
	j.id = s.requestID("resp")
	s.run(w, r, j)
}

// handleStoredResponse serves GET /v1/responses/{id} (the stored answer) and POST
// /v1/responses/{id}/cancel (the simulator runs no background responses: vLLM refuses to
// cancel a synchronous one).
func (s *Sim) handleStoredResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	prev, ok := s.stored.get(id)
	switch {
	case !ok:
		writeError(w, responseNotFound(id))
	case r.Method == http.MethodPost:
		writeError(w, &apiError{http.StatusBadRequest, "invalid_request_error", "Cannot cancel a synchronous response.", "response_id"})
	default:
		writeJSON(w, http.StatusOK, prev.answer)
	}
}

type anthropicRequest struct {
	Model     string          `json:"model"`
	MaxTokens *int            `json:"max_tokens"`
	Stream    bool            `json:"stream"`
	System    json.RawMessage `json:"system"`
	Messages  []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	// KVTransferParams: vLLM's Messages API carries the P/D connector's parameters both ways
	// (vllm/entrypoints/anthropic/protocol.py, AnthropicMessagesRequest and
	// AnthropicMessagesResponse, at 00589e563e771f2de7abeb48bd0814873e891411).
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
}

type anthropicBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// blocksText is a Messages API content's texts: a string, or its non-empty text blocks (other
// blocks are not simulated).
func blocksText(raw json.RawMessage) ([]string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}, nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, badRequest("content must be a string or a list of content blocks")
	}
	var out []string
	for _, b := range blocks {
		if b.Type != "text" {
			return nil, badRequest("content block type %q is not supported by the simulator (text only)", b.Type)
		}
		if b.Text != "" {
			out = append(out, b.Text)
		}
	}
	return out, nil
}

// anthropicMessages converts a Messages request to chat messages: the system prompt (its text
// blocks joined) first, one text block as a string, several as text parts, a message with no
// text dropped.
func anthropicMessages(req *anthropicRequest) ([]chatMessage, error) {
	var msgs []chatMessage
	if len(req.System) > 0 && string(req.System) != "null" {
		// vLLM adds the system message when the field is truthy: a non-empty string, or a
		// non-empty list of blocks (whose text blocks are joined, possibly to nothing).
		var sys string
		if json.Unmarshal(req.System, &sys) != nil {
			var blocks []anthropicBlock
			if err := json.Unmarshal(req.System, &blocks); err != nil {
				return nil, badRequest("system must be a string or a list of content blocks")
			}
			for _, b := range blocks {
				if b.Type == "text" {
					sys += b.Text
				}
			}
			if len(blocks) > 0 {
				msgs = append(msgs, textMessage("system", sys))
			}
		} else if sys != "" {
			msgs = append(msgs, textMessage("system", sys))
		}
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("messages must not be empty")
	}
	for _, m := range req.Messages {
		parts, err := blocksText(m.Content)
		if err != nil {
			return nil, err
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil || len(parts) == 1 {
			msgs = append(msgs, textMessage(m.Role, strings.Join(parts, "")))
			continue
		}
		if len(parts) == 0 {
			continue
		}
		var ps []contentPart
		for _, p := range parts {
			ps = append(ps, contentPart{Type: "text", Text: p})
		}
		b, _ := json.Marshal(ps)
		msgs = append(msgs, chatMessage{Role: m.Role, Content: b})
	}
	return msgs, nil
}

func (s *Sim) handleMessages(w http.ResponseWriter, r *http.Request) {
	var req anthropicRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeAnthropicError(w, err)
		return
	}
	if req.MaxTokens == nil || *req.MaxTokens <= 0 {
		writeAnthropicError(w, badRequest("max_tokens must be positive"))
		return
	}
	msgs, err := anthropicMessages(&req)
	if err != nil {
		writeAnthropicError(w, err)
		return
	}
	text, err := renderChat(msgs, true, false)
	if err != nil {
		writeAnthropicError(w, badRequest("%v", err))
		return
	}
	p := commonParams{Model: req.Model, Stream: req.Stream, Temperature: req.Temperature, TopP: req.TopP,
		KVTransferParams: req.KVTransferParams}
	j, err := s.newJob(true, p, req.MaxTokens, [][]uint32{Tokenize(text)})
	if err != nil {
		writeAnthropicError(w, err)
		return
	}
	j.dialect = dialectMessages
	j.id = s.requestID("msg")
	s.run(w, r, j)
}

// anthropicBody is vLLM's AnthropicErrorResponse for an error.
func anthropicBody(err error) (int, map[string]any) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{http.StatusInternalServerError, "InternalServerError", err.Error(), ""}
	}
	return ae.status, map[string]any{"type": "error", "error": map[string]any{"type": ae.typ, "message": ae.msg}}
}

func writeAnthropicError(w http.ResponseWriter, err error) {
	status, body := anthropicBody(err)
	writeJSON(w, status, body)
}

// typed writes an SSE event with an event name, as the Responses and Messages streams do.
func (o *output) typed(name string, v map[string]any) {
	if o.j.dialect == dialectResponses {
		v["sequence_number"] = o.seq
		o.seq++
	}
	b, _ := json.Marshal(v)
	_, _ = o.w.Write([]byte("event: " + name + "\ndata: " + string(b) + "\n\n"))
	o.flush()
}

// responseObject is the Responses API's answer with the text so far.
func (o *output) responseObject(status, text string, usage any) map[string]any {
	var output []any
	if status == "completed" {
		output = []any{map[string]any{"type": "message", "id": "msg_" + o.j.id, "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}}
	}
	return map[string]any{"id": o.j.id, "object": "response", "created_at": time.Now().Unix(), "model": o.j.model,
		"status": status, "output": output, "usage": usage}
}

// dialectStart opens a Responses or Messages stream at its first token.
func (o *output) dialectStart() {
	switch o.j.dialect {
	case dialectResponses:
		o.typed("response.created", map[string]any{"type": "response.created", "response": o.responseObject("in_progress", "", nil)})
		o.typed("response.in_progress", map[string]any{"type": "response.in_progress", "response": o.responseObject("in_progress", "", nil)})
	case dialectMessages:
		o.typed("message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": o.j.id, "type": "message",
			"role": "assistant", "content": []any{}, "model": o.j.model, "usage": map[string]any{"input_tokens": len(o.reqs[0].prompt), "output_tokens": 0}}})
		o.typed("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	}
}

// dialectChunk streams one token's text.
func (o *output) dialectChunk(text string) {
	if o.j.dialect == dialectResponses {
		o.typed("response.output_text.delta", map[string]any{"type": "response.output_text.delta", "item_id": "msg_" + o.j.id,
			"output_index": 0, "content_index": 0, "delta": text, "logprobs": []any{}})
		return
	}
	o.typed("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": text}})
}

// dialectUsage is the answer's usage in the dialect's shape.
func (o *output) dialectUsage() map[string]any {
	u := o.usage()
	cached := 0
	if d, ok := u["prompt_tokens_details"].(map[string]any); ok {
		cached, _ = d["cached_tokens"].(int)
	}
	if o.j.dialect == dialectMessages {
		return map[string]any{"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"], "cache_read_input_tokens": cached}
	}
	return map[string]any{"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"], "total_tokens": u["total_tokens"],
		"input_tokens_details": map[string]any{"cached_tokens": cached}, "output_tokens_details": map[string]any{"reasoning_tokens": 0}}
}

// text is the whole generated text of the job's one request.
func (o *output) text() string {
	toks, _, _, _ := o.reqs[0].take(0)
	t, _ := Detokenize(toks)
	return t
}

// dialectFinal is the whole (non-streamed) answer; a stored Responses answer is kept.
func (o *output) dialectFinal() map[string]any {
	text := o.text()
	if o.j.dialect == dialectMessages {
		var xfer any
		if ids := o.reqs[0].xferBlockIDs; ids != nil {
			xfer = o.rk.transferParams(o.sim.engineID, o.reqs[0])
		}
		return map[string]any{"id": o.j.id, "type": "message", "role": "assistant", "model": o.j.model,
			"content": []any{map[string]any{"type": "text", "text": text}}, "stop_reason": "max_tokens", "stop_sequence": nil,
			"usage": o.dialectUsage(), "kv_transfer_params": xfer}
	}
	answer := o.responseObject("completed", text, o.dialectUsage())
	if o.j.store {
		o.sim.stored.put(o.j.id, &storedResponse{msgs: o.j.msgs, output: text, answer: answer})
	}
	return answer
}

// dialectEnd closes a Responses or Messages stream.
func (o *output) dialectEnd() {
	if o.j.dialect == dialectResponses {
		o.typed("response.completed", map[string]any{"type": "response.completed", "response": o.dialectFinal()})
		return
	}
	o.typed("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	o.typed("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "max_tokens"},
		"usage": map[string]any{"output_tokens": o.dialectUsage()["output_tokens"]}})
	o.typed("message_stop", map[string]any{"type": "message_stop"})
	o.done() // vLLM's Messages stream ends with data: [DONE] too
}

// dialectError ends a started Responses or Messages stream with the dialect's error event.
func (o *output) dialectError(err error) {
	if o.j.dialect == dialectMessages {
		_, body := anthropicBody(err)
		o.typed("error", body)
		return
	}
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{http.StatusInternalServerError, "InternalServerError", err.Error(), ""}
	}
	o.typed("error", map[string]any{"type": "error", "code": ae.typ, "message": ae.msg, "param": nil})
}
