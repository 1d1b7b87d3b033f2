package peersnap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
)

// Encode appends s to dst.
func Encode(dst []byte, s *Snapshot) []byte {
	dst = append(dst, magic...)
	dst = binary.AppendUvarint(dst, Version)
	dst = binary.AppendVarint(dst, s.Taken)
	dst = appendString(dst, s.Router)
	dst = binary.AppendUvarint(dst, s.KeyScheme)
	dst = binary.AppendUvarint(dst, uint64(len(s.Streams)))
	for i := range s.Streams {
		st := &s.Streams[i]
		dst = appendString(dst, st.Engine)
		dst = binary.AppendUvarint(dst, uint64(st.Rank))
		dst = appendString(dst, st.Incarnation)
		var flags uint64
		if st.Exact {
			flags |= 1
		}
		if st.HaveSeq {
			flags |= 2
		}
		dst = binary.AppendUvarint(dst, flags)
		dst = binary.AppendUvarint(dst, st.LastSeq)
		dst = binary.LittleEndian.AppendUint64(dst, st.Identity)
		dst = binary.AppendUvarint(dst, uint64(st.BlockSize))
		dst = binary.AppendUvarint(dst, uint64(len(st.Groups)))
		for _, g := range st.Groups {
			dst = binary.AppendVarint(dst, g.Idx)
			full := uint64(0)
			if g.Full {
				full = 1
			}
			dst = binary.AppendUvarint(dst, full)
		}
		for _, es := range st.Tiers {
			dst = binary.AppendUvarint(dst, uint64(len(es)))
			for _, e := range es {
				dst = binary.LittleEndian.AppendUint64(dst, e.Hash)
				dst = binary.LittleEndian.AppendUint64(dst, uint64(e.Key))
				dst = binary.AppendUvarint(dst, uint64(e.Extra))
			}
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(s.Approx)))
	for i := range s.Approx {
		a := &s.Approx[i]
		dst = appendString(dst, a.Engine)
		dst = binary.AppendUvarint(dst, uint64(a.Rank))
		dst = binary.AppendUvarint(dst, uint64(len(a.Entries)))
		for _, e := range a.Entries {
			dst = binary.LittleEndian.AppendUint64(dst, uint64(e.Key))
			dst = binary.AppendVarint(dst, e.Exp)
		}
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// ErrFormat wraps every decoding failure.
var ErrFormat = errors.New("peersnap: bad snapshot")

// Minimum encoded sizes, so a count can be checked against what is left before allocating.
const (
	minStreamBytes = 1 + 1 + 1 + 1 + 1 + 8 + 1 + 1 + 3 // names empty, every count 0
	minEntryBytes  = 8 + 8 + 1
	minGroupBytes  = 2
	minApproxBytes = 1 + 1 + 1
	minSideBytes   = 8 + 1
)

// Decode parses a snapshot, checking every length against the input and lim (zero fields take
// DefaultLimits). It never panics and allocates at most in proportion to len(b).
func Decode(b []byte, lim Limits) (*Snapshot, error) {
	lim = lim.withDefaults()
	r := reader{b: b}
	if len(b) < len(magic) || string(b[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: not a kvroute snapshot (magic)", ErrFormat)
	}
	r.off = len(magic)
	if v := r.uvarint("version"); r.err == nil && v != Version {
		return nil, fmt.Errorf("%w: version %d, this router reads %d", ErrFormat, v, Version)
	}
	s := &Snapshot{}
	s.Taken = r.varint("taken")
	s.Router = r.str("router", lim.MaxString)
	s.KeyScheme = r.uvarint("key scheme")
	n := r.count("streams", lim.MaxStreams, minStreamBytes)
	if n > 0 {
		s.Streams = make([]Stream, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		st := &s.Streams[i]
		st.Engine = r.str("engine", lim.MaxString)
		st.Rank = r.rank()
		st.Incarnation = r.str("incarnation", lim.MaxString)
		flags := r.uvarint("flags")
		if flags > 3 {
			r.fail("flags %d", flags)
		}
		st.Exact, st.HaveSeq = flags&1 != 0, flags&2 != 0
		st.LastSeq = r.uvarint("last seq")
		st.Identity = r.u64("identity")
		bs := r.uvarint("block size")
		if bs > blockkey.MaxBlockSize {
			r.fail("block size %d over %d", bs, blockkey.MaxBlockSize)
		}
		st.BlockSize = uint32(bs)
		ng := r.count("groups", lim.MaxGroups, minGroupBytes)
		for j := 0; j < ng && r.err == nil; j++ {
			idx := r.varint("group idx")
			full := r.uvarint("group kind")
			if full > 1 {
				r.fail("group kind %d", full)
			}
			st.Groups = append(st.Groups, Group{Idx: idx, Full: full == 1})
		}
		for t := range st.Tiers {
			ne := r.count("entries", lim.MaxEntries, minEntryBytes)
			if ne == 0 {
				continue
			}
			es := make([]index.Entry, ne)
			for j := 0; j < ne && r.err == nil; j++ {
				es[j].Hash = r.u64("hash")
				es[j].Key = blockkey.Key(r.u64("key"))
				x := r.uvarint("extra")
				if x > math.MaxUint32 {
					r.fail("extra copies %d", x)
				}
				es[j].Extra = uint32(x)
			}
			st.Tiers[t] = es
		}
	}
	na := r.count("approximate replicas", lim.MaxStreams, minApproxBytes)
	if na > 0 {
		s.Approx = make([]Approx, na)
	}
	for i := 0; i < na && r.err == nil; i++ {
		a := &s.Approx[i]
		a.Engine = r.str("engine", lim.MaxString)
		a.Rank = r.rank()
		ne := r.count("approximate entries", lim.MaxEntries, minSideBytes)
		if ne > 0 {
			a.Entries = make([]index.SideEntry, ne)
		}
		for j := 0; j < ne && r.err == nil; j++ {
			a.Entries[j].Key = blockkey.Key(r.u64("key"))
			a.Entries[j].Exp = r.varint("expiry")
		}
	}
	if r.err == nil && r.off != len(b) {
		r.fail("%d bytes after the end", len(b)-r.off)
	}
	if r.err != nil {
		return nil, r.err
	}
	return s, nil
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxStreams <= 0 {
		l.MaxStreams = d.MaxStreams
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = d.MaxEntries
	}
	if l.MaxString <= 0 {
		l.MaxString = d.MaxString
	}
	if l.MaxGroups <= 0 {
		l.MaxGroups = d.MaxGroups
	}
	return l
}

// reader is a checked cursor: the first failure sticks and every later read returns zero.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: at byte %d: %s", ErrFormat, r.off, fmt.Sprintf(format, a...))
	}
}

func (r *reader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		r.fail("%s: bad or truncated varint", what)
		return 0
	}
	r.off += n
	return v
}

func (r *reader) varint(what string) int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b[r.off:])
	if n <= 0 {
		r.fail("%s: bad or truncated varint", what)
		return 0
	}
	r.off += n
	return v
}

func (r *reader) u64(what string) uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b)-r.off < 8 {
		r.fail("%s: truncated", what)
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v
}

func (r *reader) str(what string, max int) string {
	n := r.uvarint(what)
	if r.err != nil {
		return ""
	}
	if n > uint64(max) || n > uint64(len(r.b)-r.off) {
		r.fail("%s: length %d over the %d-byte limit or the input", what, n, max)
		return ""
	}
	s := string(r.b[r.off : r.off+int(n)])
	r.off += int(n)
	return s
}

func (r *reader) rank() int {
	v := r.uvarint("rank")
	if v > 1<<16 {
		r.fail("rank %d", v)
		return 0
	}
	return int(v)
}

// count reads a count and checks it against max and against the bytes left at minBytes each.
func (r *reader) count(what string, max, minBytes int) int {
	n := r.uvarint(what)
	if r.err != nil {
		return 0
	}
	if n > uint64(max) {
		r.fail("%s: %d over the limit of %d", what, n, max)
		return 0
	}
	if n*uint64(minBytes) > uint64(len(r.b)-r.off) {
		r.fail("%s: %d cannot fit in the %d bytes left", what, n, len(r.b)-r.off)
		return 0
	}
	return int(n)
}
