// Package peers is one router's part among several router replicas (docs/router.md): the load
// this router sends is published to its peers and theirs added to every decision
// (router/peersync); a starting router takes a ready peer's index snapshot (router/peersnap) so
// its streams start exact even after the engines' rings wrapped. The ledger's transitions reach
// the peers through Observer (Routed with the uncached and held tokens and the predicted keys,
// FirstToken, Done, Failed); the peers' totals are read through Load where the decision's views
// are built, and their routed requests enter the ledger's predicted index and balance windows
// (ApplyPeer).
//
// The Group owns the peersync node, the peers' load share (its one writer is ApplyPeer), the
// snapshot it took and the peer readiness rule. It reaches the rest of the router through the
// narrow interfaces of Deps.
package peers

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/fleet"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/peersnap"
	"github.com/kvroute/kvroute/router/peersync"
)

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

// Ledger is what the group needs of the load ledger (*load.Ledger): peers' routed requests and
// progress in, approximate indexes out of and into the snapshot.
type Ledger interface {
	RoutedPeer(r *load.Replica, keys []blockkey.Key, uncached int)
	PeerProgress(r *load.Replica)
	ExportApprox(r *load.Replica, max int) []index.SideEntry
	ImportApprox(r *load.Replica, entries []index.SideEntry)
}

// Fleet is what the group needs of the engines (*fleet.Fleet).
type Fleet interface {
	Replicas() []*fleet.Replica
	Snapshot() ([]*fleet.Replica, map[string]*fleet.Engine)
}

// Streams is what the group needs of the event streams (*kvevents.Subscriber).
type Streams interface {
	Snapshot() []peersnap.Stream
	Stats(engine string, rank int) (kvevents.Stats, bool)
}

// Deps are the router's parts the group reads once it starts.
type Deps struct {
	Ledger Ledger
	Fleet  Fleet
	// Streams is nil without events.
	Streams Streams
	// Ready reports whether this router takes traffic (a peer takes only a ready router's
	// snapshot).
	Ready func() bool
}

