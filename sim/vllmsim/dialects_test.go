package vllmsim

import (
	"encoding/json"
	"strings"
	"testing"
)

// The Responses API: a stored answer is kept in this simulator's memory; a follow-up naming it
// continues its conversation (the prompt grows by the previous turn), another simulator
// answers 404 as vLLM does, GET returns it, cancel of a synchronous one is refused.
func TestResponsesStoreAndFollowUp(t *testing.T) {
	a, b := startSim(t, fastConfig()), startSim(t, fastConfig())
	r := post(t, a, "/v1/responses", map[string]any{"model": "m", "instructions": "be brief", "input": "hello there", "max_output_tokens": 4})
	first := decodeJSON[struct {
		ID     string `json:"id"`
		Object string `json:"object"`
		Status string `json:"status"`
		Usage  struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}](t, r)
	if r.status != 200 || !strings.HasPrefix(first.ID, "resp") || first.Object != "response" || first.Usage.OutputTokens != 4 {
		t.Fatalf("first %d %s", r.status, r.body)
	}
	follow := map[string]any{"model": "m", "input": "and then?", "previous_response_id": first.ID, "max_output_tokens": 2}
	r = post(t, a, "/v1/responses", follow)
	second := decodeJSON[struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
	}](t, r)
	if r.status != 200 || second.Usage.InputTokens <= first.Usage.InputTokens {
		t.Fatalf("follow-up %d %s (first had %d input tokens)", r.status, r.body, first.Usage.InputTokens)
	}
	r = post(t, b, "/v1/responses", follow)
	e := decodeJSON[struct {
		Error struct {
			Type  string `json:"type"`
			Param string `json:"param"`
			Code  int    `json:"code"`
		} `json:"error"`
	}](t, r)
	if r.status != 404 || e.Error.Type != "invalid_request_error" || e.Error.Param != "response_id" || e.Error.Code != 404 {
		t.Fatalf("other simulator %d %s", r.status, r.body)
	}
	if r = get(t, a, "/v1/responses/"+first.ID); r.status != 200 || !strings.Contains(string(r.body), first.ID) {
		t.Fatalf("GET %d %s", r.status, r.body)
	}
	if r = post(t, a, "/v1/responses/"+first.ID+"/cancel", ""); r.status != 400 {
		t.Fatalf("cancel %d %s", r.status, r.body)
	}
	// store: false keeps nothing.
	r = post(t, a, "/v1/responses", map[string]any{"model": "m", "input": "x", "store": false, "max_output_tokens": 1})
	id := decodeJSON[struct{ ID string }](t, r).ID
	if r = get(t, a, "/v1/responses/"+id); r.status != 404 {
		t.Fatalf("unstored GET %d", r.status)
	}
}

func TestResponsesStream(t *testing.T) {
	s := startSim(t, fastConfig())
	r := post(t, s, "/v1/responses", map[string]any{"model": "m", "input": "stream me", "stream": true, "max_output_tokens": 3})
	body := string(r.body)
	for _, want := range []string{"event: response.created\n", "event: response.output_text.delta\n", "event: response.completed\n", `"input_tokens_details":{"cached_tokens":`} {
		if !strings.Contains(body, want) {
			t.Fatalf("stream lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "[DONE]") || strings.Index(body, "response.created") > strings.Index(body, "output_text.delta") {
		t.Fatalf("stream order or end:\n%s", body)
	}
	var id string
	for _, line := range strings.Split(body, "\n") {
		ev, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var e struct {
			Type     string              `json:"type"`
			Response struct{ ID string } `json:"response"`
		}
		if json.Unmarshal([]byte(ev), &e) == nil && e.Type == "response.completed" {
			id = e.Response.ID
		}
	}
	if r = get(t, s, "/v1/responses/"+id); r.status != 200 {
		t.Fatalf("a streamed answer is stored too: GET %s %d", id, r.status)
	}
}

func TestMessagesAPI(t *testing.T) {
	s := startSim(t, fastConfig())
	r := post(t, s, "/v1/messages", map[string]any{"model": "m", "max_tokens": 3, "system": "sys",
		"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "hi"}}}}})
	m := decodeJSON[struct {
		Type  string `json:"type"`
		Usage struct {
			InputTokens, OutputTokens int
		} `json:"usage"`
	}](t, r)
	if r.status != 200 || m.Type != "message" {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// The prompt is the chat render of the converted messages.
	want := len(Tokenize("<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"))
	if !strings.Contains(string(r.body), `"input_tokens":`+itoa(want)) {
		t.Fatalf("input tokens, want %d: %s", want, r.body)
	}
	r = post(t, s, "/v1/messages", map[string]any{"model": "m", "max_tokens": 2, "stream": true,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	body := string(r.body)
	for _, want := range []string{"event: message_start\n", "event: content_block_delta\n", "event: message_delta\n", "event: message_stop\n", "data: [DONE]"} {
		if !strings.Contains(body, want) {
			t.Fatalf("stream lacks %q:\n%s", want, body)
		}
	}
	r = post(t, s, "/v1/messages", map[string]any{"model": "nope", "max_tokens": 2, "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	ae := decodeJSON[struct {
		Type  string `json:"type"`
		Error struct {
			Type, Message string
		} `json:"error"`
	}](t, r)
	if r.status != 404 || ae.Type != "error" || ae.Error.Type != "NotFoundError" || ae.Error.Message == "" {
		t.Fatalf("error shape %d %s", r.status, r.body)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
