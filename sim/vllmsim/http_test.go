package vllmsim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestCompletionTextPrompt(t *testing.T) {
	s := startSim(t, fastConfig())
	res := post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": "hello world", "max_tokens": 5})
	if res.status != http.StatusOK {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	c := decodeJSON[completionResponse](t, res)
	if c.Object != "text_completion" || c.Model != "m" || len(c.Choices) != 1 {
		t.Fatalf("unexpected response %s", res.body)
	}
	if got := Tokenize(c.Choices[0].Text); len(got) != 5 {
		t.Errorf("text %q re-tokenizes to %d tokens, want 5", c.Choices[0].Text, len(got))
	}
	if c.Choices[0].FinishReason == nil || *c.Choices[0].FinishReason != "length" {
		t.Errorf("finish_reason = %v, want length", c.Choices[0].FinishReason)
	}
	wantPrompt := len(Tokenize("hello world"))
	if c.Usage == nil || c.Usage.PromptTokens != wantPrompt || c.Usage.CompletionTokens != 5 || c.Usage.TotalTokens != wantPrompt+5 {
		t.Errorf("usage = %+v, want prompt %d completion 5", c.Usage, wantPrompt)
	}
}

func TestCompletionTokenPromptsAndN(t *testing.T) {
	s := startSim(t, fastConfig())
	res := post(t, s, "/v1/completions", map[string]any{"model": "m",
		"prompt": [][]int{{1, 2, 3}, {4, 5, 6, 7}}, "max_tokens": 3, "n": 2})
	c := decodeJSON[completionResponse](t, res)
	if res.status != http.StatusOK || len(c.Choices) != 4 {
		t.Fatalf("status %d, %d choices: %s", res.status, len(c.Choices), res.body)
	}
	for i, ch := range c.Choices {
		if ch.Index != i {
			t.Errorf("choice %d has index %d", i, ch.Index)
		}
	}
	// Each prompt counts once however many choices it has.
	if c.Usage.PromptTokens != 7 || c.Usage.CompletionTokens != 12 {
		t.Errorf("usage %+v, want prompt 7 completion 12", c.Usage)
	}
	// Same prompt, same choice: same text; a different choice gives different text.
	again := decodeJSON[completionResponse](t, post(t, s, "/v1/completions", map[string]any{"model": "m",
		"prompt": []int{1, 2, 3}, "max_tokens": 3, "n": 2}))
	if again.Choices[0].Text != c.Choices[0].Text || again.Choices[0].Text == again.Choices[1].Text {
		t.Errorf("generated text not deterministic per choice: %q %q vs %q", again.Choices[0].Text, again.Choices[1].Text, c.Choices[0].Text)
	}
}

func TestChatCompletion(t *testing.T) {
	s := startSim(t, fastConfig())
	msgs := []map[string]any{{"role": "system", "content": "be brief"},
		{"role": "user", "content": []map[string]string{{"type": "text", "text": "hi"}}}}
	res := post(t, s, "/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_tokens": 4})
	c := decodeJSON[completionResponse](t, res)
	if res.status != http.StatusOK || c.Object != "chat.completion" || c.Choices[0].Message == nil ||
		c.Choices[0].Message.Role != "assistant" {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	want := len(Tokenize("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"))
	if c.Usage.PromptTokens != want || c.Usage.CompletionTokens != 4 {
		t.Errorf("usage %+v, want prompt %d (ChatML template) and 4 completion tokens", c.Usage, want)
	}
	// The chat render endpoint gives the very tokens the completion was charged for.
	rr := post(t, s, "/v1/chat/completions/render", map[string]any{"model": "m", "messages": msgs})
	gen := decodeJSON[struct {
		TokenIDs []uint32 `json:"token_ids"`
		Model    string   `json:"model"`
	}](t, rr)
	if len(gen.TokenIDs) != want || gen.Model != "m" {
		t.Errorf("render gave %d tokens for model %q, want %d", len(gen.TokenIDs), gen.Model, want)
	}
	tk := decodeJSON[struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}](t, post(t, s, "/tokenize", map[string]any{"model": "m", "messages": msgs}))
	if tk.Count != want || !equalTokens(tk.Tokens, gen.TokenIDs) {
		t.Errorf("/tokenize chat form gave %d tokens, render %d", tk.Count, len(gen.TokenIDs))
	}
}

