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

// Event is what the router reads from one SSE event of an engine's answer, whichever front end
// sees it pass (the proxy copying it, the endpoint picker watching the gateway's response
// phases): one reader for both.
type Event struct {
	// Token: the event carries a token (a choice, a Responses delta, a Messages
	// content_block_delta).
	Token bool
	// Done: the answer's end (OpenAI's [DONE], response.completed, message_stop).
	Done bool
	// Error is the message of an in-stream error event, "" for none.
	Error string
	// Usage is the usage the event reports (nil: none); UsageOnly: an OpenAI chunk with usage
	// and no choice (the one a router that asked for usage drops).
	Usage     *Usage
	UsageOnly bool
	// ResponseID is a Responses event's response.id.
	ResponseID string
}

// ReadEvent reads one SSE event (its lines through the blank line) in an API's dialect.
func ReadEvent(ev []byte, api API) Event {
	c := classify(ev, api)
	e := Event{Token: c.kind == evChoice, Done: c.kind == evDone, Usage: c.usage, UsageOnly: c.usageOnly, ResponseID: c.responseID}
	if c.kind == evError {
		e.Error = c.message
	}
	return e
}

// ReadAnswer reads a non-streamed answer in an API's dialect: its usage (nil: none), a
// Responses answer's id, and the message of an error body ("" for none).
func ReadAnswer(body []byte, api API) (u *Usage, responseID, errMsg string) {
	// id and error are read loosely: an answer whose id is not a string still has its usage.
	var a struct {
		Usage *usageJSON      `json:"usage"`
		ID    json.RawMessage `json:"id"`
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &a) != nil {
		return nil, "", ""
	}
	if a.Usage != nil {
		u = a.Usage.usage()
	}
	if api == APIResponses {
		_ = json.Unmarshal(a.ID, &responseID)
	}
	if len(a.Error) > 0 && string(a.Error) != "null" {
		var e struct {
			Message string `json:"message"`
		}
		errMsg = string(a.Error)
		if json.Unmarshal(a.Error, &e) == nil && e.Message != "" {
			errMsg = e.Message
		}
	}
	return u, responseID, errMsg
}

// MergeUsage keeps what an earlier event reported that a later one leaves out (mergeUsage).
func MergeUsage(old, u *Usage) *Usage { return mergeUsage(old, u) }
