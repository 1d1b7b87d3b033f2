package proxy

import (
	"encoding/json"
	"fmt"
)

// Rewrite is what the router changes in a body before forwarding.
type Rewrite struct {
	// IncludeUsage sets stream_options.include_usage (the client did not ask, the router wants
	// the engine's cached_tokens).
	IncludeUsage bool
	// FullReport sets vllm_xargs.kv_cache_report_mode = "full" (re-announce prefix hits as
	// BlockStored, so the index learns recency).
	FullReport bool
}

// Empty reports whether the rewrite changes nothing.
func (r Rewrite) Empty() bool { return !r.IncludeUsage && !r.FullReport }

// Apply returns body with the rewrite merged in; other fields keep their bytes (top-level key
// order may change, which JSON readers ignore). An empty rewrite returns body itself.
func (r Rewrite) Apply(body []byte) ([]byte, error) {
	if r.Empty() {
		return body, nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("proxy: rewrite: %w", err)
	}
	if r.IncludeUsage {
		v, err := merge(top["stream_options"], "include_usage", true)
		if err != nil {
			return nil, fmt.Errorf("proxy: stream_options: %w", err)
		}
		top["stream_options"] = v
	}
	if r.FullReport {
		v, err := merge(top["vllm_xargs"], "kv_cache_report_mode", "full")
		if err != nil {
			return nil, fmt.Errorf("proxy: vllm_xargs: %w", err)
		}
		top["vllm_xargs"] = v
	}
	return json.Marshal(top)
}

func merge(raw json.RawMessage, key string, val any) (json.RawMessage, error) {
	obj := map[string]json.RawMessage{}
	if len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, err
		}
	}
	b, _ := json.Marshal(val)
	obj[key] = b
	return json.Marshal(obj)
}
