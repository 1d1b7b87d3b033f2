// Package bincodec holds the primitives of the router's own binary formats (peersnap's index
// snapshots, peersync's delta batches): varints, fixed 8-byte keys and length-prefixed strings,
// written with Append* and read through a Reader that checks every length against the input and
// a limit before it allocates. One reader for both formats, so a bound checked in one is checked
// in the other.
package bincodec

import (
	"encoding/binary"
	"fmt"
)

// AppendString appends s with its length as a uvarint before it.
func AppendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Reader is a checked cursor: the first failure sticks and every later read returns zero, so a
// decoder reads a whole message and checks Err once (inside loops, to stop early).
type Reader struct {
	b    []byte
	off  int
	err  error
	base error
}

// NewReader reads b; every failure wraps base (the format's own error, for errors.Is).
func NewReader(b []byte, base error) *Reader { return &Reader{b: b, base: base} }

// Err is the first failure, or nil.
func (r *Reader) Err() error { return r.err }

// Offset is the bytes read so far.
func (r *Reader) Offset() int { return r.off }

// Left is the bytes not read yet.
func (r *Reader) Left() int { return len(r.b) - r.off }

// Skip moves past n bytes already checked to be there (a magic prefix).
func (r *Reader) Skip(n int) {
	if r.err == nil && n <= r.Left() {
		r.off += n
	}
}

// Fail records a failure at the current offset, unless one is recorded already.
func (r *Reader) Fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: at byte %d: %s", r.base, r.off, fmt.Sprintf(format, a...))
	}
}

// what prefixes a failure with the field's name, when the decoder gave one.
func what(w, msg string) string {
	if w == "" {
		return msg
	}
	return w + ": " + msg
}

// Byte reads one byte.
func (r *Reader) Byte(w string) byte {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.b) {
		r.Fail("%s", what(w, "truncated"))
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

// Uvarint reads an unsigned varint.
func (r *Reader) Uvarint(w string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		r.Fail("%s", what(w, "bad or truncated varint"))
		return 0
	}
	r.off += n
	return v
}

// Varint reads a signed (zig-zag) varint.
func (r *Reader) Varint(w string) int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b[r.off:])
	if n <= 0 {
		r.Fail("%s", what(w, "bad or truncated varint"))
		return 0
	}
	r.off += n
	return v
}

// U64 reads 8 little-endian bytes.
func (r *Reader) U64(w string) uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b)-r.off < 8 {
		r.Fail("%s", what(w, "truncated"))
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v
}

// String reads a length-prefixed string of at most max bytes.
func (r *Reader) String(w string, max int) string {
	n := r.Uvarint(w)
	if r.err != nil {
		return ""
	}
	if n > uint64(max) || n > uint64(len(r.b)-r.off) {
		r.Fail("%s", what(w, fmt.Sprintf("length %d over the %d-byte limit or the input", n, max)))
		return ""
	}
	s := string(r.b[r.off : r.off+int(n)])
	r.off += int(n)
	return s
}

// Count reads an element count and checks it against max and against the bytes left at
// minBytes an element, so the caller can allocate n elements without trusting the input.
func (r *Reader) Count(w string, max, minBytes int) int {
	n := r.Uvarint(w)
	if r.err != nil {
		return 0
	}
	if n > uint64(max) {
		r.Fail("%s", what(w, fmt.Sprintf("%d over the limit of %d", n, max)))
		return 0
	}
	if n*uint64(minBytes) > uint64(len(r.b)-r.off) {
		r.Fail("%s", what(w, fmt.Sprintf("%d cannot fit in the %d bytes left", n, len(r.b)-r.off)))
		return 0
	}
	return int(n)
}

// End fails unless every byte was read.
func (r *Reader) End() {
	if r.err == nil && r.off != len(r.b) {
		r.Fail("%d bytes after the end", len(r.b)-r.off)
	}
}
