package extproc

import (
	"bytes"
	"testing"
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
