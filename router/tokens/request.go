// Package tokens turns an OpenAI request into the prompt token ids the engine will see: chat
// requests through the engine's /v1/chat/completions/render (so the chat template is the
// engine's own), text completions through /v1/completions/render (or /tokenize on engines
// without render endpoints), and token-id prompts as given. Tokens are never guessed from bytes.
package tokens

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"unicode/utf8"
)

// Kind is the OpenAI endpoint a request was sent to.
type Kind int

const (
	// Completion is POST /v1/completions.
	Completion Kind = iota
	// Chat is POST /v1/chat/completions.
	Chat
	// Responses is POST /v1/responses (vLLM renders its instructions and input as chat).
	Responses
	// Messages is POST /v1/messages, vLLM's Anthropic endpoint (converted to chat by vLLM).
	Messages
	// Pooling is a request forwarded without keys: embeddings, pooling, classification,
	// scores, rerank, tokenize and detokenize (no KV cache to reuse).
	Pooling
)

func (k Kind) String() string {
	switch k {
	case Chat:
		return "chat"
	case Responses:
		return "responses"
	case Messages:
		return "messages"
	case Pooling:
		return "pooling"
	}
	return "completion"
}

// ChatRendered reports whether the engine renders the kind's prompt through its chat template.
func (k Kind) ChatRendered() bool { return k == Chat || k == Responses || k == Messages }

// Request is the part of an OpenAI request body the router needs. Raw fields keep the
// caller's bytes so a cache key or a forwarded body never depends on re-encoding.
type Request struct {
	Kind  Kind
	Model string
	// Stream and IncludeUsage are stream and stream_options.include_usage.
	Stream       bool
	IncludeUsage bool
	// CacheSalt is cache_salt ("" for none).
	CacheSalt string
	// PromptIDs is the first prompt when the completion prompt is given as token ids.
	PromptIDs []uint32
	// PromptText is the first prompt when the completion prompt is text.
	PromptText string
	// HasIDs tells PromptIDs apart from an empty text prompt.
	HasIDs bool
	// User is the OpenAI "user" field, used as a session key by session affinity.
	User string
	// SessionID is vLLM's request-level session_id: the body's session_id, else
	// vllm_xargs.session_id (vLLM's compatibility spelling); "" for none.
	SessionID string
	// PreviousResponseID is a Responses request's previous_response_id ("" for none): the
	// conversation so far lives in the memory of the engine that stored that response.
	PreviousResponseID string
	// Store is a Responses request's store (true unless it says false, as in vLLM).
	Store bool
	// Unkeyed says why the router cannot reproduce the engine's prompt for this request ("" when
	// it can): the request is routed by load.
	Unkeyed string

	// chatBody is the chat request the engine renders for a Responses or Messages request
	// (nil for the other kinds, whose body is rendered as it is).
	chatBody []byte

	// renderKey is the canonical bytes of every field that changes the rendered prompt.
	renderKey []byte
}

// BadRequestError is a request the engine would refuse too; the router answers 400.
type BadRequestError struct{ Msg string }

func (e *BadRequestError) Error() string { return e.Msg }

func badf(format string, a ...any) error { return &BadRequestError{fmt.Sprintf(format, a...)} }

// IsBadRequest reports whether err is a *BadRequestError.
func IsBadRequest(err error) bool {
	var b *BadRequestError
	return errors.As(err, &b)
}

// renderFields are the chat request fields that can change what the template renders. Anything
// else (sampling, stream, max tokens) leaves the prompt tokens alone, so two turns that differ
// only there share a cache entry.
var renderFields = []string{"messages", "tools", "tool_choice", "chat_template", "chat_template_kwargs",
	"add_generation_prompt", "continue_final_message", "add_special_tokens", "documents",
	"mm_processor_kwargs", "reasoning_effort", "response_format"}

