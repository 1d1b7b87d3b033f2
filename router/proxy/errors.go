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

// Error types the router uses.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable"
)

// WriteError answers with an OpenAI-shaped error; code is the HTTP status, like vLLM's.
func WriteError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(ErrorBody{ErrorDetail{Message: msg, Type: typ, Code: status}})
}

// WriteStreamError writes an error event into a started SSE stream, in the shape vLLM's stream
// generators use after the headers (`data: {"error": {...}}`; see create_streaming_error_response
// in vllm/entrypoints/openai/engine/serving.py). The official SDKs raise on it. Callers then abort
// the connection so no clean end follows.
func WriteStreamError(w http.ResponseWriter, typ, msg string, code int) {
	b, _ := json.Marshal(ErrorBody{ErrorDetail{Message: msg, Type: typ, Code: code}})
	_, _ = w.Write(append(append([]byte("data: "), b...), '\n', '\n'))
}
