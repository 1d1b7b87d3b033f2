package extproc

import (
	"bytes"

	"github.com/kvroute/kvroute/router/proxy"
)

// maxEvent bounds one SSE event held while its end has not arrived: an OpenAI chunk is a few
// KiB; past this the watcher stops reading events (counted) and passes bytes through.
const maxEvent = 1 << 20

// watcher follows a response body as the gateway streams it: the first token (the first
// event carrying a token for a stream, the whole body otherwise), the usage, an in-stream
// error, the end, a Responses answer's id; in the request's API dialect, read as the proxy
// reads it.
type watcher struct {
	stream  bool
	api     proxy.API // the answer's dialect
	dropUse bool      // drop the usage-only event (the picker asked for usage, not the client)

	pending    []byte // a stream's bytes after the last complete event
	whole      []byte // a non-streamed body, up to maxBody
	maxBody    int
	overflow   bool // an event or body past its bound: no more reading
	first      bool
	done       bool
	usage      *Usage
	engineErr  string
	responseID string // a Responses answer's id
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

// event reads one SSE event (proxy.ReadEvent, the proxy's own reader): whether to pass it on
// (false only for a dropped usage-only chunk) and whether it carries a token.
func (w *watcher) event(ev []byte) (keep, token bool) {
	e := proxy.ReadEvent(ev, w.api)
	if e.ResponseID != "" && w.responseID == "" {
		w.responseID = e.ResponseID
	}
	if e.Usage != nil {
		w.usage = proxy.MergeUsage(w.usage, e.Usage)
	}
	switch {
	case e.Error != "":
		w.engineErr = e.Error
	case e.Done:
		w.done = true
	case w.dropUse && e.UsageOnly:
		return false, false
	}
	return true, e.Token
}

// readWhole reads a non-streamed answer (proxy.ReadAnswer).
func (w *watcher) readWhole(b []byte) {
	u, id, msg := proxy.ReadAnswer(b, w.api)
	if u != nil {
		w.usage = u
	}
	w.responseID, w.engineErr = id, msg
	w.done = true
}
