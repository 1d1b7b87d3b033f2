package proxy

import (
	"encoding/json"
	"net/http"
	"strings"
)

// API is the wire dialect of an answer: which stream events carry tokens, usage, the end and
// errors, and how the router's own errors are shaped.
type API int

const (
	// APIOpenAI is completions and chat completions: `data:` chunks with choices, `[DONE]`.
	APIOpenAI API = iota
	// APIResponses is /v1/responses: typed events (`event: response.created`, ...), tokens in
	// `response.*.delta` events, the end at `response.completed` (or incomplete, failed).
	APIResponses
	// APIMessages is vLLM's Anthropic /v1/messages: `message_start`, tokens in
	// `content_block_delta`, usage in `message_delta`, the end at `message_stop`; its errors
	// are Anthropic-shaped ({"type": "error", "error": {"type", "message"}}).
	APIMessages
)

// typedEvent is the part of a Responses or Messages event the router reads.
type typedEvent struct {
	Type     string          `json:"type"`
	Message  json.RawMessage `json:"message"`
	Response *struct {
		ID    string     `json:"id"`
		Usage *usageJSON `json:"usage"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	} `json:"response"`
	Usage *usageJSON      `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// classifyTyped reads one data payload of a Responses or Messages stream.
func classifyTyped(api API, data []byte) eventInfo {
	var e typedEvent
	if json.Unmarshal(data, &e) != nil {
		return eventInfo{kind: evData}
	}
	info := eventInfo{kind: evData}
	if e.Usage != nil {
		info.usage = e.Usage.usage()
	}
	if e.Response != nil {
		info.responseID = e.Response.ID
		if e.Response.Usage != nil {
			info.usage = e.Response.Usage.usage()
		}
	}
	switch {
	case e.Type == "error" || e.Type == "response.failed":
		info.kind = evError
		info.message = typedErrorMessage(api, &e, data)
		info.errorJSON = errorBodyFor(api, http.StatusBadGateway, TypeInternal, info.message)
		if api == APIMessages {
			info.errorJSON = data // already the Messages API's error body
		}
	case api == APIResponses && strings.HasSuffix(e.Type, ".delta"),
		api == APIMessages && e.Type == "content_block_delta":
		info.kind = evChoice
	case e.Type == "response.completed" || e.Type == "response.incomplete" || e.Type == "message_stop":
		info.kind = evDone
	case api == APIMessages && e.Type == "message_start" && len(e.Message) > 0:
		var m struct {
			Usage *usageJSON `json:"usage"`
		}
		if json.Unmarshal(e.Message, &m) == nil && m.Usage != nil {
			info.usage = m.Usage.usage()
		}
	}
	return info
}

func typedErrorMessage(api API, e *typedEvent, data []byte) string {
	if e.Response != nil && e.Response.Error != nil {
		return e.Response.Error.Message
	}
	var m struct {
		Message string `json:"message"`
		Error   struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(data, &m)
	switch {
	case m.Message != "":
		return m.Message
	case m.Error.Message != "":
		return m.Error.Message
	}
	return string(data)
}

// responseID is the id of a non-streamed Responses answer.
func responseID(body []byte) string {
	var r struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &r)
	return r.ID
}

// mergeUsage keeps what an earlier event reported that a later one leaves out (a Messages
// stream reports the input in message_start, the output in message_delta).
func mergeUsage(old, u *Usage) *Usage {
	if old == nil {
		return u
	}
	out := *u
	if out.PromptTokens == 0 {
		out.PromptTokens = old.PromptTokens
	}
	if !out.HasCached {
		out.CachedTokens, out.HasCached = old.CachedTokens, old.HasCached
	}
	if out.CompletionTokens == 0 {
		out.CompletionTokens = old.CompletionTokens
	}
	return &out
}
