// Package peersnap is the snapshot one router serves another so that a starting router need not
// rebuild its index from the engines' rings (which may have wrapped): every event stream's exact
// index with the sequence number it matches and the engine process it came from, and the
// approximate index of replicas without events.
//
// The format is versioned and bounded: Decode checks every length against what is left of the
// input and against Limits before allocating, so nothing a peer sends can crash the router or
// make it allocate more than the caps (FuzzDecode). Layout, all integers unsigned varints unless
// said otherwise:
//
//	magic "KVRS" | version | taken (unix ns) | router (string) | key scheme
//	streams: count, then per stream
//	  engine (string) | rank | incarnation (string) | flags (bit 0 exact, bit 1 have seq)
//	  last seq | identity (8 bytes, little endian) | block size
//	  groups: count, then (group idx zigzag, full-attention 0/1)
//	  per tier GPU, CPU, Disk: count, then (hash 8 bytes LE, key 8 bytes LE, extra copies)
//	approximate: count, then per replica
//	  engine (string) | rank | count, then (key 8 bytes LE, expiry unix ns zigzag)
//
// A string is its length then its bytes.
package peersnap

import (
	"github.com/kvroute/kvroute/router/index"
)

// Version is the format written; Decode refuses any other.
const Version = 1

// KeyScheme names how router keys are computed (router/blockkey's chained 64-bit keys). A
// router whose keys are computed differently must not take a snapshot's keys: bump it when
// blockkey's router keys change.
const KeyScheme = 1

const magic = "KVRS"

// Snapshot is what a router serves its peers.
type Snapshot struct {
	// Taken is when the snapshot was taken (unix nanoseconds, the serving router's clock).
	Taken int64
	// Router names the router that took it.
	Router string
	// KeyScheme is the serving router's KeyScheme.
	KeyScheme uint64
	Streams   []Stream
	Approx    []Approx
}

// Stream is one (engine, DP rank) event stream's exact index at one sequence number.
type Stream struct {
	Engine string
	Rank   int
	// Incarnation is the engine pod's incarnation as discovery saw it ("" for static engines): a
	// snapshot of another incarnation is never applied.
	Incarnation string
	// Exact: the serving router's stream was exact (every batch since the engine's seq 0 or its
	// last AllBlocksCleared applied in order); otherwise the index is a subset (approximate).
	Exact bool
	// LastSeq is the last batch applied (valid when HaveSeq).
	LastSeq uint64
	HaveSeq bool
	// Identity is the XXH3-64 of that batch's payload: the receiver asks the engine's replay ring
	// for LastSeq and applies the snapshot only if the same bytes come back (the same engine
	// process; kvevents' restart check after an outage is the same test).
	Identity uint64
	// BlockSize is the block size the stream learned (0: none yet).
	BlockSize uint32
	// Groups are the KV cache groups learned: group_idx -> full attention.
	Groups []Group
	// Tiers are the replica's blocks per tier (index.GPU, CPU, Disk).
	Tiers [index.NumTiers][]index.Entry
}

// Group is one KV cache group the ingester learned.
type Group struct {
	Idx  int64
	Full bool
}

// Approx is one replica's approximate (decision-learned) index, for engines without events.
type Approx struct {
	Engine  string
	Rank    int
	Entries []index.SideEntry
}

// Limits bound what Decode accepts.
type Limits struct {
	// MaxStreams bounds streams and approximate replicas each (4096).
	MaxStreams int
	// MaxEntries bounds one replica's blocks on one tier, and one replica's approximate entries
	// (1<<22).
	MaxEntries int
	// MaxString bounds names (1024 bytes).
	MaxString int
	// MaxGroups bounds a stream's groups (64, kvevents' own bound).
	MaxGroups int
}

// DefaultLimits are the bounds Decode uses for zero fields.
var DefaultLimits = Limits{MaxStreams: 4096, MaxEntries: 1 << 22, MaxString: 1024, MaxGroups: 64}

// Blocks is how many entries the snapshot holds in all (for logs and metrics).
func (s *Snapshot) Blocks() int {
	n := 0
	for i := range s.Streams {
		for _, es := range s.Streams[i].Tiers {
			n += len(es)
		}
	}
	for i := range s.Approx {
		n += len(s.Approx[i].Entries)
	}
	return n
}