// Parse checks an OpenAI body for kind and extracts what routing needs. It rejects what vLLM
// would reject with 400: invalid JSON, a missing model, no messages / no prompt, token ids out of
// range.
func Parse(kind Kind, body []byte) (*Request, error) {
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&top); err != nil {
		return nil, badf("invalid JSON body: %s", jsonError(err))
	}
	if dec.More() {
		return nil, badf("invalid JSON body: trailing data after the object")
	}
	if top == nil {
		return nil, badf("the body must be a JSON object")
	}
	r := &Request{Kind: kind}
	if err := optString(top, "model", &r.Model); err != nil {
		return nil, err
	}
	if r.Model == "" && kind != Pooling {
		return nil, badf("model is required")
	}
	if err := optBool(top, "stream", &r.Stream); err != nil {
		return nil, err
	}
	if raw, ok := top["stream_options"]; ok && !isNull(raw) {
		var so struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if err := json.Unmarshal(raw, &so); err != nil {
			return nil, badf("stream_options: %s", jsonError(err))
		}
		r.IncludeUsage = so.IncludeUsage != nil && *so.IncludeUsage
	}
	if err := optString(top, "cache_salt", &r.CacheSalt); err != nil {
		return nil, err
	}
	if err := optString(top, "user", &r.User); err != nil {
		return nil, err
	}
	if err := r.parseSession(top); err != nil {
		return nil, err
	}
	key := []byte(kind.String() + "\x00" + r.Model + "\x00")
	switch kind {
	case Responses, Messages:
		if err := r.parseChatLike(top); err != nil {
			return nil, err
		}
		key = append(append(key, r.chatBody...), 0)
	case Pooling:
		r.Unkeyed = UnkeyedPooling
	case Chat:
		raw, ok := top["messages"]
		var msgs []json.RawMessage
		if !ok || isNull(raw) {
			return nil, badf("messages is required")
		}
		if err := json.Unmarshal(raw, &msgs); err != nil {
			return nil, badf("messages must be an array: %s", jsonError(err))
		}
		if len(msgs) == 0 {
			return nil, badf("messages must not be empty")
		}
		for _, f := range renderFields {
			if v, ok := top[f]; ok {
				key = append(append(append(key, f...), 0), v...)
				key = append(key, 0)
			}
		}
	default:
		raw, ok := top["prompt"]
		if !ok || isNull(raw) {
			return nil, badf("prompt is required")
		}
		if err := r.parsePrompt(raw); err != nil {
			return nil, err
		}
		key = append(append(key, raw...), 0)
		if v, ok := top["add_special_tokens"]; ok {
			key = append(key, v...)
		}
	}
	r.renderKey = key
	return r, nil
}

// parsePrompt accepts what vLLM's CompletionRequest.prompt does: a string, a list of strings,
// a list of token ids or a list of token-id lists. The router routes by the first prompt.
func (r *Request) parsePrompt(raw json.RawMessage) error {
	ids, err := parseIDs(raw) // the common token-id form, without a generic decode
	if err == nil {
		return r.setIDs(ids)
	}
	if err != errNotIDs {
		return err
	}
	if s, ok := jsonString(raw); ok {
		r.PromptText = s
		return nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return badf("prompt must be a string, a list of strings, token ids or lists of token ids")
	}
	if len(list) == 0 {
		return badf("prompt must not be empty")
	}
	if s, ok := jsonString(list[0]); ok {
		r.PromptText = s
		return nil
	}
	ids, err = parseIDs(list[0])
	if err == nil {
		return r.setIDs(ids)
	}
	if err != errNotIDs {
		return err
	}
	return badf("prompt must be a string, a list of strings, or lists of valid token ids (integers 0..%d)", uint32(math.MaxUint32))
}

// jsonString is json.Unmarshal of raw (valid JSON: a value the body's decode produced) into a
// string. A prompt is the largest string the router reads (a 100k-token prompt is hundreds of kB):
// one with no escapes and valid UTF-8 decodes to its bytes as they are, without a second scan
// by encoding/json; any other takes encoding/json's path (it unescapes, and replaces invalid
// UTF-8 with U+FFFD).
func jsonString(raw []byte) (string, bool) {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		if in := raw[1 : len(raw)-1]; bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
			return string(in), true
		}
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func (r *Request) setIDs(ids []uint32) error {
	if len(ids) == 0 {
		return badf("prompt token ids must not be empty")
	}
	r.PromptIDs, r.HasIDs = ids, true
	return nil
}

// errNotIDs: the value is not a JSON array of integers; the caller tries the other prompt forms.
var errNotIDs = errors.New("not a token-id array")