func equalTokens(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestStreamingWithUsage(t *testing.T) {
	s := startSim(t, fastConfig())
	for _, chat := range []bool{false, true} {
		path, body := "/v1/completions", map[string]any{"model": "m", "prompt": "abcdefgh", "max_tokens": 6,
			"stream": true, "stream_options": map[string]any{"include_usage": true}}
		if chat {
			path = "/v1/chat/completions"
			delete(body, "prompt")
			body["messages"] = []map[string]any{{"role": "user", "content": "abcdefgh"}}
		}
		res := post(t, s, path, body)
		if res.status != http.StatusOK || !strings.HasPrefix(res.header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("chat=%v: status %d type %q", chat, res.status, res.header.Get("Content-Type"))
		}
		evs := sseEvents(t, res.body)
		if evs[len(evs)-1] != "[DONE]" {
			t.Fatalf("chat=%v: last event %q, want [DONE]", chat, evs[len(evs)-1])
		}
		var text strings.Builder
		finishes := 0
		for _, e := range evs[:len(evs)-2] {
			var c completionResponse
			if err := json.Unmarshal([]byte(e), &c); err != nil {
				t.Fatal(err)
			}
			if len(c.Choices) != 1 || c.Usage != nil {
				t.Fatalf("chat=%v: content chunk %s", chat, e)
			}
			text.WriteString(c.Choices[0].Text + c.Choices[0].Delta["content"])
			if c.Choices[0].FinishReason != nil {
				finishes++
			}
		}
		var last completionResponse
		if err := json.Unmarshal([]byte(evs[len(evs)-2]), &last); err != nil {
			t.Fatal(err)
		}
		if len(last.Choices) != 0 || last.Usage == nil || last.Usage.CompletionTokens != 6 {
			t.Errorf("chat=%v: final chunk %s, want usage only with 6 completion tokens", chat, evs[len(evs)-2])
		}
		if finishes != 1 || len(Tokenize(text.String())) != 6 {
			t.Errorf("chat=%v: %d finish chunks, streamed text %q", chat, finishes, text.String())
		}
		if chat {
			var first completionResponse
			_ = json.Unmarshal([]byte(evs[0]), &first)
			if first.Choices[0].Delta["role"] != "assistant" {
				t.Errorf("first chat chunk %s has no assistant role", evs[0])
			}
		}
	}
}

func TestErrorsAreOpenAIShaped(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxModelLen = 100
	s := startSim(t, cfg)
	cases := []struct {
		name   string
		path   string
		body   any
		status int
		want   string
	}{
		{"bad json", "/v1/completions", `{"prompt": `, 400, "invalid JSON"},
		{"unknown model", "/v1/completions", map[string]any{"model": "nope", "prompt": "x"}, 404, "does not exist"},
		{"out of vocabulary", "/v1/completions", map[string]any{"model": "m", "prompt": []int{1, VocabSize}}, 400, "out of vocabulary"},
		{"negative id", "/v1/completions", map[string]any{"model": "m", "prompt": []int{-1}}, 400, "out of vocabulary"},
		{"too long", "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(0, 95), "max_tokens": 10}, 400, "maximum context length is 100"},
		{"empty prompt", "/v1/completions", map[string]any{"model": "m", "prompt": ""}, 400, "empty"},
		{"bad report mode", "/v1/completions", map[string]any{"model": "m", "prompt": "x", "vllm_xargs": map[string]any{"kv_cache_report_mode": "all"}}, 400, "kv_cache_report_mode"},
		{"chat bad json", "/v1/chat/completions", `[]`, 400, "invalid JSON"},
		{"detokenize oov", "/detokenize", map[string]any{"tokens": []int{VocabSize + 1}}, 400, "out of vocabulary"},
	}
	for _, c := range cases {
		res := post(t, s, c.path, c.body)
		e := decodeJSON[errorBody](t, res)
		if res.status != c.status || e.Error.Code != c.status || e.Error.Type == "" || !strings.Contains(e.Error.Message, c.want) {
			t.Errorf("%s: status %d body %s; want %d with %q", c.name, res.status, res.body, c.status, c.want)
		}
	}
	res := post(t, s, "/v1/completions", map[string]any{"model": "m", "prompt": "x"}, "X-data-parallel-rank", "3")
	if res.status != 400 {
		t.Errorf("rank 3 of 1: status %d, want 400", res.status)
	}
}

func TestTokenizeDetokenizeModelsHealth(t *testing.T) {
	s := startSim(t, fastConfig())
	tk := decodeJSON[struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}](t, post(t, s, "/tokenize", map[string]any{"model": "m", "prompt": "hello <|im_end|>!", "return_token_strs": true}))
	if tk.Count != len(tk.Tokens) || tk.MaxModelLen != 131072 || len(tk.TokenStrs) != tk.Count {
		t.Fatalf("tokenize: %+v", tk)
	}
	dt := decodeJSON[struct {
		Prompt string `json:"prompt"`
	}](t, post(t, s, "/detokenize", map[string]any{"model": "m", "tokens": tk.Tokens}))
	if dt.Prompt != "hello <|im_end|>!" {
		t.Errorf("detokenize gave %q", dt.Prompt)
	}
	models := decodeJSON[struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}](t, get(t, s, "/v1/models"))
	if models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "m" {
		t.Errorf("models: %+v", models)
	}
	if r := get(t, s, "/health"); r.status != 200 {
		t.Errorf("health: %d", r.status)
	}
	rr := post(t, s, "/v1/completions/render", map[string]any{"model": "m", "prompt": []string{"ab", "cd"}})
	gens := decodeJSON[[]struct {
		TokenIDs []uint32 `json:"token_ids"`
	}](t, rr)
	if len(gens) != 2 || !equalTokens(gens[0].TokenIDs, Tokenize("ab")) || !equalTokens(gens[1].TokenIDs, Tokenize("cd")) {
		t.Errorf("completions render: %s", rr.body)
	}
}
