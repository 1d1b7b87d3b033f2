package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/peersnap"
	"github.com/kvroute/kvroute/router/peersync"
)

// Several router replicas (docs/router.md): the load this router sends is published to its peers
// and theirs added to every decision (router/peersync); a starting router takes a ready peer's
// index snapshot (router/peersnap) so its streams start exact even after the engines' rings
// wrapped. The ledger's transitions reach the peers through a load.Observer (peerObserver:
// Routed with the uncached and held tokens and the predicted keys, FirstToken, Done, Failed);
// the peers' totals are added to each replica's load where the decision's views are built
// (route.go), and their routed requests enter the ledger's predicted index and balance windows
// (peerSink).

// Defaults of config.Peers.
const (
	defaultPeerTimeout      = 3 * time.Second
	defaultPeerReadyTimeout = 10 * time.Second
	defaultMaxSnapshotBytes = 512 << 20
	// peerDiscoverWait is how long a starting router listens for a ready peer's heartbeat
	// (every 500ms) before concluding it is alone.
	peerDiscoverWait = 1500 * time.Millisecond
	// snapshotFetchTimeout bounds taking one peer's snapshot.
	snapshotFetchTimeout = 10 * time.Second
	// maxApproxExport bounds one replica's approximate entries in a snapshot.
	maxApproxExport = 1 << 20
)

// peerState is this router's part in the group of replicas. Nil without config.Peers.
type peerState struct {
	id    string
	node  *peersync.Node
	share *peersync.Share
	// snapshotURL is where this router serves its snapshot (set by the binary once the admin
	// port listens; "" serves none).
	snapshotURL atomic.Pointer[string]

	mu sync.Mutex
	// seeds: a peer's snapshot, by stream, until the stream is added; approx by replica.
	seeds  map[kvevents.StreamKey]*peersnap.Stream
	approx map[kvevents.StreamKey][]index.SideEntry
	// seededFrom names the peer the snapshot came from ("" when none was taken).
	seededFrom string
	// readyBy: the peer rule holds until every stream is exact or approximate-with-snapshot, or
	// until readyBy; after either, the single-router rule.
	readyBy  time.Time
	peerRule atomic.Bool
	// approxSeeded: replicas without events whose approximate index came from the snapshot.
	approxSeeded map[string]bool

	snapServing chan struct{}
	met         *peersnap.Metrics
}

// startPeers starts the load sync (New calls it when config.Peers is set, after the ledger and
// the metrics exist; peerObserver publishes nothing until s.peer is set here).
func (s *Router) startPeers(pc *config.Peers) error {
	id := pc.ID
	if id == "" {
		id = os.Getenv("POD_NAME")
	}
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("peers.id: none given and no host name: %w", err)
		}
		id = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	p := &peerState{id: id, share: peersync.NewShare(), seeds: map[kvevents.StreamKey]*peersnap.Stream{},
		approx: map[kvevents.StreamKey][]index.SideEntry{}, approxSeeded: map[string]bool{}, snapServing: make(chan struct{}, 1),
		met: peersnap.NewMetrics()}
	empty := ""
	p.snapshotURL.Store(&empty)
	o := peersync.Options{ID: id, Subject: pc.Subject, URL: pc.URL, ClusterListen: pc.ClusterListen, Routes: pc.Routes,
		PeerTimeout: pc.PeerTimeout.Duration, Sink: &peerSink{s: s, share: p.share}, Totals: s.localTotals,
		Status: func() (string, bool) { return *p.snapshotURL.Load(), s.Ready() }, Logger: s.log}
	if o.PeerTimeout <= 0 {
		o.PeerTimeout = defaultPeerTimeout
	}
	if t := pc.TLS; t != nil {
		o.TLS = &peersync.TLSFiles{CertFile: t.CertFile, KeyFile: t.KeyFile, CAFile: t.CAFile}
	}
	n, err := peersync.Start(o)
	if err != nil {
		return err
	}
	p.node = n
	for _, c := range p.met.Collectors() {
		if err := s.met.Registry.Register(c); err != nil {
			n.Close()
			return err
		}
	}
	if err := n.Register(s.met.Registry); err != nil {
		n.Close()
		return err
	}
	s.peer = p
	return nil
}

// SetSnapshotURL is where peers fetch this router's snapshot (the binary calls it once its admin
// port listens, unless peers.snapshotURL says).
func (s *Router) SetSnapshotURL(u string) {
	if s.peer != nil {
		s.peer.snapshotURL.Store(&u)
	}
}

// PeerClusterAddr is the embedded NATS server's route address ("" without one).
func (s *Router) PeerClusterAddr() string {
	if s.peer == nil {
		return ""
	}
	return s.peer.node.ClusterAddr()
}

