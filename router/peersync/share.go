package peersync

import (
	"sync"
	"time"
)

// LoadSink takes peers' batches (router/app's, over a Share and the ledger's predicted index);
// ApplyPeer is called on NATS's delivery goroutine, so it must not block.
type LoadSink interface {
	// ApplyPeer folds one batch of a peer into the sink.
	ApplyPeer(b *Batch, now time.Time)
	// Expire drops the share of every peer silent since before deadline and returns who.
	Expire(deadline time.Time) []string
}

// Share is every peer's load per replica, from each peer's latest batch. Safe for concurrent
// use; Of is what a decision calls.
type Share struct {
	mu    sync.RWMutex
	peers map[string]*peerShare
	// sum: per replica, the sum over live peers (kept so a decision reads one map entry).
	sum map[string]Load
}

type peerShare struct {
	epoch  int64
	seq    uint64
	seen   time.Time
	totals map[string]Load
}

// NewShare returns an empty share.
func NewShare() *Share {
	return &Share{peers: map[string]*peerShare{}, sum: map[string]Load{}}
}

// ApplyPeer replaces the peer's share with the batch's totals.
func (s *Share) ApplyPeer(b *Batch, now time.Time) { s.Apply(b, now) }

// Apply is ApplyPeer, and reports whether the batch was taken: false for one at or before the
// peer's last (a replayed message), whose changes were applied already.
func (s *Share) Apply(b *Batch, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peers[b.Peer]
	switch {
	case p == nil || p.epoch != b.Epoch:
		if p != nil {
			s.drop(p)
		}
		p = &peerShare{epoch: b.Epoch}
		s.peers[b.Peer] = p
	case b.Seq <= p.seq:
		return false // older than what was applied (NATS keeps one publisher's order; a replayed message)
	}
	s.drop(p)
	p.seq, p.seen = b.Seq, now
	p.totals = make(map[string]Load, len(b.Totals))
	for _, t := range b.Totals {
		p.totals[t.Replica] = p.totals[t.Replica].Add(t.Load)
	}
	for r, l := range p.totals {
		s.sum[r] = s.sum[r].Add(l)
	}
	return true
}

// drop takes p's totals out of the sums.
func (s *Share) drop(p *peerShare) {
	for r, l := range p.totals {
		left := s.sum[r].Add(Load{-l.Prefill, -l.Decode, -l.Running})
		if left == (Load{}) {
			delete(s.sum, r)
		} else {
			s.sum[r] = left
		}
	}
	p.totals = nil
}

// Expire drops the peers silent since before deadline.
func (s *Share) Expire(deadline time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var gone []string
	for name, p := range s.peers {
		if p.seen.Before(deadline) {
			s.drop(p)
			delete(s.peers, name)
			gone = append(gone, name)
		}
	}
	return gone
}

// Of returns the load the live peers have in flight on the replica.
func (s *Share) Of(replica string) Load {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sum[replica]
}
