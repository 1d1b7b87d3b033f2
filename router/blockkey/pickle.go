package blockkey

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Hand-written pickle protocol 5 writer for exactly the values vLLM hashes: bytes, str, ints and
// tuples of them, and None. No maintained Go pickle *writer* exists, and the subset is small
// (spec §2.7.1). It appends into the caller's buffer so hashing a block does not allocate.
// Memo back-references (BINGET) are never emitted: they depend on Python object identity, and
// vLLM's inputs do not repeat an object within one block.

const (
	pkProto    = 0x80
	pkFrame    = 0x95
	pkStop     = 0x2e
	pkNone     = 0x4e
	pkBinInt1  = 0x4b
	pkBinInt2  = 0x4d
	pkBinInt   = 0x4a
	pkLong1    = 0x8a
	pkShortBin = 0x43
	pkBinBytes = 0x42
	pkShortStr = 0x8c
	pkBinUni   = 0x58
	pkMemoize  = 0x94
	pkMark     = 0x28
	pkTuple    = 0x74
	pkTuple1   = 0x85
	pkEmptyTup = 0x29

	// frameMin is CPython's FRAME_SIZE_MIN: shorter bodies are not framed.
	frameMin = 4
	// frameTarget is CPython's FRAME_SIZE_TARGET; beyond it the C pickler splits frames, which
	// is unverified, so longer inputs are refused.
	frameTarget = 64 * 1024
)

var errPickleTooLarge = errors.New("pickle: block input over 64 KiB needs multi-frame output, which is not reproduced")

// appendPickleBlock appends pickle.dumps((parent, tuple(tokens), extras or None), protocol=5).
func appendPickleBlock(dst, parent []byte, tokens []uint32, extras Extras) ([]byte, error) {
	start := len(dst)
	dst = append(dst, pkProto, 5, pkFrame, 0, 0, 0, 0, 0, 0, 0, 0)
	body := len(dst)
	dst = appendPickleBytes(dst, parent)
	dst = appendPickleTupleStart(dst, len(tokens))
	for _, t := range tokens {
		dst = appendPickleInt(dst, int64(t))
	}
	dst = appendPickleTupleEnd(dst, len(tokens))
	if len(extras) == 0 {
		dst = append(dst, pkNone)
	} else {
		dst = appendPickleTupleStart(dst, len(extras))
		for i := range extras {
			var err error
			if dst, err = appendPickleExtra(dst, &extras[i]); err != nil {
				return dst[:start], err
			}
		}
		dst = appendPickleTupleEnd(dst, len(extras))
	}
	dst = appendPickleTupleEnd(dst, 3)
	dst = append(dst, pkStop)
	return finishPickleFrame(dst, start, body)
}

// appendPickleStr appends pickle.dumps(s, protocol=5) (how vLLM hashes the seed for NONE_HASH).
func appendPickleStr(dst []byte, s string) ([]byte, error) {
	start := len(dst)
	dst = append(dst, pkProto, 5, pkFrame, 0, 0, 0, 0, 0, 0, 0, 0)
	body := len(dst)
	dst = appendPickleString(dst, s)
	dst = append(dst, pkStop)
	return finishPickleFrame(dst, start, body)
}

// finishPickleFrame fills in the FRAME length (everything after the header, STOP included), or
// removes the header for bodies shorter than frameMin, as CPython does.
func finishPickleFrame(dst []byte, start, body int) ([]byte, error) {
	n := len(dst) - body
	if n > frameTarget {
		return dst[:start], errPickleTooLarge
	}
	if n < frameMin {
		copy(dst[start+2:], dst[body:])
		return dst[:start+2+n], nil
	}
	binary.LittleEndian.PutUint64(dst[start+3:], uint64(n))
	return dst, nil
}

func appendPickleExtra(dst []byte, k *ExtraKey) ([]byte, error) {
	switch k.Kind {
	case ExtraString:
		return appendPickleString(dst, k.Str), nil
	case ExtraMM:
		dst = appendPickleString(dst, k.Str)
		dst = appendPickleInt(dst, k.Offset)
		return appendPickleTupleEnd(dst, 2), nil
	case ExtraBytes:
		return appendPickleBytes(dst, k.Bytes), nil
	default:
		return dst, fmt.Errorf("extra key of kind %d cannot be hashed as vLLM does", k.Kind)
	}
}

// appendPickleInt follows save_long: BININT1/BININT2 for small non-negatives, BININT for the
// rest of the int32 range (negatives included), LONG1 with minimal two's complement beyond.
func appendPickleInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0 && v < 1<<8:
		return append(dst, pkBinInt1, byte(v))
	case v >= 0 && v < 1<<16:
		return append(dst, pkBinInt2, byte(v), byte(v>>8))
	case v >= -1<<31 && v < 1<<31:
		return binary.LittleEndian.AppendUint32(append(dst, pkBinInt), uint32(v))
	}
	var le [8]byte
	binary.LittleEndian.PutUint64(le[:], uint64(v))
	n := 8
	// Drop redundant sign bytes while the next byte's top bit still carries the sign.
	for n > 1 && ((le[n-1] == 0 && le[n-2]&0x80 == 0) || (le[n-1] == 0xff && le[n-2]&0x80 != 0)) {
		n--
	}
	dst = append(dst, pkLong1, byte(n))
	return append(dst, le[:n]...)
}

func appendPickleBytes(dst, b []byte) []byte {
	if len(b) < 256 {
		dst = append(dst, pkShortBin, byte(len(b)))
	} else {
		dst = binary.LittleEndian.AppendUint32(append(dst, pkBinBytes), uint32(len(b)))
	}
	return append(append(dst, b...), pkMemoize)
}

func appendPickleString(dst []byte, s string) []byte {
	if len(s) < 256 {
		dst = append(dst, pkShortStr, byte(len(s)))
	} else {
		dst = binary.LittleEndian.AppendUint32(append(dst, pkBinUni), uint32(len(s)))
	}
	return append(append(dst, s...), pkMemoize)
}

// appendPickleTupleStart writes MARK for tuples that end with TUPLE (four or more items).
func appendPickleTupleStart(dst []byte, n int) []byte {
	if n >= 4 {
		return append(dst, pkMark)
	}
	return dst
}

// appendPickleTupleEnd closes a tuple of n items already written (TUPLE1..3 or TUPLE) and
// memoizes it; the empty tuple is a singleton and is not memoized.
func appendPickleTupleEnd(dst []byte, n int) []byte {
	switch {
	case n == 0:
		return append(dst, pkEmptyTup)
	case n <= 3:
		return append(dst, pkTuple1+byte(n-1), pkMemoize)
	default:
		return append(dst, pkTuple, pkMemoize)
	}
}
