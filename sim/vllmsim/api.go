package vllmsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// apiError is an OpenAI-shaped error as vLLM writes it: {"error":{"message","type","param","code"}}
// (ErrorResponse/ErrorInfo in vllm/entrypoints/openai/engine/protocol.py; code is the HTTP status,
// param the offending request field or null).
type apiError struct {
	status int
	typ    string
	msg    string
	param  string // "" is null
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, a ...any) *apiError {
	return &apiError{http.StatusBadRequest, "BadRequestError", fmt.Sprintf(format, a...), ""}
}

// invalidParam is vLLM's VLLMValidationError as OpenAIServing.create_error_response answers it
// (vllm/entrypoints/openai/engine/serving.py): 400 BadRequestError with param set to the field,
// the message suffixed "(parameter=P, value=V)" (vllm/exceptions.py), as live servers send it.
func invalidParam(param string, value any, format string, a ...any) *apiError {
	return &apiError{http.StatusBadRequest, "BadRequestError",
		fmt.Sprintf(format, a...) + fmt.Sprintf(" (parameter=%s, value=%s)", param, pyRepr(value)), param}
}

// pyRepr formats a number as Python's str() does (a float always has a point: 3.0).
func pyRepr(v any) string {
	if f, ok := v.(float64); ok {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsAny(s, ".eEnN") {
			s += ".0"
		}
		return s
	}
	return fmt.Sprint(v)
}

// body is the error object vLLM writes, as a response body or an in-stream event.
func (e *apiError) body() map[string]any {
	var param any
	if e.param != "" {
		param = e.param
	}
	return map[string]any{"error": map[string]any{"message": e.msg, "type": e.typ, "param": param, "code": e.status}}
}

func writeError(w http.ResponseWriter, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{http.StatusInternalServerError, "InternalServerError", err.Error(), ""}
	}
	writeJSON(w, ae.status, ae.body())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeBody reads a JSON object body; bad JSON is a 400 like vLLM's validation errors.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<20)
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// commonParams are the request fields completions and chat share.
type commonParams struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	N             *int            `json:"n"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	CacheSalt     *string         `json:"cache_salt"`
	Seed          *int64          `json:"seed"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	VLLMXArgs     json.RawMessage `json:"vllm_xargs"`
	Priority      int             `json:"priority"`
	// KVTransferParams drive the P/D connector (pd.go); ignored without --kv-transfer-config.
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
}

type completionRequest struct {
	commonParams
	Prompt json.RawMessage `json:"prompt"`
}

type chatRequest struct {
	commonParams
	Messages             []chatMessage `json:"messages"`
	MaxCompletionTokens  *int          `json:"max_completion_tokens"`
	AddGenerationPrompt  *bool         `json:"add_generation_prompt"`
	ContinueFinalMessage bool          `json:"continue_final_message"`
}

// parsePrompts accepts what vLLM's CompletionRequest.prompt accepts: a string, a list of
// strings, a list of token ids, or a list of token-id lists.
func parsePrompts(raw json.RawMessage) ([][]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return [][]uint32{Tokenize(s)}, nil
	}
	var strs []string
	if json.Unmarshal(raw, &strs) == nil && len(strs) > 0 {
		out := make([][]uint32, len(strs))
		for i, s := range strs {
			out[i] = Tokenize(s)
		}
		return out, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		t, err := toTokenIDs(ids)
		return [][]uint32{t}, err
	}
	var lists [][]int64
	if json.Unmarshal(raw, &lists) == nil && len(lists) > 0 {
		out := make([][]uint32, len(lists))
		for i, l := range lists {
			t, err := toTokenIDs(l)
			if err != nil {
				return nil, err
			}
			out[i] = t
		}
		return out, nil
	}
	return nil, badRequest("prompt must be a string, a list of strings, a list of token ids or a list of token-id lists")
}

func toTokenIDs(ids []int64) ([]uint32, error) {
	out := make([]uint32, len(ids))
	for i, v := range ids {
		if v < 0 || v >= VocabSize {
			return nil, badRequest("token id %d at position %d is out of vocabulary (size %d)", v, i, VocabSize)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

// reportMode reads vllm_xargs.kv_cache_report_mode ("incremental" by default, or "full").
func reportMode(raw json.RawMessage) (full bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return false, nil
	}
	var xargs map[string]json.RawMessage
	if err := json.Unmarshal(raw, &xargs); err != nil {
		return false, badRequest("vllm_xargs must be an object")
	}
	v, ok := xargs["kv_cache_report_mode"]
	if !ok {
		return false, nil
	}
	var mode string
	if json.Unmarshal(v, &mode) != nil || (mode != "incremental" && mode != "full") {
		return false, badRequest("vllm_xargs.kv_cache_report_mode must be \"incremental\" or \"full\", got %s", v)
	}
	return mode == "full", nil
}

// pinnedRank reads vLLM's X-data-parallel-rank header; -1 when absent.
func pinnedRank(r *http.Request, ranks int) (int, error) {
	h := r.Header.Get("X-data-parallel-rank")
	if h == "" {
		return -1, nil
	}
	v, err := strconv.Atoi(h)
	if err != nil || v < 0 || v >= ranks {
		return 0, badRequest("X-data-parallel-rank %q is not a rank in 0..%d", h, ranks-1)
	}
	return v, nil
}
