package extproc

import (
	"bytes"
	"encoding/json"
)

// maxEvent bounds one SSE event held while its end has not arrived: an OpenAI chunk is a few
// KiB; past this the watcher stops reading events (counted) and passes bytes through.
const maxEvent = 1 << 20

// watcher follows a response body as the gateway streams it: the first token (the first
// `data:` event carrying a choice for a stream, the whole body otherwise), the usage, an
// in-stream error, [DONE].
type watcher struct {
	stream  bool
	dropUse bool // drop the usage-only event (the picker asked for usage, not the client)

	pending   []byte // a stream's bytes after the last complete event
	whole     []byte // a non-streamed body, up to maxBody
	maxBody   int
	overflow  bool // an event or body past its bound: no more reading
	first     bool
	done      bool
	usage     *Usage
	engineErr string
}

// feed reads one body chunk. For a stream it returns what to pass on: the chunk itself, or,
// when usage chunks are dropped, the complete events minus the usage-only one (a partial event
// waits for its end). firstNow reports the chunk that carried the first token.
func (w *watcher) feed(chunk []byte, eos bool) (out []byte, firstNow bool) {
	if !w.stream {
		if !w.overflow {
			if len(w.whole)+len(chunk) > w.maxBody {
				w.overflow, w.whole = true, nil
			} else {
				w.whole = append(w.whole, chunk...)
			}
		}
		if eos {
			if !w.overflow {
				w.readWhole(w.whole)
			}
			w.whole = nil
			firstNow = !w.first
			w.first = true
		}
		return chunk, firstNow
	}
	if w.overflow {
		return chunk, false
	}
	w.pending = append(w.pending, chunk...)
	var kept []byte
	if w.dropUse {
		kept = make([]byte, 0, len(w.pending))
	}
	for {
		end := eventEnd(w.pending)
		if end < 0 {
			break
		}
		ev := w.pending[:end]
		keep, tok := w.event(ev)
		if tok && !w.first {
			w.first, firstNow = true, true
		}
		if w.dropUse && keep {
			kept = append(kept, ev...)
		}
		w.pending = w.pending[end:]
	}
	if len(w.pending) > maxEvent {
		w.overflow = true
		held := w.pending
		w.pending = nil
		if !w.dropUse {
			return chunk, firstNow
		}
		return append(kept, held...), firstNow
	}
	if eos && len(w.pending) > 0 {
		// The last event had no blank line after it: read it anyway.
		keep, tok := w.event(w.pending)
		if tok && !w.first {
			w.first, firstNow = true, true
		}
		if w.dropUse && keep {
			kept = append(kept, w.pending...)
		}
		w.pending = nil
	}
	if !w.dropUse {
		if len(w.pending) == 0 {
			w.pending = nil // nothing held: let the chunk's memory go
		} else {
			w.pending = append([]byte(nil), w.pending...)
		}
		return chunk, firstNow
	}
	w.pending = append([]byte(nil), w.pending...)
	return kept, firstNow
}

// eventEnd is the length of the first complete SSE event in b (through its blank line), -1
// when there is none.
func eventEnd(b []byte) int {
	i := bytes.Index(b, []byte("\n\n"))
	j := bytes.Index(b, []byte("\r\n\r\n"))
	switch {
	case i < 0 && j < 0:
		return -1
	case j < 0 || (i >= 0 && i < j):
		return i + 2
	}
	return j + 4
}

type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *usageJSON) usage() *Usage {
	out := &Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens}
	if d := u.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		out.CachedTokens, out.HasCached = *d.CachedTokens, true
	}
	return out
}

// answer is the part of an OpenAI answer (or stream chunk) the watcher reads.
type answer struct {
	Choices []json.RawMessage `json:"choices"`
	Usage   *usageJSON        `json:"usage"`
	Error   json.RawMessage   `json:"error"`
}

// event reads one SSE event: whether to pass it on (false only for a dropped usage-only
// chunk) and whether it carries a token.
func (w *watcher) event(ev []byte) (keep, token bool) {
	var data []byte
	for line := range bytes.Lines(ev) {
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = append(data, bytes.TrimSpace(d)...)
		}
	}
	if data == nil {
		return true, false
	}
	if bytes.Equal(data, []byte("[DONE]")) {
		w.done = true
		return true, false
	}
	var a answer
	if json.Unmarshal(data, &a) != nil {
		return true, false
	}
	if len(a.Error) > 0 && string(a.Error) != "null" {
		w.engineErr = errorMessage(a.Error)
		return true, false
	}
	if a.Usage != nil {
		w.usage = a.Usage.usage()
		if len(a.Choices) == 0 && w.dropUse {
			return false, false
		}
	}
	return true, len(a.Choices) > 0
}

// readWhole reads a non-streamed answer's usage.
func (w *watcher) readWhole(b []byte) {
	var a answer
	if json.Unmarshal(b, &a) != nil {
		return
	}
	if a.Usage != nil {
		w.usage = a.Usage.usage()
	}
	if len(a.Error) > 0 && string(a.Error) != "null" {
		w.engineErr = errorMessage(a.Error)
	}
	w.done = true
}

func errorMessage(raw json.RawMessage) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return e.Message
	}
	return string(raw)
}