// Options configure a Group.
type Options struct {
	Config *config.Peers
	// Now is the clock of the readiness deadline (time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Group is this router's part in the group of replicas.
type Group struct {
	o     Options
	log   *slog.Logger
	id    string
	d     Deps
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

// New builds the group's state; it joins nothing until Start. The ledger is built with its
// Observer and Prefill between the two.
func New(o Options) (*Group, error) {
	if o.Config == nil {
		o.Config = &config.Peers{}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	id := o.Config.ID
	if id == "" {
		id = os.Getenv("POD_NAME")
	}
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("peers.id: none given and no host name: %w", err)
		}
		id = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	g := &Group{o: o, log: o.Logger, id: id, share: peersync.NewShare(), seeds: map[kvevents.StreamKey]*peersnap.Stream{},
		approx: map[kvevents.StreamKey][]index.SideEntry{}, approxSeeded: map[string]bool{}, snapServing: make(chan struct{}, 1),
		met: peersnap.NewMetrics()}
	empty := ""
	g.snapshotURL.Store(&empty)
	return g, nil
}

// Attach hands the group the router's parts; Start does it before joining. Alone, it lets a
// test feed ApplyPeer batches without a network.
func (g *Group) Attach(d Deps) { g.d = d }

// Start attaches d, joins the group and registers the sync's and the snapshot's metrics.
func (g *Group) Start(d Deps, reg prometheus.Registerer) error {
	g.Attach(d)
	pc := g.o.Config
	o := peersync.Options{ID: g.id, Subject: pc.Subject, URL: pc.URL, ClusterListen: pc.ClusterListen, Routes: pc.Routes,
		PeerTimeout: pc.PeerTimeout.Duration, Sink: g, Totals: g.localTotals,
		Status: func() (string, bool) { return *g.snapshotURL.Load(), d.Ready() }, Logger: g.log}
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
	for _, c := range g.met.Collectors() {
		if err := reg.Register(c); err != nil {
			n.Close()
			return err
		}
	}
	if err := n.Register(reg); err != nil {
		n.Close()
		return err
	}
	g.node = n
	return nil
}

// SetSnapshotURL is where peers fetch this router's snapshot.
func (g *Group) SetSnapshotURL(u string) { g.snapshotURL.Store(&u) }

// ClusterAddr is the embedded NATS server's route address ("" without one).
func (g *Group) ClusterAddr() string { return g.node.ClusterAddr() }

// Peer is one live peer router as the sync sees it (its name, readiness, snapshot address).
type Peer = peersync.Peer

// Peers returns the live peers.
func (g *Group) Peers() []Peer { return g.node.Peers() }

// Close leaves the group (nil: alone, nothing to leave).
func (g *Group) Close() {
	if g != nil && g.node != nil {
		g.node.Close()
	}
}

// localTotals is this router's own load per replica (what it publishes).
func (g *Group) localTotals() []peersync.Total {
	reps := g.d.Fleet.Replicas()
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

// Load is what the live peers have in flight on the replica (zero for a nil group: alone).
func (g *Group) Load(replica string) load.Load {
	if g == nil {
		return load.Load{}
	}
	l := g.share.Of(replica)
	return load.Load{PrefillTokens: l.Prefill, DecodeTokens: l.Decode, Running: l.Running}
}

// Prefill is the prefill the live peers have routed to the replica and not seen reach a first
// token (load.Options.PeerPrefill).
func (g *Group) Prefill(replica string) int64 { return g.share.Of(replica).Prefill }

// Observer publishes the ledger's transitions of this router's requests to its peers (register
// it with the ledger; it publishes nothing until Start has joined).
func (g *Group) Observer() load.Observer { return observer{g} }

// observer: router/peersync batches the deltas; Record never waits on the network. The ledger's
// id names the request: unique in this router process, which is all a peer needs.
type observer struct{ g *Group }

func (o observer) record(d peersync.Delta) {
	if n := o.g.node; n != nil {
		n.Record(d)
	}
}

func (o observer) Routed(id load.ID, r *load.Record) {
	o.record(peersync.Delta{Kind: peersync.Routed, Request: uint64(id), Replica: r.Replica.Name,
		Prefill: int64(r.Uncached), Tokens: int64(r.Held), Keys: slices.Clone(r.Keys)}) // queued past the call: the Record's keys are reused once the request ends
}

func (o observer) FirstToken(id load.ID, r *load.Record, _ time.Time) {
	o.record(peersync.Delta{Kind: peersync.FirstToken, Request: uint64(id), Replica: r.Replica.Name, Tokens: int64(r.Held)})
}

func (o observer) Done(id load.ID, r *load.Record, _ *load.Usage) {
	o.record(peersync.Delta{Kind: peersync.Done, Request: uint64(id), Replica: r.Replica.Name})
}

func (o observer) Failed(id load.ID, r *load.Record) {
	o.record(peersync.Delta{Kind: peersync.Failed, Request: uint64(id), Replica: r.Replica.Name})
}

// ApplyPeer folds a peer's batch into the share and its routed requests into the ledger: their
// predicted blocks into the predicted side index, so a sibling that reaches another router
// still co-locates, and their uncached prefill into the balance windows, so the kv bounds weigh
// the fleet's routed work and not this router's part of it. A peer's first token or failure on
// a replica, or its routing to a replica with no prefill pending, is progress of that
// replica's prefill (load.Ledger.PeerProgress), so kv's drain credit reads the replica's last
// progress, not this router's. (peersync.Sink.)
func (g *Group) ApplyPeer(b *peersync.Batch, now time.Time) {
	var byName map[string]*fleet.Replica
	lookup := func(name string) *fleet.Replica {
		if byName == nil {
			byName = map[string]*fleet.Replica{}
			for _, r := range g.d.Fleet.Replicas() {
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
			idle[d.Replica] = r.Load.Load().PrefillTokens == 0 && g.share.Of(d.Replica).Prefill == 0
		}
	}
	if !g.share.Apply(b, now) {
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
			g.d.Ledger.RoutedPeer(r.Load, d.Keys, int(d.Prefill))
			if idle[d.Replica] {
				g.d.Ledger.PeerProgress(r.Load)
				idle[d.Replica] = false
			}
		case peersync.FirstToken, peersync.Failed:
			// Done is not progress: it comes after the first token (the prefill moved then),
			// and a request that ends before one is rare enough to leave to the peer's next
			// first token.
			g.d.Ledger.PeerProgress(r.Load)
		}
	}
}

// Expire forgets the peers silent since deadline (peersync.Sink).
func (g *Group) Expire(deadline time.Time) []string { return g.share.Expire(deadline) }

// Info is the router's view of its group in /debug/engines.
type Info struct {
	ID string `json:"id"`
	// SeededFrom names the peer whose snapshot this router started from ("" when none).
	SeededFrom string          `json:"seeded_from,omitempty"`
	Peers      []peersync.Peer `json:"peers"`
	// Routes is how many NATS routes the embedded server holds.
	Routes int `json:"routes"`
	// SyncFaults: load changes dropped, batches not published, lost or undecodable.
	SyncFaults peersync.SyncFaults `json:"sync_faults"`
}

// Info is the group as /debug/engines shows it.
func (g *Group) Info() Info {
	g.mu.Lock()
	from := g.seededFrom
	g.mu.Unlock()
	return Info{ID: g.id, SeededFrom: from, Peers: g.node.Peers(), Routes: g.node.Routes(), SyncFaults: g.node.Faults()}
}
