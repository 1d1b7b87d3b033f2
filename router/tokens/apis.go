package tokens

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Reasons a Responses or Messages request is routed without keys: the engine's prompt holds
// something the router does not reproduce byte for byte.
const (
	// UnkeyedPreviousResponse: the prompt starts with a stored conversation the engine keeps in
	// its own memory (previous_response_id); the request is pinned to that engine instead.
	UnkeyedPreviousResponse = "responses_previous"
	// UnkeyedResponsesItems: input items other than messages (function calls and their output,
	// reasoning items), or tools, which vLLM converts through its own models first.
	UnkeyedResponsesItems = "responses_items"
	// UnkeyedMessagesContent: a tool_result block whose content is not a string (vLLM renders
	// Python's repr of it).
	UnkeyedMessagesContent = "messages_content"
	// UnkeyedPooling: embeddings, pooling, scores, rerank, tokenize: no KV cache to reuse.
	UnkeyedPooling = "pooling"
)

// ChatBody is the chat request the engine renders for a Responses or Messages request, nil for
// the other kinds.
func (r *Request) ChatBody() []byte { return r.chatBody }

// parseChatLike reads a Responses or Messages request into the chat request vLLM builds from it
// before rendering, so the router's render call (the engine's /v1/chat/completions/render)
// yields the engine's prompt.
func (r *Request) parseChatLike(top map[string]json.RawMessage) error {
	var msgs []any
	var extra map[string]any
	var err error
	if r.Kind == Responses {
		msgs, err = r.responsesMessages(top)
	} else {
		msgs, extra, err = r.messagesMessages(top)
	}
	if err != nil {
		return err
	}
	body := map[string]any{"model": r.Model, "messages": msgs}
	for k, v := range extra {
		body[k] = v
	}
	b, err := json.Marshal(body)
	if err != nil {
		return badf("the request cannot be rendered as chat: %s", jsonError(err))
	}
	r.chatBody = b
	return nil
}

// responsesMessages follows vLLM's construct_input_messages
// (vllm/entrypoints/openai/responses/utils.py): instructions as a system message, a string
// input as a user message, message items as they are. Conversations continued with
// previous_response_id, other item types and tools are routed unkeyed.
func (r *Request) responsesMessages(top map[string]json.RawMessage) ([]any, error) {
	r.Store = true
	if err := optBool(top, "store", &r.Store); err != nil {
		return nil, err
	}
	if err := optString(top, "previous_response_id", &r.PreviousResponseID); err != nil {
		return nil, err
	}
	if r.PreviousResponseID != "" {
		r.Unkeyed = UnkeyedPreviousResponse
	}
	var msgs []any
	var instructions string
	if err := optString(top, "instructions", &instructions); err != nil {
		return nil, err
	}
	if instructions != "" {
		msgs = append(msgs, map[string]any{"role": "system", "content": instructions})
	}
	raw, ok := top["input"]
	if !ok || isNull(raw) {
		return nil, badf("input is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		msgs = append(msgs, map[string]any{"role": "user", "content": s})
	} else {
		var items []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, badf("input must be a string or a list of input items")
		}
		for _, it := range items {
			var typ, role string
			_ = optString(it, "type", &typ)
			_ = optString(it, "role", &role)
			if role == "" || (typ != "" && typ != "message") {
				if r.Unkeyed == "" {
					r.Unkeyed = UnkeyedResponsesItems
				}
				continue
			}
			msgs = append(msgs, map[string]any{"role": role, "content": it["content"]})
		}
	}
	var tools []json.RawMessage
	var choice string
	_ = json.Unmarshal(top["tools"], &tools)
	_ = optString(top, "tool_choice", &choice)
	if len(tools) > 0 && choice != "none" && r.Unkeyed == "" {
		r.Unkeyed = UnkeyedResponsesItems
	}
	return msgs, nil
}

// anthropicBlock is a content block of vLLM's AnthropicMessagesRequest.
type anthropicBlock struct {
	Type     string          `json:"type"`
	Text     *string         `json:"text"`
	Source   map[string]any  `json:"source"`
	ID       *string         `json:"id"`
	Name     *string         `json:"name"`
	Input    json.RawMessage `json:"input"`
	Content  json.RawMessage `json:"content"`
	Thinking *string         `json:"thinking"`
}

