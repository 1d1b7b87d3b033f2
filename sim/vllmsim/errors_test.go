package vllmsim

import (
	"encoding/json"
	"strings"
	"testing"
)

// The refusals a client meets most, with vLLM's status, error.type, error.code and error.param:
// context too long and invalid sampling parameters are VLLMValidationError, answered 400
// BadRequestError with the field as param (OpenAIServing.create_error_response and
// _validate_input in vllm/entrypoints/openai/engine/serving.py, SamplingParams._verify_args in
// vllm/sampling_params.py); an unknown model is 404 NotFoundError, param "model"
// (OpenAIServing._check_model); a missing or wrong API key is the bare 401 {"error":"Unauthorized"}
// of vLLM's auth middleware. Streaming or not, these come before any header is sent.
func TestRefusalsAsVLLMSendsThem(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxModelLen = 100
	cfg.APIKeys = []string{"key"}
	s := startSim(t, cfg)
	chat := func(extra map[string]any) map[string]any {
		b := map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": "hi"}}}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	auth := []string{"Authorization", "Bearer key"}
	cases := []struct {
		name   string
		path   string
		body   any
		header []string
		status int
		typ    string
		param  any // nil is JSON null
		want   []string
	}{
		{"prompt fills the context", "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(0, 100)}, auth,
			400, "BadRequestError", "input_tokens", []string{"maximum context length is 100 tokens", "100 input tokens"}},
		{"prompt plus max_tokens too long", "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(0, 95), "max_tokens": 10}, auth,
			400, "BadRequestError", "max_tokens", []string{"'max_tokens' or 'max_completion_tokens' is too large: 10", "maximum context length is 100 tokens", "95 input tokens"}},
		{"stream too long", "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(0, 95), "max_tokens": 10, "stream": true}, auth,
			400, "BadRequestError", "max_tokens", []string{"too large: 10"}},
		{"chat max_completion_tokens too long", "/v1/chat/completions", chat(map[string]any{"max_completion_tokens": 200}), auth,
			400, "BadRequestError", "max_tokens", []string{"too large: 200"}},
		{"max_tokens zero", "/v1/completions", map[string]any{"model": "m", "prompt": "hi", "max_tokens": 0}, auth,
			400, "BadRequestError", "max_tokens", []string{"max_tokens must be at least 1, got 0.", "(parameter=max_tokens, value=0)"}},
		{"negative temperature", "/v1/chat/completions", chat(map[string]any{"temperature": -0.5}), auth,
			400, "BadRequestError", "temperature", []string{"temperature must be non-negative, got -0.5."}},
		{"temperature above 2", "/v1/completions", map[string]any{"model": "m", "prompt": "hi", "temperature": 3}, auth,
			400, "BadRequestError", "temperature", []string{"temperature must be in [0, 2], got 3.0."}},
		{"top_p zero", "/v1/completions", map[string]any{"model": "m", "prompt": "hi", "top_p": 0}, auth,
			400, "BadRequestError", "top_p", []string{"top_p must be in (0, 1], got 0.0."}},
		{"n zero", "/v1/completions", map[string]any{"model": "m", "prompt": "hi", "n": 0}, auth,
			400, "BadRequestError", nil, []string{"n must be at least 1, got 0."}},
		{"unknown model", "/v1/completions", map[string]any{"model": "nope", "prompt": "hi"}, auth,
			404, "NotFoundError", "model", []string{"The model `nope` does not exist."}},
		{"unknown model in chat", "/v1/chat/completions", map[string]any{"model": "nope", "messages": []map[string]string{{"role": "user", "content": "hi"}}, "stream": true}, auth,
			404, "NotFoundError", "model", []string{"`nope`"}},
	}
	for _, c := range cases {
		res := post(t, s, c.path, c.body, c.header...)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Param   any    `json:"param"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(res.body, &e); err != nil {
			t.Errorf("%s: status %d body %q: %v", c.name, res.status, res.body, err)
			continue
		}
		if res.status != c.status || e.Error.Code != c.status || e.Error.Type != c.typ || e.Error.Param != c.param {
			t.Errorf("%s: status %d body %s; want %d %s param %v", c.name, res.status, res.body, c.status, c.typ, c.param)
		}
		for _, w := range c.want {
			if !strings.Contains(e.Error.Message, w) {
				t.Errorf("%s: message %q lacks %q", c.name, e.Error.Message, w)
			}
		}
	}
	for _, h := range [][]string{nil, {"Authorization", "Bearer wrong"}} {
		res := post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": "hi"}, h...)
		if res.status != 401 || strings.TrimSpace(string(res.body)) != `{"error":"Unauthorized"}` {
			t.Errorf("key %v: %d %s", h, res.status, res.body)
		}
	}
	// A chat request without max_tokens gets what is left of the context, as vLLM's
	// get_max_tokens gives it, rather than a refusal.
	long := chat(nil)
	long["messages"] = []map[string]string{{"role": "user", "content": strings.Repeat("ab ", 52)}}
	res := post(t, s, "/v1/chat/completions", long, auth...)
	var u struct {
		Usage struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(res.body, &u); res.status != 200 || err != nil {
		t.Fatalf("chat without max_tokens near the context: %d %s", res.status, res.body)
	}
	if u.Usage.Prompt+16 <= 100 || u.Usage.Prompt+u.Usage.Completion > 100 {
		t.Errorf("prompt %d + completion %d: want a prompt within 16 of the context and no more than 100 in all", u.Usage.Prompt, u.Usage.Completion)
	}
}
