package app

import (
	"net/http"

	"github.com/kvroute/kvroute/router/peers"
)

// Several router replicas (docs/router.md): router/peers owns this router's part in the group
// (the sync node, the peers' load share, the snapshot and the peer readiness rule). The router
// builds the group before its ledger (the ledger observes through it and reads its prefill),
// starts it once the fleet exists, and reads the peers' load through s.peer.Load.

// peerDeps are the router's parts the group reads.
func (s *Router) peerDeps() peers.Deps {
	d := peers.Deps{Ledger: s.ledger, Fleet: s.fleet, Ready: s.Ready}
	if s.sub != nil {
		d.Streams = s.sub
	}
	return d
}

// SetSnapshotURL is where peers fetch this router's snapshot (the binary calls it once its admin
// port listens, unless peers.snapshotURL says).
func (s *Router) SetSnapshotURL(u string) {
	if s.peer != nil {
		s.peer.SetSnapshotURL(u)
	}
}

// PeerClusterAddr is the embedded NATS server's route address ("" without one).
func (s *Router) PeerClusterAddr() string {
	if s.peer == nil {
		return ""
	}
	return s.peer.ClusterAddr()
}

// HasPeers reports whether this router is configured as one of several replicas.
func (s *Router) HasPeers() bool { return s.peer != nil }

// Peers returns the live peers (nil without peers configured).
func (s *Router) Peers() []peers.Peer {
	if s.peer == nil {
		return nil
	}
	return s.peer.Peers()
}

// serveSnapshot answers a peer's GET /peer/snapshot (peers.Group.ServeSnapshot).
func (s *Router) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	if s.peer == nil {
		http.Error(w, "peers are not configured", http.StatusNotFound)
		return
	}
	s.peer.ServeSnapshot(w, r)
}

// PeerInfo is the router's view of its group in /debug/engines.
type PeerInfo = peers.Info
