// Package proxy forwards one OpenAI request to one engine (and DP rank) and copies the answer
// back: streams chunk by chunk, unbuffered and unchanged, with the engine's usage read on the
// way (and the usage-only final chunk dropped when the router asked for it, not the client).
// It also holds the pieces around a forward: OpenAI-shaped errors, body rewrites, passive and
// active health.
//
// It is built on net/http's Client and Transport rather than httputil.ReverseProxy: the router
// must inspect (and sometimes drop) individual SSE events, decide whether a 5xx may still be
// retried elsewhere before anything reached the client, and read usage from the answer;
// ReverseProxy's ModifyResponse/ErrorHandler hooks cannot drop one event of a stream or retry on
// another backend, so the copy loop is written here (about 150 lines).
package proxy

import (
	"encoding/json"
	"net/http"
)

// ErrorBody is the OpenAI error shape.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inner object of ErrorBody: vLLM's ErrorInfo (message, type, param, code;
// vllm/entrypoints/openai/engine/protocol.py), whose code is the HTTP status as an integer.
// OpenAI's own errors carry the same four keys (param and code may be null), so the official
// SDKs read both.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    any     `json:"code"`
}

// The router's error types are vLLM's, so a client sees one vocabulary whether the router or
// an engine refused it: create_error_response's (vllm/entrypoints/openai/engine/serving.py)
// for 400, 404, 500 and 501, and for other statuses the HTTP status phrase, as vLLM's
// HTTPException handler writes it (vllm/entrypoints/openai/api_server.py).
const (
	TypeBadRequest     = "BadRequestError"
	TypeNotFound       = "NotFoundError"
	TypeInternal       = "InternalServerError"
	TypeNotImplemented = "NotImplementedError"
	// TypeInvalidRequest is what vLLM's Responses API answers for a response id it does not hold.
	TypeInvalidRequest = "invalid_request_error"
)

// TypeFor is vLLM's error type for an HTTP status the router answers with.
func TypeFor(status int) string {
	switch {
	case status == http.StatusBadRequest:
		return TypeBadRequest
	case status == http.StatusNotFound:
		return TypeNotFound
	case status == http.StatusNotImplemented:
		return TypeNotImplemented
	case status == http.StatusInternalServerError || status == http.StatusBadGateway || status == http.StatusGatewayTimeout:
		return TypeInternal
	}
	return http.StatusText(status)
}

// WriteError answers with an OpenAI-shaped error of vLLM's type for the status; code is the
// HTTP status, like vLLM's.
func WriteError(w http.ResponseWriter, status int, msg string) {
	writeBody(w, status, errorBodyFor(APIOpenAI, status, TypeFor(status), msg))
}

// WriteErrorFor answers in the API's own error shape: the Messages API's
// ({"type": "error", "error": {"type", "message"}}, as vLLM's Anthropic router translates its
// errors), OpenAI's for the others.
func WriteErrorFor(w http.ResponseWriter, api API, status int, msg string) {
	writeBody(w, status, errorBodyFor(api, status, TypeFor(status), msg))
}

// WriteErrorTyped answers in the API's shape with a type other than the status's.
func WriteErrorTyped(w http.ResponseWriter, api API, status int, typ, msg string) {
	writeBody(w, status, errorBodyFor(api, status, typ, msg))
}

// WriteErrorDetail answers with an OpenAI-shaped error given in full (a param, a type other
// than the status's).
func WriteErrorDetail(w http.ResponseWriter, status int, d ErrorDetail) {
	d.Code = status
	b, _ := json.Marshal(ErrorBody{d})
	writeBody(w, status, b)
}

func writeBody(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// anthropicError is vLLM's AnthropicErrorResponse (vllm/entrypoints/anthropic/protocol.py).
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func errorBodyFor(api API, status int, typ, msg string) []byte {
	if api == APIMessages {
		e := anthropicError{Type: "error"}
		e.Error.Type, e.Error.Message = typ, msg
		b, _ := json.Marshal(e)
		return b
	}
	b, _ := json.Marshal(ErrorBody{ErrorDetail{Message: msg, Type: typ, Code: status}})
	return b
}

// OpenAIErrorAsMessages rewrites an engine's OpenAI-shaped error body as the Messages API's,
// as vLLM's Anthropic router does with the errors its chat machinery returns; a body that is
// not one is returned as it is.
func OpenAIErrorAsMessages(body []byte) []byte {
	var e ErrorBody
	if json.Unmarshal(body, &e) != nil || e.Error.Message == "" {
		return body
	}
	return errorBodyFor(APIMessages, 0, e.Error.Type, e.Error.Message)
}

// WriteStreamError writes an error event into a started OpenAI SSE stream, in the shape vLLM's
// stream generators use after the headers (`data: {"error": {...}}`; see
// create_streaming_error_response in vllm/entrypoints/openai/engine/serving.py). The official
// SDKs raise on it. Callers then abort the connection so no clean end follows.
func WriteStreamError(w http.ResponseWriter, typ, msg string, code int) {
	WriteStreamErrorFor(w, APIOpenAI, typ, msg, code)
}

// WriteStreamErrorFor writes the error event in the API's stream dialect: an `event: error`
// carrying the Messages API's error body, or the Responses API's error event
// ({"type": "error", "code", "message", "param"}).
func WriteStreamErrorFor(w http.ResponseWriter, api API, typ, msg string, code int) {
	var b []byte
	switch api {
	case APIMessages:
		b = append([]byte("event: error\ndata: "), errorBodyFor(api, code, typ, msg)...)
	case APIResponses:
		e, _ := json.Marshal(struct {
			Type    string  `json:"type"`
			Code    string  `json:"code"`
			Message string  `json:"message"`
			Param   *string `json:"param"`
		}{"error", typ, msg, nil})
		b = append([]byte("event: error\ndata: "), e...)
	default:
		e, _ := json.Marshal(ErrorBody{ErrorDetail{Message: msg, Type: typ, Code: code}})
		b = append([]byte("data: "), e...)
	}
	_, _ = w.Write(append(b, '\n', '\n'))
}
