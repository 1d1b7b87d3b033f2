package peersnap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/kvroute/kvroute/router/bincodec"
	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
)

// Encode appends s to dst.
func Encode(dst []byte, s *Snapshot) []byte {
	dst = append(dst, magic...)
	dst = binary.AppendUvarint(dst, Version)
	dst = binary.AppendVarint(dst, s.Taken)
	dst = bincodec.AppendString(dst, s.Router)
	dst = binary.AppendUvarint(dst, s.KeyScheme)
	dst = binary.AppendUvarint(dst, uint64(len(s.Streams)))
	for i := range s.Streams {
		st := &s.Streams[i]
		dst = bincodec.AppendString(dst, st.Engine)
		dst = binary.AppendUvarint(dst, uint64(st.Rank))
		dst = bincodec.AppendString(dst, st.Incarnation)
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
		dst = bincodec.AppendString(dst, a.Engine)
		dst = binary.AppendUvarint(dst, uint64(a.Rank))
		dst = binary.AppendUvarint(dst, uint64(len(a.Entries)))
		for _, e := range a.Entries {
			dst = binary.LittleEndian.AppendUint64(dst, uint64(e.Key))
			dst = binary.AppendVarint(dst, e.Exp)
		}
	}
	return dst
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
	r := bincodec.NewReader(b, ErrFormat)
	if len(b) < len(magic) || string(b[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: not a kvroute snapshot (magic)", ErrFormat)
	}
	r.Skip(len(magic))
	if v := r.Uvarint("version"); r.Err() == nil && v != Version {
		return nil, fmt.Errorf("%w: version %d, this router reads %d", ErrFormat, v, Version)
	}
	s := &Snapshot{}
	s.Taken = r.Varint("taken")
	s.Router = r.String("router", lim.MaxString)
	s.KeyScheme = r.Uvarint("key scheme")
	n := r.Count("streams", lim.MaxStreams, minStreamBytes)
	if n > 0 {
		s.Streams = make([]Stream, n)
	}
	for i := 0; i < n && r.Err() == nil; i++ {
		st := &s.Streams[i]
		st.Engine = r.String("engine", lim.MaxString)
		st.Rank = rank(r)
		st.Incarnation = r.String("incarnation", lim.MaxString)
		flags := r.Uvarint("flags")
		if flags > 3 {
			r.Fail("flags %d", flags)
		}
		st.Exact, st.HaveSeq = flags&1 != 0, flags&2 != 0
		st.LastSeq = r.Uvarint("last seq")
		st.Identity = r.U64("identity")
		bs := r.Uvarint("block size")
		if bs > blockkey.MaxBlockSize {
			r.Fail("block size %d over %d", bs, blockkey.MaxBlockSize)
		}
		st.BlockSize = uint32(bs)
		ng := r.Count("groups", lim.MaxGroups, minGroupBytes)
		for j := 0; j < ng && r.Err() == nil; j++ {
			idx := r.Varint("group idx")
			full := r.Uvarint("group kind")
			if full > 1 {
				r.Fail("group kind %d", full)
			}
			st.Groups = append(st.Groups, Group{Idx: idx, Full: full == 1})
		}
		for t := range st.Tiers {
			ne := r.Count("entries", lim.MaxEntries, minEntryBytes)
			if ne == 0 {
				continue
			}
			es := make([]index.Entry, ne)
			for j := 0; j < ne && r.Err() == nil; j++ {
				es[j].Hash = r.U64("hash")
				es[j].Key = blockkey.Key(r.U64("key"))
				x := r.Uvarint("extra")
				if x > math.MaxUint32 {
					r.Fail("extra copies %d", x)
				}
				es[j].Extra = uint32(x)
			}
			st.Tiers[t] = es
		}
	}
	na := r.Count("approximate replicas", lim.MaxStreams, minApproxBytes)
	if na > 0 {
		s.Approx = make([]Approx, na)
	}
	for i := 0; i < na && r.Err() == nil; i++ {
		a := &s.Approx[i]
		a.Engine = r.String("engine", lim.MaxString)
		a.Rank = rank(r)
		ne := r.Count("approximate entries", lim.MaxEntries, minSideBytes)
		if ne > 0 {
			a.Entries = make([]index.SideEntry, ne)
		}
		for j := 0; j < ne && r.Err() == nil; j++ {
			a.Entries[j].Key = blockkey.Key(r.U64("key"))
			a.Entries[j].Exp = r.Varint("expiry")
		}
	}
	r.End()
	if r.Err() != nil {
		return nil, r.Err()
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

// rank reads a DP rank (bounded: a rank past 2^16 is no deployment's).
func rank(r *bincodec.Reader) int {
	v := r.Uvarint("rank")
	if v > 1<<16 {
		r.Fail("rank %d", v)
		return 0
	}
	return int(v)
}
