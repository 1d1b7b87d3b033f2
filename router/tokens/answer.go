package tokens

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"

	jsoniter "github.com/json-iterator/go"
)

// An engine's render answer is the largest JSON the router reads on a request's path (a
// 100k-token prompt is about 700 kB of ids), so it is read with json-iterator's streaming
// iterator: the ids go straight into the []uint32 the router keeps, without encoding/json's
// reflection per element, and every other field is skipped. What it accepts and refuses is what
// decoding into a struct of []int64 did: ids must be integers in 0..2^32-1; the key's name
// matches case-insensitively, its last occurrence wins; null or no ids is an error.

// maxRenderBytes bounds a render answer (a 1M-token prompt is about 8 MB of JSON).
const maxRenderBytes = 64 << 20

// answerBufs recycles the buffers answers are read into (the ids are copied out of them).
var answerBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledAnswer is the largest buffer kept for reuse: a rare huge prompt's buffer is left to
// the collector rather than held.
const maxPooledAnswer = 4 << 20

// readAnswer reads an engine's answer body, at most maxRenderBytes, into a pooled buffer; the
// caller returns it with putAnswer.
func readAnswer(r io.Reader, size int64) (*bytes.Buffer, error) {
	b := answerBufs.Get().(*bytes.Buffer)
	b.Reset()
	if size > 0 && size <= maxRenderBytes {
		b.Grow(int(size) + bytes.MinRead)
	}
	if _, err := b.ReadFrom(io.LimitReader(r, maxRenderBytes+1)); err != nil {
		putAnswer(b)
		return nil, err
	}
	if b.Len() > maxRenderBytes {
		putAnswer(b)
		return nil, fmt.Errorf("answer over %d bytes", maxRenderBytes)
	}
	return b, nil
}

func putAnswer(b *bytes.Buffer) {
	if b.Cap() <= maxPooledAnswer {
		answerBufs.Put(b)
	}
}

// badAnswer is an answer that does not decode.
type badAnswer struct{ error }

func (b badAnswer) Unwrap() error { return b.error }

var errNoIDs = errors.New("tokens: the engine returned no token ids")

// errNoPrompt is a completions render answering an empty list.
var errNoPrompt = errors.New("tokens: completions render returned no prompt")

// engineIDs returns the token ids under key in an engine's answer: an object's (a chat render,
// /tokenize) or, with first, the first object's of an array of them (a completions render, one
// per prompt; the router routes by the first). A malformed answer is a badAnswer; ids out of
// range, none, or no prompt are errors of their own.
func engineIDs(answer []byte, key string, first bool) ([]uint32, error) {
	it := jsoniter.ConfigCompatibleWithStandardLibrary.BorrowIterator(answer)
	defer jsoniter.ConfigCompatibleWithStandardLibrary.ReturnIterator(it)
	var (
		ids      []uint32
		rangeErr error
	)
	object := func(it *jsoniter.Iterator) {
		it.ReadObjectCB(func(it *jsoniter.Iterator, k string) bool {
			if !strings.EqualFold(k, key) {
				it.Skip()
				return it.Error == nil
			}
			ids, rangeErr = nil, nil // the last occurrence wins
			if it.ReadNil() {
				return true
			}
			// About seven bytes an id ("12345, "): one allocation for a render answer.
			ids = make([]uint32, 0, len(answer)/6+1)
			it.ReadArrayCB(func(it *jsoniter.Iterator) bool {
				v := it.ReadInt64()
				if it.Error != nil {
					return false
				}
				if (v < 0 || v > math.MaxUint32) && rangeErr == nil {
					rangeErr = idRangeError(v, len(ids))
				}
				ids = append(ids, uint32(v))
				return true
			})
			return it.Error == nil
		})
	}
	prompts := 0
	if first {
		it.ReadArrayCB(func(it *jsoniter.Iterator) bool {
			if prompts == 0 {
				object(it)
			} else {
				it.Skip()
			}
			prompts++
			return it.Error == nil
		})
	} else {
		object(it)
	}
	switch {
	case it.Error != nil && !errors.Is(it.Error, io.EOF):
		return nil, badAnswer{it.Error}
	case first && prompts == 0:
		return nil, errNoPrompt
	case rangeErr != nil:
		return nil, rangeErr
	case len(ids) == 0:
		return nil, errNoIDs
	}
	return ids, nil
}

// idRangeError is an engine id outside what the request parser accepts (parseIDs): 0..2^32-1.
// An id past int64 already fails the decoding.
func idRangeError(v int64, pos int) error {
	return fmt.Errorf("tokens: the engine returned token id %d at position %d, outside 0..%d", v, pos, uint32(math.MaxUint32))
}
