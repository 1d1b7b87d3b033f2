package bincodec

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

var errTest = errors.New("test format")

func TestReadsWhatWasAppended(t *testing.T) {
	b := binary.AppendUvarint(nil, 300)
	b = binary.AppendVarint(b, -7)
	b = AppendString(b, "engine-0")
	b = binary.LittleEndian.AppendUint64(b, 1<<60)
	b = append(b, 9)
	r := NewReader(b, errTest)
	if u, v, s, k, c := r.Uvarint("u"), r.Varint("v"), r.String("s", 16), r.U64("k"), r.Byte("c"); u != 300 || v != -7 || s != "engine-0" || k != 1<<60 || c != 9 {
		t.Fatalf("read %d %d %q %d %d", u, v, s, k, c)
	}
	r.End()
	if r.Err() != nil || r.Left() != 0 {
		t.Fatalf("err %v, %d left", r.Err(), r.Left())
	}
}

// Every failure names the field and the offset, wraps the format's error, and sticks: later
// reads return zero.
func TestFailuresStick(t *testing.T) {
	for name, c := range map[string]struct {
		in   []byte
		read func(r *Reader)
		want string
	}{
		"long string":   {AppendString(nil, "abcdef"), func(r *Reader) { r.String("peer", 4) }, "at byte 1: peer: length 6 over the 4-byte limit"},
		"cut string":    {[]byte{5, 'a'}, func(r *Reader) { r.String("peer", 16) }, "peer: length 5 over"},
		"count limit":   {[]byte{9}, func(r *Reader) { r.Count("deltas", 8, 1) }, "deltas: 9 over the limit of 8"},
		"count input":   {[]byte{3, 0, 0}, func(r *Reader) { r.Count("keys", 8, 8) }, "keys: 3 cannot fit in the 2 bytes left"},
		"cut key":       {[]byte{1, 2}, func(r *Reader) { r.U64("key") }, "at byte 0: key: truncated"},
		"cut varint":    {[]byte{0x80}, func(r *Reader) { r.Uvarint("seq") }, "seq: bad or truncated varint"},
		"trailing":      {[]byte{1, 2}, func(r *Reader) { r.Byte(""); r.End() }, "at byte 1: 1 bytes after the end"},
		"no byte":       {nil, func(r *Reader) { r.Byte("kind") }, "kind: truncated"},
		"first failure": {[]byte{0x80}, func(r *Reader) { r.Varint("a"); r.Fail("second") }, "a: bad or truncated varint"},
	} {
		r := NewReader(c.in, errTest)
		c.read(r)
		if err := r.Err(); !errors.Is(err, errTest) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
		if r.Uvarint("after") != 0 || r.String("after", 8) != "" || r.U64("after") != 0 {
			t.Errorf("%s: a read after the failure returned a value", name)
		}
	}
}