// messagesMessages follows vLLM's _convert_anthropic_to_openai_request
// (vllm/entrypoints/anthropic/serving.py): the system prompt as a system message (text blocks
// joined), text blocks as text parts (one alone as a string), images as image_url parts,
// thinking as the message's reasoning, tool_use blocks as tool calls (arguments written as
// Python's json.dumps writes them), a user's tool_result blocks as tool messages before it,
// tools as chat functions with tool_choice mapped.
func (r *Request) messagesMessages(top map[string]json.RawMessage) ([]any, map[string]any, error) {
	var msgs []any
	if raw, ok := top["system"]; ok && !isNull(raw) {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			if s != "" {
				msgs = append(msgs, map[string]any{"role": "system", "content": s})
			}
		} else {
			var blocks []anthropicBlock
			if err := json.Unmarshal(raw, &blocks); err != nil {
				return nil, nil, badf("system must be a string or a list of content blocks")
			}
			sys := ""
			for _, b := range blocks {
				if b.Type == "text" && b.Text != nil {
					sys += *b.Text
				}
			}
			if len(blocks) > 0 {
				msgs = append(msgs, map[string]any{"role": "system", "content": sys})
			}
		}
	}
	var in []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	raw, ok := top["messages"]
	if !ok || isNull(raw) {
		return nil, nil, badf("messages is required")
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, nil, badf("messages must be a list of messages")
	}
	if len(in) == 0 {
		return nil, nil, badf("messages must not be empty")
	}
	for _, m := range in {
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			msgs = append(msgs, map[string]any{"role": m.Role, "content": s})
			continue
		}
		var blocks []anthropicBlock
		if err := json.Unmarshal(m.Content, &blocks); err != nil {
			return nil, nil, badf("message content must be a string or a list of content blocks")
		}
		out, tools := r.convertBlocks(m.Role, blocks)
		msgs = append(msgs, tools...)
		if out != nil {
			msgs = append(msgs, out)
		}
	}
	if raw, ok := top["metadata"]; ok && r.User == "" {
		// The Messages API's end-user id, the session key when the client gives no other.
		var md struct {
			UserID string `json:"user_id"`
		}
		if json.Unmarshal(raw, &md) == nil {
			r.User = md.UserID
		}
	}
	extra, err := anthropicTools(top)
	return msgs, extra, err
}

// convertBlocks converts one message's content blocks; it returns the message (nil when vLLM
// drops it) and the tool messages vLLM puts before it.
func (r *Request) convertBlocks(role string, blocks []anthropicBlock) (map[string]any, []any) {
	msg := map[string]any{"role": role}
	var parts, calls, toolMsgs []any
	reasoning, hasReasoning := "", false
	for _, b := range blocks {
		switch b.Type {
		case "text":
			if b.Text != nil && *b.Text != "" {
				parts = append(parts, map[string]any{"type": "text", "text": *b.Text})
			}
		case "image":
			if len(b.Source) > 0 {
				data, _ := b.Source["data"].(string)
				parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": data}})
			}
		case "thinking":
			if b.Thinking != nil {
				reasoning += *b.Thinking
				hasReasoning = true
			}
		case "tool_use":
			id := ""
			if b.ID != nil {
				id = *b.ID
			}
			if id == "" {
				r.Unkeyed = UnkeyedMessagesContent // vLLM stamps the time in it
			}
			name := ""
			if b.Name != nil {
				name = *b.Name
			}
			calls = append(calls, map[string]any{"id": id, "type": "function",
				"function": map[string]any{"name": name, "arguments": pyDumps(b.Input)}})
		case "tool_result":
			text, ok := blockText(b.Content)
			if !ok {
				r.Unkeyed = UnkeyedMessagesContent
			}
			if role == "user" {
				id := ""
				if b.ID != nil {
					id = *b.ID
				}
				toolMsgs = append(toolMsgs, map[string]any{"role": "tool", "tool_call_id": id, "content": text})
			} else {
				parts = append(parts, map[string]any{"type": "text", "text": "Tool result: " + text})
			}
		}
	}
	if hasReasoning && reasoning != "" {
		msg["reasoning"] = reasoning
	}
	if len(calls) > 0 {
		msg["tool_calls"] = calls
	}
	switch {
	case len(parts) == 1 && parts[0].(map[string]any)["type"] == "text":
		msg["content"] = parts[0].(map[string]any)["text"]
	case len(parts) > 0:
		msg["content"] = parts
	case len(calls) == 0 && !(hasReasoning && reasoning != ""):
		return nil, toolMsgs
	}
	return msg, toolMsgs
}