// HasPeers reports whether this router is configured as one of several replicas.
func (s *Router) HasPeers() bool { return s.peer != nil }

// Peers returns the live peers (nil without peers configured).
func (s *Router) Peers() []peersync.Peer {
	if s.peer == nil {
		return nil
	}
	return s.peer.node.Peers()
}

// localTotals is this router's own load per replica (what it publishes).
func (s *Router) localTotals() []peersync.Total {
	reps := s.reps()
	out := make([]peersync.Total, 0, len(reps))
	for _, r := range reps {
		ld := r.Load.Load()
		l := peersync.Load{Prefill: ld.PrefillTokens, Decode: ld.DecodeTokens, Running: ld.Running}
		if l != (peersync.Load{}) {
			out = append(out, peersync.Total{Replica: r.Name, Load: l})
		}
	}
	return out
}

// peerLoad is what the live peers have in flight on the replica (zero without peers).
func (s *Router) peerLoad(r *replica) load.Load {
	if s.peer == nil {
		return load.Load{}
	}
	l := s.peer.share.Of(r.Name)
	return load.Load{PrefillTokens: l.Prefill, DecodeTokens: l.Decode, Running: l.Running}
}

// peerPrefill is the prefill the live peers have routed to the replica and not seen reach a
// first token (load.Options.PeerPrefill).
func (s *Router) peerPrefill(replica string) int64 {
	if s.peer == nil {
		return 0
	}
	return s.peer.share.Of(replica).Prefill
}

// peerObserver publishes the ledger's transitions of this router's requests to its peers
// (router/peersync batches them; Record never waits on the network). The ledger's id names the
// request: unique in this router process, which is all a peer needs.
type peerObserver struct{ s *Router }

func (o peerObserver) record(d peersync.Delta) {
	if p := o.s.peer; p != nil {
		p.node.Record(d)
	}
}

func (o peerObserver) Routed(id load.ID, r *load.Record) {
	o.record(peersync.Delta{Kind: peersync.Routed, Request: uint64(id), Replica: r.Replica.Name,
		Prefill: int64(r.Uncached), Tokens: int64(r.Held), Keys: slices.Clone(r.Keys)}) // queued past the call: the Record's keys are reused once the request ends
}

func (o peerObserver) FirstToken(id load.ID, r *load.Record, _ time.Time) {
	o.record(peersync.Delta{Kind: peersync.FirstToken, Request: uint64(id), Replica: r.Replica.Name, Tokens: int64(r.Held)})
}

func (o peerObserver) Done(id load.ID, r *load.Record, _ *load.Usage) {
	o.record(peersync.Delta{Kind: peersync.Done, Request: uint64(id), Replica: r.Replica.Name})
}

func (o peerObserver) Failed(id load.ID, r *load.Record) {
	o.record(peersync.Delta{Kind: peersync.Failed, Request: uint64(id), Replica: r.Replica.Name})
}

// peerSink folds peers' batches into the share and their routed requests into the ledger: their
// predicted blocks into the predicted side index, so a sibling that reaches another router
// still co-locates, and their uncached prefill into the balance windows, so the kv bounds
// weigh the fleet's routed work and not this router's part of it. A peer's first token or
// failure on a replica, or its routing to a replica with no prefill pending, is progress of
// that replica's prefill (load.Ledger.PeerProgress), so kv's drain credit reads the replica's
// last progress, not this router's.
type peerSink struct {
	s     *Router
	share *peersync.Share
}

func (k *peerSink) ApplyPeer(b *peersync.Batch, now time.Time) {
	var byName map[string]*replica
	lookup := func(name string) *replica {
		if byName == nil {
			byName = map[string]*replica{}
			for _, r := range k.s.reps() {
				byName[r.Name] = r
			}
		}
		return byName[name]
	}
	// Which replicas had no prefill pending before this batch, as this router and its peers
	// saw them: the first prefill a peer routes there starts the replica's drain.
	var idle map[string]bool
	for i := range b.Deltas {
		d := &b.Deltas[i]
		if d.Kind != peersync.Routed || d.Prefill <= 0 {
			continue
		}
		if _, seen := idle[d.Replica]; seen {
			continue
		}
		if r := lookup(d.Replica); r != nil {
			if idle == nil {
				idle = map[string]bool{}
			}
			idle[d.Replica] = r.Load.Load().PrefillTokens == 0 && k.share.Of(d.Replica).Prefill == 0
		}
	}
	if !k.share.Apply(b, now) {
		return // a replayed batch: its routed requests are in the windows already
	}
	for i := range b.Deltas {
		d := &b.Deltas[i]
		r := lookup(d.Replica)
		if r == nil {
			continue
		}
		switch d.Kind {
		case peersync.Routed:
			k.s.ledger.RoutedPeer(r.Load, d.Keys, int(d.Prefill))
			if idle[d.Replica] {
				k.s.ledger.PeerProgress(r.Load)
				idle[d.Replica] = false
			}
		case peersync.FirstToken, peersync.Failed:
			// Done is not progress: it comes after the first token (the prefill moved then),
			// and a request that ends before one is rare enough to leave to the peer's next
			// first token.
			k.s.ledger.PeerProgress(r.Load)
		}
	}
}

