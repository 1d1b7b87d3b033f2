package blockkey

import (
	"bytes"
	"fmt"

	"github.com/fxamacker/cbor/v2"
)

// cbor2.dumps(x, canonical=True) for vLLM's hash inputs, through fxamacker/cbor in canonical mode.
// For this subset (definite-length arrays, byte and text strings, shortest-form integers, null)
// canonical mode changes nothing, and the library's output is byte-identical to cbor2's; the
// vector tests check that on every block.

var cborMode = func() cbor.UserBufferEncMode {
	m, err := cbor.CanonicalEncOptions().UserBufferEncMode()
	if err != nil {
		panic(err) // static options; cannot fail
	}
	return m
}()

// cborBlock is the 3-tuple (parent, tuple(tokens), extras or None) as a CBOR array.
type cborBlock struct {
	_      struct{} `cbor:",toarray"`
	Parent []byte
	Tokens []uint32
	Extras []any // nil encodes as null (None)
}

// appendCBORBlock appends the canonical CBOR of one block's hash input, reusing buf's storage.
func appendCBORBlock(buf *bytes.Buffer, parent []byte, tokens []uint32, extras Extras) error {
	in := cborBlock{Parent: parent, Tokens: tokens}
	if len(extras) > 0 {
		in.Extras = make([]any, len(extras))
		for i := range extras {
			k := &extras[i]
			switch k.Kind {
			case ExtraString:
				in.Extras[i] = k.Str
			case ExtraMM:
				in.Extras[i] = []any{k.Str, k.Offset}
			case ExtraBytes:
				in.Extras[i] = k.Bytes
			default:
				return fmt.Errorf("extra key of kind %d cannot be hashed as vLLM does", k.Kind)
			}
		}
	}
	return cborMode.MarshalToBuffer(in, buf)
}

// appendCBORStr appends cbor2.dumps(s) (how vLLM hashes the seed for NONE_HASH).
func appendCBORStr(buf *bytes.Buffer, s string) error {
	return cborMode.MarshalToBuffer(s, buf)
}