// parseIDs reads a JSON array of token ids: integers 0..2^32-1, the range every vocabulary fits
// in and the router keys and hashes as uint32 (the same rule as the render path and the KV-event
// decoder; vLLM itself takes any Python int and refuses ids past its vocabulary). An integer out
// of that range is a bad request naming it; anything else that is not such an array (floats,
// exponents, strings, bad JSON) is errNotIDs. It is written by hand because it is the hot path
// of token-id prompts (a 100k-token prompt is 600 KB of JSON): encoding/json spends about 10x
// longer going through []json.RawMessage or []float64.
func parseIDs(raw []byte) (ids []uint32, err error) {
	i, n := 0, len(raw)
	skip := func() {
		for i < n && (raw[i] == ' ' || raw[i] == '\n' || raw[i] == '\t' || raw[i] == '\r') {
			i++
		}
	}
	skip()
	if i >= n || raw[i] != '[' {
		return nil, errNotIDs
	}
	i++
	ids = make([]uint32, 0, n/6)
	skip()
	if i < n && raw[i] == ']' {
		i++
		skip()
		if i != n {
			return nil, errNotIDs
		}
		return ids, nil
	}
	for {
		skip()
		start := i
		neg := i < n && raw[i] == '-'
		if neg {
			i++
		}
		digits := i
		var v uint64
		for i < n && raw[i] >= '0' && raw[i] <= '9' {
			if v <= math.MaxUint32 { // past it, only the digits are scanned (no overflow)
				v = v*10 + uint64(raw[i]-'0')
			}
			i++
		}
		if i == digits || (raw[digits] == '0' && i-digits > 1) {
			return nil, errNotIDs
		}
		if i < n && (raw[i] == '.' || raw[i] == 'e' || raw[i] == 'E') {
			return nil, errNotIDs // not an integer literal
		}
		if v > math.MaxUint32 || (neg && v != 0) { // -0 is JSON's 0
			lit := raw[start:i]
			if len(lit) > 40 {
				lit = append(lit[:37:37], "..."...)
			}
			return nil, badf("prompt token id %s is out of range: token ids are integers 0..%d", lit, uint32(math.MaxUint32))
		}
		ids = append(ids, uint32(v))
		skip()
		if i >= n {
			return nil, errNotIDs
		}
		switch raw[i] {
		case ',':
			i++
		case ']':
			i++
			skip()
			if i != n {
				return nil, errNotIDs
			}
			return ids, nil
		default:
			return nil, errNotIDs
		}
	}
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

func optString(top map[string]json.RawMessage, k string, dst *string) error {
	raw, ok := top[k]
	if !ok || isNull(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return badf("%s must be a string", k)
	}
	return nil
}

func optBool(top map[string]json.RawMessage, k string, dst *bool) error {
	raw, ok := top[k]
	if !ok || isNull(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return badf("%s must be a boolean", k)
	}
	return nil
}

// jsonError describes a JSON decoding error in the request's terms: what the JSON held and what
// was expected there, never the Go type it was decoded into.
func jsonError(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		want := "a value of another kind"
		switch te.Type.Kind() {
		case reflect.Map, reflect.Struct:
			want = "an object"
		case reflect.Slice, reflect.Array:
			want = "an array"
		case reflect.String:
			want = "a string"
		case reflect.Bool:
			want = "a boolean"
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8,
			reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
			want = "a number"
		}
		where := ""
		if te.Field != "" {
			where = " at " + te.Field
		}
		return fmt.Sprintf("expected %s%s, got a JSON %s", want, where, te.Value)
	case errors.As(err, &se):
		return fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "the JSON ends early"
	}
	return err.Error()
}

// parseSession reads vLLM's session_id: the body field, else vllm_xargs.session_id.
func (r *Request) parseSession(top map[string]json.RawMessage) error {
	if err := optString(top, "session_id", &r.SessionID); err != nil || r.SessionID != "" {
		return err
	}
	raw, ok := top["vllm_xargs"]
	if !ok || isNull(raw) {
		return nil
	}
	var xs map[string]json.RawMessage
	if json.Unmarshal(raw, &xs) != nil {
		return badf("vllm_xargs must be an object")
	}
	if v, ok := xs["session_id"]; ok && json.Unmarshal(v, &r.SessionID) != nil {
		return badf("vllm_xargs.session_id must be a string")
	}
	return nil
}