func (k *peerSink) Expire(deadline time.Time) []string { return k.share.Expire(deadline) }

// serveSnapshot answers a peer's GET /peer/snapshot: every stream a peer can start from and the
// approximate index of replicas without events. One at a time: a second asker gets 503 and
// tries another peer.
func (s *Router) serveSnapshot(w http.ResponseWriter, _ *http.Request) {
	if s.peer == nil {
		http.Error(w, "peers are not configured", http.StatusNotFound)
		return
	}
	select {
	case s.peer.snapServing <- struct{}{}:
		defer func() { <-s.peer.snapServing }()
	default:
		http.Error(w, "a snapshot is being served; try another peer", http.StatusServiceUnavailable)
		return
	}
	b := peersnap.Encode(nil, s.takeSnapshot())
	s.peer.met.Served.Inc()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	_, _ = w.Write(b)
}

func (s *Router) takeSnapshot() *peersnap.Snapshot {
	now := s.now()
	sn := &peersnap.Snapshot{Taken: now.UnixNano(), Router: s.peer.id, KeyScheme: peersnap.KeyScheme}
	reps, engines := s.fleet.Snapshot()
	if s.sub != nil {
		for _, st := range s.sub.Snapshot() {
			e := engines[st.Engine]
			if e == nil {
				continue
			}
			st.Incarnation = e.Discovery().Incarnation
			sn.Streams = append(sn.Streams, st)
		}
	}
	for _, r := range reps {
		if r.Stream {
			continue
		}
		sn.Approx = append(sn.Approx, peersnap.Approx{Engine: r.Eng.Name, Rank: r.Rank, Entries: s.ledger.ExportApprox(r.Load, maxApproxExport)})
	}
	return sn
}

