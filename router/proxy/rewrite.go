package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Rewrite is what the router changes in a body before forwarding.
type Rewrite struct {
	// IncludeUsage sets stream_options.include_usage (the client did not ask, the router wants
	// the engine's cached_tokens).
	IncludeUsage bool
	// FullReport sets vllm_xargs.kv_cache_report_mode = "full" (re-announce prefix hits as
	// BlockStored, so the index learns recency).
	FullReport bool
	// PinIncremental sets a client's vllm_xargs.kv_cache_report_mode back to vLLM's default,
	// "incremental" (vllm/v1/request.py reads the mode from the request's extra args; only "full"
	// re-announces prefix hits), when the router does not run full mode itself. Outside full mode
	// the router's index counts every BlockStored as one physical copy (vLLM's event contract),
	// so re-announced hits would be copies that no BlockRemoved ever balances: blocks the index
	// would keep after the engine evicted them. A body that names no mode is left alone.
	PinIncremental bool
}

// reportModeKey is the vllm_xargs key that selects vLLM's kv_cache_report_mode.
const reportModeKey = "kv_cache_report_mode"

// Empty reports whether the rewrite changes nothing.
func (r Rewrite) Empty() bool { return !r.IncludeUsage && !r.FullReport && !r.PinIncremental }

// ClientReportMode returns the raw JSON value of the body's vllm_xargs.kv_cache_report_mode, or
// "" when the body names none (or is not a JSON object).
func ClientReportMode(body []byte) string {
	if !bytes.Contains(body, []byte(reportModeKey)) {
		return ""
	}
	start, end, err := findKey(body, "vllm_xargs")
	if err != nil || start < 0 {
		return ""
	}
	xs, xe, err := findKey(body[start:end], reportModeKey)
	if err != nil || xs < 0 {
		return ""
	}
	return string(bytes.TrimSpace(body[start+xs : start+xe]))
}

// OverridesClientMode reports whether Apply changes the client's own kv_cache_report_mode.
func (r Rewrite) OverridesClientMode(body []byte) bool {
	if r.FullReport || !r.PinIncremental {
		return false
	}
	m := ClientReportMode(body)
	return m != "" && m != `"incremental"`
}

// Apply returns body with the rewrite spliced in: the keys it sets are replaced or appended in
// place and every other byte (key order, spacing, numbers as written) is the client's; the body
// is never re-encoded. An empty rewrite returns body itself.
func (r Rewrite) Apply(body []byte) ([]byte, error) {
	if r.Empty() {
		return body, nil
	}
	var err error
	if r.IncludeUsage {
		if body, err = setNested(body, "stream_options", "include_usage", []byte("true")); err != nil {
			return nil, fmt.Errorf("proxy: stream_options: %w", err)
		}
	}
	if r.FullReport {
		if body, err = setNested(body, "vllm_xargs", "kv_cache_report_mode", []byte(`"full"`)); err != nil {
			return nil, fmt.Errorf("proxy: vllm_xargs: %w", err)
		}
	} else if r.OverridesClientMode(body) {
		if body, err = setNested(body, "vllm_xargs", reportModeKey, []byte(`"incremental"`)); err != nil {
			return nil, fmt.Errorf("proxy: vllm_xargs: %w", err)
		}
	}
	return body, nil
}

// setNested sets obj[outer][inner] = val, creating obj[outer] when it is absent or null.
func setNested(obj []byte, outer, inner string, val []byte) ([]byte, error) {
	start, end, err := findKey(obj, outer)
	if err != nil {
		return nil, err
	}
	nested := []byte("{}")
	if start >= 0 && string(bytes.TrimSpace(obj[start:end])) != "null" {
		nested = obj[start:end]
	}
	nested, err = setKey(nested, inner, val)
	if err != nil {
		return nil, err
	}
	return setKey(obj, outer, nested)
}

// setKey returns the JSON object obj with key's value replaced by val (its last occurrence,
// the one a JSON reader keeps), or key appended when absent; every other byte is kept.
func setKey(obj []byte, key string, val []byte) ([]byte, error) {
	start, end, err := findKey(obj, key)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(obj)+len(key)+len(val)+4)
	if start >= 0 {
		out = append(append(append(out, obj[:start]...), val...), obj[end:]...)
		return out, nil
	}
	k, _ := json.Marshal(key)
	closing := bytes.LastIndexByte(obj, '}')
	head := bytes.TrimRight(obj[:closing], " \t\r\n")
	out = append(out, head...)
	if head[len(head)-1] != '{' {
		out = append(out, ',')
	}
	out = append(append(append(append(out, k...), ':'), val...), obj[closing:]...)
	return out, nil
}

var errNotObject = errors.New("not a JSON object")

// findKey returns the byte range of the value of the last top-level key named key in the JSON
// object obj, or -1, -1 when absent.
func findKey(obj []byte, key string) (int, int, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return 0, 0, errNotObject
	}
	start, end := -1, -1
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return 0, 0, err
		}
		k, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return 0, 0, err
		}
		if k == key {
			end = int(dec.InputOffset())
			start = end - len(raw)
		}
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return 0, 0, errNotObject
	}
	if _, err := dec.Token(); err != io.EOF {
		return 0, 0, errors.New("trailing data after the JSON object")
	}
	return start, end, nil
}