// blockText is str(content) as vLLM writes a tool_result's content: a string as it is, nothing
// as ""; false for anything else (Python's repr of a list is not reproduced).
func blockText(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || isNull(raw) {
		return "", true
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var list []any
	if json.Unmarshal(raw, &list) == nil && len(list) == 0 {
		return "", true
	}
	return "", false
}

// anthropicTools converts tools and tool_choice as vLLM does: each tool a chat function (its
// input_schema the parameters, "type": "object" added when absent), tool_choice auto -> auto,
// any -> required, tool -> the named function, and auto when tools come without one.
func anthropicTools(top map[string]json.RawMessage) (map[string]any, error) {
	extra := map[string]any{}
	var choice *struct {
		Type string  `json:"type"`
		Name *string `json:"name"`
	}
	if raw, ok := top["tool_choice"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &choice); err != nil {
			return nil, badf("tool_choice must be an object with a type")
		}
		switch choice.Type {
		case "auto":
			extra["tool_choice"] = "auto"
		case "any":
			extra["tool_choice"] = "required"
		case "tool":
			extra["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": choice.Name}}
		default:
			return nil, badf("tool_choice.type must be auto, any or tool")
		}
	}
	raw, ok := top["tools"]
	if !ok || isNull(raw) {
		return extra, nil
	}
	var tools []struct {
		Name        string                     `json:"name"`
		Description *string                    `json:"description"`
		InputSchema map[string]json.RawMessage `json:"input_schema"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, badf("tools must be a list of tools with a name and an input_schema")
	}
	var out []any
	for _, t := range tools {
		if t.InputSchema == nil {
			return nil, badf("tools: %q has no input_schema", t.Name)
		}
		if _, ok := t.InputSchema["type"]; !ok {
			t.InputSchema["type"] = json.RawMessage(`"object"`)
		}
		out = append(out, map[string]any{"type": "function", "function": map[string]any{
			"name": t.Name, "description": t.Description, "parameters": t.InputSchema}})
	}
	if _, ok := extra["tool_choice"]; !ok {
		extra["tool_choice"] = "auto"
	}
	extra["tools"] = out
	return extra, nil
}

// pyDumps writes JSON the way Python's json.dumps does by default: ", " and ": " separators,
// keys in the order given, non-ASCII escaped as \uXXXX (surrogate pairs past the BMP). An
// absent input is "{}", as vLLM writes json.dumps(block.input or {}). Numbers are kept as
// written (Python would rewrite a float such as 1e5 as 100000.0: such tool calls render
// differently, seen as a prediction miss).
func pyDumps(raw json.RawMessage) string {
	if len(raw) == 0 || isNull(raw) {
		return "{}"
	}
	var b bytes.Buffer
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := pyValue(dec, &b); err != nil {
		return string(raw)
	}
	if b.String() == "[]" || b.String() == "\"\"" || b.String() == "0" || b.String() == "false" {
		return "{}" // Python's `input or {}`: a falsy input is replaced
	}
	return b.String()
}

func pyValue(dec *json.Decoder, b *bytes.Buffer) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		closing := byte(']')
		if v == '{' {
			closing = '}'
		}
		b.WriteByte(byte(v))
		for first := true; dec.More(); first = false {
			if !first {
				b.WriteString(", ")
			}
			if v == '{' {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				ks, _ := k.(string)
				pyString(b, ks)
				b.WriteString(": ")
			}
			if err := pyValue(dec, b); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return err
		}
		b.WriteByte(closing)
	case string:
		pyString(b, v)
	case json.Number:
		b.WriteString(v.String())
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case nil:
		b.WriteString("null")
	default:
		return fmt.Errorf("unexpected JSON token %v", tok)
	}
	return nil
}

// pyString writes s as Python's json.dumps (ensure_ascii) does.
func pyString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || (r >= 0x7f && r < utf8.RuneSelf):
			fmt.Fprintf(b, `\u%04x`, r)
		case r < utf8.RuneSelf:
			b.WriteRune(r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(b, `\u%04x`, r)
		}
	}
	b.WriteByte('"')
}
