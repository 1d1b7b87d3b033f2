package kvevents

import (
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
)

// DefaultPeerKeys bounds the block-0 keys a PeerTable remembers.
const DefaultPeerKeys = 4096

// PeerTable is parity across replicas: for block 0 of each stored chain (parent nil, GPU) it
// remembers which engine hash the first replica reported for the router key; another replica
// reporting a different engine hash for the same key hashes the same tokens differently (another
// PYTHONHASHSEED, algorithm or extra keys). Both replicas are counted, each naming the other.
// Bounded: past MaxKeys remembered keys the table starts again empty. Safe for concurrent use
// by every stream's ingester.
type PeerTable struct {
	MaxKeys int

	mu    sync.Mutex
	first map[blockkey.Key]peerSeen
	reps  map[index.ReplicaID]*PeerMismatch
}

type peerSeen struct {
	hash uint64
	id   index.ReplicaID
}

// PeerMismatch is one replica's cross-replica parity record.
type PeerMismatch struct {
	// Count is how many block-0 keys it hashed differently from a peer.
	Count atomic.Uint64
	// Peer is the last peer it disagreed with.
	Peer atomic.Int64
}

// NewPeerTable returns an empty table.
func NewPeerTable() *PeerTable {
	return &PeerTable{MaxKeys: DefaultPeerKeys, first: map[blockkey.Key]peerSeen{}, reps: map[index.ReplicaID]*PeerMismatch{}}
}

// Observe records that replica id stored key with engine hash h.
func (p *PeerTable) Observe(key blockkey.Key, h uint64, id index.ReplicaID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen, ok := p.first[key]
	switch {
	case !ok:
		if len(p.first) >= p.MaxKeys {
			clear(p.first)
		}
		p.first[key] = peerSeen{hash: h, id: id}
	case seen.id != id && seen.hash != h:
		p.note(id, seen.id)
		p.note(seen.id, id)
	}
}

func (p *PeerTable) note(id, peer index.ReplicaID) {
	m := p.reps[id]
	if m == nil {
		m = &PeerMismatch{}
		p.reps[id] = m
	}
	m.Count.Add(1)
	m.Peer.Store(int64(peer))
}

// Mismatches returns replica id's count and last peer (ok false when it never disagreed).
func (p *PeerTable) Mismatches(id index.ReplicaID) (count uint64, peer index.ReplicaID, ok bool) {
	p.mu.Lock()
	m := p.reps[id]
	p.mu.Unlock()
	if m == nil {
		return 0, 0, false
	}
	return m.Count.Load(), index.ReplicaID(m.Peer.Load()), true
}

// Forget drops a replica (removed from the index: its ID may be reused).
func (p *PeerTable) Forget(id index.ReplicaID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.reps, id)
	for k, s := range p.first {
		if s.id == id {
			delete(p.first, k)
		}
	}
}
