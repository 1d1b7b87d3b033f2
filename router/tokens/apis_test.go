package tokens

import (
	"encoding/json"
	"strings"
	"testing"
)

func chatOf(t *testing.T, kind Kind, body string) (*Request, map[string]any) {
	t.Helper()
	r, err := Parse(kind, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(r.ChatBody(), &m); err != nil {
		t.Fatalf("chat body %s: %v", r.ChatBody(), err)
	}
	return r, m
}

func TestResponsesRenderAsVLLMBuildsTheChat(t *testing.T) {
	r, m := chatOf(t, Responses, `{"model":"m","instructions":"be brief","input":"hi","stream":true}`)
	got, _ := json.Marshal(m["messages"])
	if string(got) != `[{"content":"be brief","role":"system"},{"content":"hi","role":"user"}]` || !r.Stream || !r.Store || r.Unkeyed != "" {
		t.Fatalf("messages %s stream %v store %v unkeyed %q", got, r.Stream, r.Store, r.Unkeyed)
	}
	_, m = chatOf(t, Responses, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"message","role":"assistant","content":"b"}]}`)
	got, _ = json.Marshal(m["messages"])
	if string(got) != `[{"content":[{"text":"a","type":"input_text"}],"role":"user"},{"content":"b","role":"assistant"}]` {
		t.Fatalf("items %s", got)
	}
	r, _ = chatOf(t, Responses, `{"model":"m","input":"more","previous_response_id":"resp_1","store":false}`)
	if r.PreviousResponseID != "resp_1" || r.Unkeyed != UnkeyedPreviousResponse || r.Store {
		t.Fatalf("follow-up %+v", r)
	}
	r, _ = chatOf(t, Responses, `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":"42"}]}`)
	if r.Unkeyed != UnkeyedResponsesItems {
		t.Fatalf("function output unkeyed %q", r.Unkeyed)
	}
	for _, bad := range []string{`{"model":"m"}`, `{"model":"m","input":7}`, `{"input":"x"}`} {
		if _, err := Parse(Responses, []byte(bad)); !IsBadRequest(err) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func TestMessagesRenderAsVLLMConvertsThem(t *testing.T) {
	r, m := chatOf(t, Messages, `{"model":"m","max_tokens":8,"system":[{"type":"text","text":"s1"},{"type":"text","text":"s2"}],
		"messages":[{"role":"user","content":"q"},
		{"role":"assistant","content":[{"type":"thinking","thinking":"hm"},{"type":"tool_use","id":"t1","name":"f","input":{"b":1,"a":"é"}}]},
		{"role":"user","content":[{"type":"tool_result","id":"t1","content":"42"},{"type":"text","text":"go on"}]}],
		"tools":[{"name":"f","input_schema":{"properties":{}}}]}`)
	if r.Unkeyed != "" {
		t.Fatalf("unkeyed %q", r.Unkeyed)
	}
	got, _ := json.Marshal(m["messages"])
	want := `[{"content":"s1s2","role":"system"},{"content":"q","role":"user"},` +
		`{"reasoning":"hm","role":"assistant","tool_calls":[{"function":{"arguments":"{\"b\": 1, \"a\": \"\\u00e9\"}","name":"f"},"id":"t1","type":"function"}]},` +
		`{"content":"42","role":"tool","tool_call_id":"t1"},{"content":"go on","role":"user"}]`
	if string(got) != want {
		t.Fatalf("messages\n%s\nwant\n%s", got, want)
	}
	tools, _ := json.Marshal(m["tools"])
	if string(tools) != `[{"function":{"description":null,"name":"f","parameters":{"properties":{},"type":"object"}},"type":"function"}]` || m["tool_choice"] != "auto" {
		t.Fatalf("tools %s choice %v", tools, m["tool_choice"])
	}
	r, _ = chatOf(t, Messages, `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result","id":"x","content":[{"type":"text","text":"a"}]}]}]}`)
	if r.Unkeyed != UnkeyedMessagesContent {
		t.Fatalf("list tool_result unkeyed %q", r.Unkeyed)
	}
}

func TestPyDumps(t *testing.T) {
	for in, want := range map[string]string{
		``: `{}`, `null`: `{}`, `{}`: `{}`, `{"z":[1,2.5,true,null],"a":{"k":"\n\"😀"}}`: `{"z": [1, 2.5, true, null], "a": {"k": "\n\"\ud83d\ude00"}}`,
	} {
		if got := pyDumps(json.RawMessage(in)); got != want {
			t.Errorf("pyDumps(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestPoolingNeedsNoModel(t *testing.T) {
	r, err := Parse(Pooling, []byte(`{"prompt":"x"}`))
	if err != nil || r.Unkeyed != UnkeyedPooling {
		t.Fatalf("%+v %v", r, err)
	}
}

// No Go type name reaches a client through a parse error.
func TestParseErrorsNameNoGoTypes(t *testing.T) {
	for _, body := range []string{`[1]`, `{"model":"m","messages":{"a":1}}`, `{"model":"m","messages":[{}],"stream_options":[1]}`, `{"model":`, `7`} {
		_, err := Parse(Chat, []byte(body))
		if err == nil {
			t.Errorf("%s: no error", body)
			continue
		}
		for _, leak := range []string{"Go value", "json.RawMessage", "map[", "[]", "struct"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("%s: %q names %q", body, err, leak)
			}
		}
	}
}

func TestSessionID(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m","prompt":"x","session_id":"s1"}`:                                  "s1",
		`{"model":"m","prompt":"x","vllm_xargs":{"session_id":"s2"}}`:                   "s2",
		`{"model":"m","prompt":"x","session_id":"s1","vllm_xargs":{"session_id":"s2"}}`: "s1",
		`{"model":"m","prompt":"x"}`:                                                    "",
	} {
		r, err := Parse(Completion, []byte(body))
		if err != nil || r.SessionID != want {
			t.Errorf("%s: %q %v", body, r.SessionID, err)
		}
	}
	if _, err := Parse(Completion, []byte(`{"model":"m","prompt":"x","session_id":7}`)); !IsBadRequest(err) {
		t.Errorf("numeric session_id: %v", err)
	}
}