// bootstrap takes a ready peer's snapshot before the first engines are added. No ready peer
// within peerDiscoverWait: this router is alone, and the single-router rule holds.
func (s *Router) bootstrap(ctx context.Context) {
	p := s.peer
	pc := s.o.Config.Peers
	deadline := time.Now().Add(peerDiscoverWait)
	var tried map[string]bool
	for time.Now().Before(deadline) {
		for _, peer := range p.node.Peers() {
			if !peer.Ready || peer.SnapshotURL == "" || tried[peer.SnapshotURL] {
				continue
			}
			if tried == nil {
				tried = map[string]bool{}
			}
			tried[peer.SnapshotURL] = true
			sn, err := s.fetchSnapshot(ctx, peer.SnapshotURL, pc.MaxSnapshotBytes)
			if err != nil {
				p.met.Taken.WithLabelValues(peersnap.ResultFailed).Inc()
				s.log.Warn("peer snapshot not taken", "peer", peer.Name, "url", peer.SnapshotURL, "err", err)
				continue
			}
			s.useSnapshot(peer.Name, sn)
			p.met.Taken.WithLabelValues(peersnap.ResultApplied).Inc()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	p.met.Taken.WithLabelValues(peersnap.ResultNoPeer).Inc()
	s.log.Info("no ready router peer with a snapshot; starting from the engines' rings", "waited", peerDiscoverWait, "peers", len(p.node.Peers()))
}

func (s *Router) fetchSnapshot(ctx context.Context, url string, maxBytes int64) (*peersnap.Snapshot, error) {
	if maxBytes <= 0 {
		maxBytes = defaultMaxSnapshotBytes
	}
	ctx, cancel := context.WithTimeout(ctx, snapshotFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("peer answered %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > maxBytes {
		return nil, fmt.Errorf("snapshot over peers.maxSnapshotBytes (%d)", maxBytes)
	}
	sn, err := peersnap.Decode(body, peersnap.Limits{})
	if err != nil {
		return nil, err
	}
	if sn.KeyScheme != peersnap.KeyScheme {
		return nil, fmt.Errorf("peer keys blocks with scheme %d, this router with %d", sn.KeyScheme, peersnap.KeyScheme)
	}
	return sn, nil
}

func (s *Router) useSnapshot(from string, sn *peersnap.Snapshot) {
	p := s.peer
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range sn.Streams {
		st := &sn.Streams[i]
		p.seeds[kvevents.StreamKey{Engine: st.Engine, Rank: st.Rank}] = st
	}
	for _, a := range sn.Approx {
		p.approx[kvevents.StreamKey{Engine: a.Engine, Rank: a.Rank}] = a.Entries
	}
	p.seededFrom = from
	timeout := s.o.Config.Peers.ReadyTimeout.Duration
	if timeout <= 0 {
		timeout = defaultPeerReadyTimeout
	}
	p.readyBy = s.now().Add(timeout)
	p.peerRule.Store(true)
	s.log.Info("starting from a peer's snapshot", "peer", from, "streams", len(sn.Streams), "approximate_replicas", len(sn.Approx),
		"blocks", sn.Blocks(), "taken", time.Unix(0, sn.Taken).Format(time.RFC3339Nano))
}

// seedFor hands the stream its snapshot once, if the engine is the incarnation it was taken from.
func (s *Router) seedFor(engine string, rank int, incarnation string) *peersnap.Stream {
	if s.peer == nil {
		return nil
	}
	p := s.peer
	p.mu.Lock()
	defer p.mu.Unlock()
	k := kvevents.StreamKey{Engine: engine, Rank: rank}
	sn := p.seeds[k]
	delete(p.seeds, k)
	if sn == nil {
		return nil
	}
	if sn.Incarnation != incarnation {
		s.log.Warn("peer snapshot of the stream not used: the engine is another incarnation", "engine", engine, "rank", rank,
			"snapshot", sn.Incarnation, "now", incarnation)
		return nil
	}
	return sn
}

// seedApprox loads a replica's approximate index from the snapshot (replicas without events).
func (s *Router) seedApprox(r *replica) {
	if s.peer == nil {
		return
	}
	p := s.peer
	p.mu.Lock()
	k := kvevents.StreamKey{Engine: r.Eng.Name, Rank: r.Rank}
	es, ok := p.approx[k]
	delete(p.approx, k)
	if ok {
		p.approxSeeded[r.Name] = true
	}
	p.mu.Unlock()
	if ok {
		s.ledger.ImportApprox(r.Load, es)
	}
}

// peerNotReady applies the peer rule while it holds: every stream exact or
// approximate-with-snapshot, every replica without events seeded from the snapshot. It returns
// "" once that is so or the ready timeout passed; from then on only the single-router rule.
func (s *Router) peerNotReady() string {
	p := s.peer
	if p == nil || !p.peerRule.Load() {
		return ""
	}
	p.mu.Lock()
	by := p.readyBy
	p.mu.Unlock()
	if !s.now().Before(by) {
		p.peerRule.Store(false)
		s.log.Warn("peer readiness timed out; ready by the single-router rule", "timeout", s.o.Config.Peers.ReadyTimeout.Duration)
		return ""
	}
	for _, r := range s.reps() {
		if !r.Stream {
			p.mu.Lock()
			ok := p.approxSeeded[r.Name]
			p.mu.Unlock()
			if !ok {
				return "replica " + r.Name + " has no events and no approximate index from the peer snapshot yet"
			}
			continue
		}
		st, ok := s.sub.Stats(r.Eng.Name, r.Rank)
		if !ok || !(st.State == kvevents.Exact || st.State == kvevents.Approximate && st.Seeded) {
			return "stream " + r.Name + " is not exact (nor approximate from a peer snapshot) yet"
		}
	}
	p.peerRule.Store(false)
	return ""
}

// closePeers leaves the group.
func (s *Router) closePeers() {
	if s.peer != nil {
		s.peer.node.Close()
	}
}

// PeerInfo is the router's view of its group in /debug/engines.
type PeerInfo struct {
	ID string `json:"id"`
	// SeededFrom names the peer whose snapshot this router started from ("" when none).
	SeededFrom string          `json:"seeded_from,omitempty"`
	Peers      []peersync.Peer `json:"peers"`
	// Routes is how many NATS routes the embedded server holds.
	Routes int `json:"routes"`
	// SyncFaults: load changes dropped, batches not published, lost or undecodable.
	SyncFaults peersync.SyncFaults `json:"sync_faults"`
}

func (s *Router) peerInfo() PeerInfo {
	p := s.peer
	p.mu.Lock()
	from := p.seededFrom
	p.mu.Unlock()
	return PeerInfo{ID: p.id, SeededFrom: from, Peers: p.node.Peers(), Routes: p.node.Routes(), SyncFaults: p.node.Faults()}
}
