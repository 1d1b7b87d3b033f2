package extproc

import (
	"bytes"
	"testing"

	"github.com/kvroute/kvroute/router/proxy"
)

func TestWatcherReadsEventsSplitAnywhere(t *testing.T) {
	stream := "data: {\"choices\":[]}\r\n\r\n: ping\n\ndata: {\"choices\":[{\"delta\":{}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n"
	for _, drop := range []bool{false, true} {
		for cut := 1; cut < len(stream); cut++ {
			w := watcher{stream: true, dropUse: drop}
			a, firstA := w.feed([]byte(stream[:cut]), false)
			b, firstB := w.feed([]byte(stream[cut:]), true)
			out := string(a) + string(b)
			if !w.done || w.usage == nil || w.usage.CachedTokens != 8 || !w.usage.HasCached {
				t.Fatalf("drop %v cut %d: done %v usage %+v", drop, cut, w.done, w.usage)
			}
			if firstA == firstB {
				t.Fatalf("drop %v cut %d: the first token must be seen exactly once (%v %v)", drop, cut, firstA, firstB)
			}
			firstAt := bytes.Index([]byte(stream), []byte("delta"))
			if firstA != (cut > firstAt && cut >= bytes.Index([]byte(stream), []byte("}]}\n\n"))+5) {
				t.Fatalf("drop %v cut %d: first token in the first piece %v", drop, cut, firstA)
			}
			hasUsage := bytes.Contains([]byte(out), []byte(`"usage"`))
			if hasUsage == drop {
				t.Fatalf("drop %v cut %d: usage chunk passed on %v:\n%s", drop, cut, hasUsage, out)
			}
		}
	}
}

func TestWatcherBoundsAnEventWithoutEnd(t *testing.T) {
	w := watcher{stream: true}
	big := bytes.Repeat([]byte("x"), maxEvent+1)
	out, _ := w.feed(append([]byte("data: "), big...), false)
	if len(out) != maxEvent+7 || !w.overflow || w.pending != nil {
		t.Fatalf("overflow %v pending %d out %d", w.overflow, len(w.pending), len(out))
	}
}

func TestWatcherWholeAnswer(t *testing.T) {
	w := watcher{maxBody: 1 << 20}
	body := []byte(`{"choices":[{"message":{}}],"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`)
	_, f1 := w.feed(body[:10], false)
	_, f2 := w.feed(body[10:], true)
	if f1 || !f2 || w.usage == nil || !w.usage.HasCached || w.usage.PromptTokens != 5 {
		t.Fatalf("first %v %v usage %+v", f1, f2, w.usage)
	}
}

// The watcher reads the Responses and Messages APIs' typed events as the proxy does: the first
// delta is the first token, the usage (Messages: input in message_start, output in
// message_delta) merged, the end at response.completed / message_stop, the response id.
func TestWatcherReadsTypedAPIs(t *testing.T) {
	responses := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":9,\"output_tokens\":1,\"input_tokens_details\":{\"cached_tokens\":8}}}}\n\n"
	messages := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"cache_read_input_tokens\":8}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"a\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":1}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	for _, c := range []struct {
		api    proxy.API
		stream string
		id     string
	}{{proxy.APIResponses, responses, "resp_1"}, {proxy.APIMessages, messages, ""}} {
		w := watcher{stream: true, api: c.api}
		firstAt := bytes.Index([]byte(c.stream), []byte("delta\n"))
		for cut := 1; cut < len(c.stream); cut += 7 {
			w = watcher{stream: true, api: c.api}
			_, f1 := w.feed([]byte(c.stream[:cut]), false)
			_, f2 := w.feed([]byte(c.stream[cut:]), true)
			if f1 == f2 || (f1 && cut < firstAt) {
				t.Fatalf("api %d cut %d: first token %v %v", c.api, cut, f1, f2)
			}
			u := w.usage
			if !w.done || u == nil || u.PromptTokens != 9 || u.CachedTokens != 8 || u.CompletionTokens != 1 || w.responseID != c.id {
				t.Fatalf("api %d cut %d: done %v usage %+v id %q", c.api, cut, w.done, u, w.responseID)
			}
		}
	}
	w := watcher{api: proxy.APIResponses, maxBody: 1 << 20}
	w.feed([]byte(`{"id":"resp_2","usage":{"input_tokens":4,"output_tokens":1,"input_tokens_details":{"cached_tokens":0}}}`), true)
	if w.responseID != "resp_2" || w.usage == nil || !w.usage.HasCached || w.usage.PromptTokens != 4 {
		t.Fatalf("whole Responses answer: id %q usage %+v", w.responseID, w.usage)
	}
}
