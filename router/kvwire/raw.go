package kvwire

import "github.com/vmihailenco/msgpack/v5/msgpcode"

// The readers below decode the few msgpack forms that dominate a KV-event payload (integers,
// short strings, fixed-size array and map headers) straight from the payload slice. Written by
// hand because going through the library costs an interface call per byte read (PeekCode is a
// ReadByte plus an UnreadByte, every integer a readN): a BlockStored of 512 tokens made
// token ids alone most of the ingestion time. Each reader reports failure (width 0) for anything
// it does not handle completely, including a value cut short, and the caller then lets the
// library decode that value, so errors and the treatment of rare forms stay the library's.

// rawInt reads the msgpack integer at the start of b: its value as the library's DecodeUint64
// gives it (negative ints sign-extended to two's complement), whether it was encoded as uint64,
// and its encoded width; width 0 when b does not start with a whole integer.
func rawInt(b []byte) (v uint64, u64 bool, w int) {
	if len(b) == 0 {
		return 0, false, 0
	}
	c := b[0]
	if c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow {
		return uint64(int64(int8(c))), false, 1
	}
	switch c {
	case msgpcode.Uint8:
		if len(b) >= 2 {
			return uint64(b[1]), false, 2
		}
	case msgpcode.Int8:
		if len(b) >= 2 {
			return uint64(int64(int8(b[1]))), false, 2
		}
	case msgpcode.Uint16:
		if len(b) >= 3 {
			return uint64(be16(b[1:])), false, 3
		}
	case msgpcode.Int16:
		if len(b) >= 3 {
			return uint64(int64(int16(be16(b[1:])))), false, 3
		}
	case msgpcode.Uint32:
		if len(b) >= 5 {
			return uint64(be32(b[1:])), false, 5
		}
	case msgpcode.Int32:
		if len(b) >= 5 {
			return uint64(int64(int32(be32(b[1:])))), false, 5
		}
	case msgpcode.Uint64, msgpcode.Int64:
		if len(b) >= 9 {
			return uint64(be32(b[1:]))<<32 | uint64(be32(b[5:])), c == msgpcode.Uint64, 9
		}
	}
	return 0, false, 0
}

// rawBytesHeader reads a str or bin header at the start of b whose body lies wholly inside b: the
// body length and the header width; width 0 otherwise.
func rawBytesHeader(b []byte) (n, w int) {
	if len(b) == 0 {
		return 0, 0
	}
	c := b[0]
	switch {
	case msgpcode.IsFixedString(c):
		n, w = int(c&msgpcode.FixedStrMask), 1
	case (c == msgpcode.Str8 || c == msgpcode.Bin8) && len(b) >= 2:
		n, w = int(b[1]), 2
	case (c == msgpcode.Str16 || c == msgpcode.Bin16) && len(b) >= 3:
		n, w = int(be16(b[1:])), 3
	case (c == msgpcode.Str32 || c == msgpcode.Bin32) && len(b) >= 5:
		n, w = int(be32(b[1:])), 5
	default:
		return 0, 0
	}
	if n < 0 || n > len(b)-w { // n < 0: a 32-bit int overflowed
		return 0, 0
	}
	return n, w
}

func be16(b []byte) uint16 { return uint16(b[0])<<8 | uint16(b[1]) }

func be32(b []byte) uint32 {
	_ = b[3]
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}
