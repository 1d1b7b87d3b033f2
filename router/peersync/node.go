package peersync

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configure a Node. Zero values take the defaults named.
type Options struct {
	// ID names this router among its peers (the pod name); required.
	ID string
	// Subject is where the routers of one model publish ("kvroute.load").
	Subject string
	// URL, when set, is an external NATS server (nats:// or tls://); nothing is embedded.
	URL string
	// ClusterListen is the embedded server's cluster (route) address, host:port.
	ClusterListen string
	// ClusterName names the NATS cluster; every router of a model uses the same ("kvroute").
	ClusterName string
	// Routes are the peers' cluster addresses (nats-route://host:port or host:port). A host that
	// is a headless Service's name resolves to its pods: the embedded server connects to one of
	// them at random, excluding itself, and NATS's gossip connects the rest, so one name reaches
	// every router. An explicit route is retried for as long as the router runs (a partition
	// heals by itself).
	Routes []string
	// TLS, when set, secures the routes between embedded servers (mutual TLS), or the connection
	// to an external URL.
	TLS *TLSFiles
	// Flush is how often buffered changes are published (20ms); Heartbeat how often a batch goes
	// out with no change (500ms); PeerTimeout how long a silent peer's share counts (3s).
	Flush, Heartbeat, PeerTimeout time.Duration
	// RoutedFlush bounds how long a routed request's change (its replica and predicted blocks)
	// waits before it is published (2ms), sooner than Flush: siblings of one prefix arriving
	// at other routers within milliseconds must see where it went, or each picks by load and
	// the burst lands on more engines. It is also
	// the shortest interval between two batches, which bounds the batch rate.
	RoutedFlush time.Duration
	// MaxKeys bounds the predicted blocks carried per routed request (256).
	MaxKeys int
	// MaxPending bounds the changes buffered between flushes (65536); past it a change is
	// dropped and counted (the next batch's totals still carry its load).
	MaxPending int
	// Sink takes peers' batches (required).
	Sink LoadSink
	// Totals returns this router's load per replica at flush time (required).
	Totals func() []Total
	// Status returns where this router serves its snapshot and whether it is ready.
	Status func() (snapshotURL string, ready bool)
	Now    func() time.Time
	Logger *slog.Logger
}

// publishTimeout bounds a write to the NATS connection (nats.go's default is a minute). A server
// that stops reading for longer fails the write: the connection reconnects, the batch counts as
// a publish error, and the next batch's totals repair the peers' share.
const publishTimeout = time.Second

// TLSFiles are PEM files: this router's certificate and key and the CA its peers' certificates
// are checked against.
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
}

// Node is one router's end of the load sync: an embedded NATS server (or a connection to an
// external one), the publisher of this router's changes and the subscriber to its peers'.
type Node struct {
	o     Options
	log   *slog.Logger
	ns    *server.Server // nil with an external URL
	nc    *nats.Conn
	sub   *nats.Subscription
	epoch int64

	mu      sync.Mutex
	pending []Delta
	seq     uint64
	buf     []byte

	peersMu sync.Mutex
	peers   map[string]*peerInfo

	stop chan struct{}
	done chan struct{}
	// kick asks the flusher for an early batch (a routed change; Options.RoutedFlush).
	kick chan struct{}

	met       nodeMetrics
	routed    atomic.Uint64
	sentBytes atomic.Uint64
	faults    [numFaults]atomic.Uint64
	logged    [numFaults]atomic.Bool
}

// The sync's faults, each counted on its metric, in /debug/engines (Faults) and logged once.
const (
	faultDropped = iota // changes not published: the pending queue full, or a batch over NATS's payload
	faultPublish        // a batch NATS refused to publish
	faultDecode         // a peer's batch that did not decode
	faultLost           // a peer's batches that never arrived (sequence gaps)
	faultStale          // a peer's batch at or before one already applied (delivered again)
	numFaults
)

var faultWhy = [numFaults]string{
	"load changes not published (queue full or batch too large); peers see this router's totals only, counted in kvroute_router_peer_sync_dropped_total",
	"a load batch was not published; peers keep the last share until it expires, counted in kvroute_router_peer_sync_publish_errors_total",
	"a peer's load batch did not decode (version skew?); counted in kvroute_router_peer_sync_decode_errors_total",
	"a peer's load batches were lost in transit; its next totals correct the share, counted in kvroute_router_peer_sync_lost_batches_total",
	"a peer's load batch arrived again or behind a newer one and was ignored (its changes were applied once), counted in kvroute_router_peer_sync_stale_batches_total",
}

// SyncFaults is what went wrong in the sync since start, for /debug/engines.
type SyncFaults struct {
	DroppedChanges uint64 `json:"dropped_changes"`
	PublishErrors  uint64 `json:"publish_errors"`
	DecodeErrors   uint64 `json:"decode_errors"`
	LostBatches    uint64 `json:"lost_batches"`
	StaleBatches   uint64 `json:"stale_batches"`
}

// fault counts n of one kind (the metric c too) and logs the first of each kind.
func (n *Node) fault(kind int, c prometheus.Counter, count uint64, args ...any) {
	n.faults[kind].Add(count)
	c.Add(float64(count))
	if !n.logged[kind].Swap(true) {
		n.log.Warn(faultWhy[kind]+"; further ones are counted, not logged", args...)
	}
}

// Faults returns the sync's fault counts.
func (n *Node) Faults() SyncFaults {
	return SyncFaults{DroppedChanges: n.faults[faultDropped].Load(), PublishErrors: n.faults[faultPublish].Load(),
		DecodeErrors: n.faults[faultDecode].Load(), LostBatches: n.faults[faultLost].Load(), StaleBatches: n.faults[faultStale].Load()}
}

type peerInfo struct {
	epoch int64
	seq   uint64
	seen  time.Time
	url   string
	ready bool
}

// Peer is what this router knows of one live peer.
type Peer struct {
	Name        string    `json:"name"`
	SnapshotURL string    `json:"snapshot_url,omitempty"`
	Ready       bool      `json:"ready"`
	Seen        time.Time `json:"seen"`
}

// Start starts the node: the embedded server (joining its routes) or the external connection,
// the subscription and the flusher.
func Start(o Options) (*Node, error) {
	if o.ID == "" || o.Sink == nil || o.Totals == nil {
		return nil, errors.New("peersync: ID, Sink and Totals are required")
	}
	if o.Subject == "" {
		o.Subject = "kvroute.load"
	}
	if o.ClusterName == "" {
		o.ClusterName = "kvroute"
	}
	if o.Flush <= 0 {
		o.Flush = 20 * time.Millisecond
	}
	if o.RoutedFlush <= 0 || o.RoutedFlush > o.Flush {
		o.RoutedFlush = min(2*time.Millisecond, o.Flush)
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 500 * time.Millisecond
	}
	if o.PeerTimeout <= 0 {
		o.PeerTimeout = 3 * time.Second
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = 256
	}
	if o.MaxPending <= 0 {
		o.MaxPending = 1 << 16
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Status == nil {
		o.Status = func() (string, bool) { return "", false }
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	n := &Node{o: o, log: log, epoch: time.Now().UnixNano(), peers: map[string]*peerInfo{},
		stop: make(chan struct{}), done: make(chan struct{}), kick: make(chan struct{}, 1), met: newNodeMetrics()}
	var err error
	if o.URL == "" {
		if err = n.embed(); err != nil {
			return nil, err
		}
		n.nc, err = nats.Connect("", nats.InProcessServer(n.ns), nats.Name(o.ID), nats.MaxReconnects(-1),
			nats.FlusherTimeout(publishTimeout))
	} else {
		opts := []nats.Option{nats.Name(o.ID), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
			// Changes held through a disconnection would arrive stale: the totals of the next
			// batch after reconnecting are what peers need.
			nats.ReconnectBufSize(-1),
			nats.FlusherTimeout(publishTimeout)}
		if t := o.TLS; t != nil {
			opts = append(opts, nats.ClientCert(t.CertFile, t.KeyFile), nats.RootCAs(t.CAFile))
		}
		// RetryOnFailedConnect: the router starts without the external server and joins it
		// when it comes; its decisions use local load meanwhile.
		opts = append(opts, nats.RetryOnFailedConnect(true))
		n.nc, err = nats.Connect(o.URL, opts...)
	}
	if err != nil {
		n.shutdownServer()
		return nil, fmt.Errorf("peersync: connect: %w", err)
	}
	n.sub, err = n.nc.Subscribe(o.Subject, n.receive)
	if err == nil {
		// A slow handler must not hold NATS's memory without bound: past these the client drops
		// (and counts) messages; the next batch's totals repair the share.
		err = n.sub.SetPendingLimits(4096, 64<<20)
	}
	if err != nil {
		n.nc.Close()
		n.shutdownServer()
		return nil, fmt.Errorf("peersync: subscribe: %w", err)
	}
	go n.flushLoop()
	return n, nil
}

// embed starts the embedded NATS server: its client port on loopback only, at a port the kernel
// picks (this router talks to it in process; nats-server opens routes only once a client
// listener is up), and a cluster port for the peers' routes.
func (n *Node) embed() error {
	o := n.o
	so := &server.Options{
		ServerName: o.ID, Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true,
		MaxPayload: 1 << 20,
	}
	if o.ClusterListen != "" {
		host, port, err := net.SplitHostPort(o.ClusterListen)
		if err != nil {
			return fmt.Errorf("peersync: cluster listen %q: %w", o.ClusterListen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return fmt.Errorf("peersync: cluster listen %q: %w", o.ClusterListen, err)
		}
		if p == 0 {
			p = -1 // a random port (tests)
		}
		so.Cluster = server.ClusterOpts{Name: o.ClusterName, Host: host, Port: p}
		for _, r := range o.Routes {
			u, err := routeURL(r)
			if err != nil {
				return err
			}
			so.Routes = append(so.Routes, u)
		}
		if t := o.TLS; t != nil {
			tc, err := serverTLS(t)
			if err != nil {
				return err
			}
			so.Cluster.TLSConfig = tc
			so.Cluster.TLSTimeout = 2
		}
	}
	ns, err := server.NewServer(so)
	if err != nil {
		return fmt.Errorf("peersync: embedded NATS: %w", err)
	}
	nl := newNATSLog(n.log)
	ns.SetLogger(nl, false, false)
	go ns.Start()
	for deadline := time.Now().Add(10 * time.Second); !ns.ReadyForConnections(100 * time.Millisecond); {
		select {
		case msg := <-nl.fatal: // e.g. "Error listening on router port: 6222 - ... address already in use"
			ns.Shutdown()
			return fmt.Errorf("peersync: embedded NATS: %s", msg)
		default:
		}
		if time.Now().After(deadline) {
			ns.Shutdown()
			return errors.New("peersync: embedded NATS did not start in 10s")
		}
	}
	n.ns = ns
	return nil
}

func routeURL(r string) (*url.URL, error) {
	s := r
	if u, err := url.Parse(r); err != nil || u.Scheme == "" || u.Host == "" {
		s = "nats-route://" + r
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.Port() == "" {
		return nil, fmt.Errorf("peersync: route %q is not host:port or nats-route://host:port", r)
	}
	return u, nil
}

func serverTLS(t *TLSFiles) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("peersync: tls: %w", err)
	}
	pem, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, fmt.Errorf("peersync: tls: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("peersync: tls: no certificate in %s", t.CAFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}, nil
}

// ClusterAddr is the embedded server's route address ("" without one): tests listen on port 0.
func (n *Node) ClusterAddr() string {
	if n.ns == nil {
		return ""
	}
	if a := n.ns.ClusterAddr(); a != nil {
		return a.String()
	}
	return ""
}

// Routes is how many routes the embedded server holds (0 with an external URL).
func (n *Node) Routes() int {
	if n.ns == nil {
		return 0
	}
	return n.ns.NumRoutes()
}

// Record buffers one local change for the next batch. It never blocks on the network.
func (n *Node) Record(d Delta) {
	if len(d.Keys) > n.o.MaxKeys {
		d.Keys = d.Keys[:n.o.MaxKeys]
	}
	if d.Kind == Routed {
		n.routed.Add(1)
	}
	n.mu.Lock()
	if len(n.pending) >= n.o.MaxPending {
		n.mu.Unlock()
		n.fault(faultDropped, n.met.dropped, 1, "pending", n.o.MaxPending)
		return
	}
	n.pending = append(n.pending, d)
	n.mu.Unlock()
	if d.Kind == Routed {
		select { // a kick already waiting covers this change too
		case n.kick <- struct{}{}:
		default:
		}
	}
}

func (n *Node) flushLoop() {
	defer close(n.done)
	t := time.NewTicker(n.o.Flush)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		case <-n.kick:
			// A routed change: publish it within RoutedFlush of the last batch, not at the
			// next tick.
			if wait := min(n.o.RoutedFlush-n.o.Now().Sub(last), n.o.RoutedFlush); wait > 0 {
				select {
				case <-n.stop:
					return
				case <-time.After(wait):
				}
			}
		}
		now := n.o.Now()
		n.mu.Lock()
		empty := len(n.pending) == 0
		n.mu.Unlock()
		if empty && now.Sub(last) < n.o.Heartbeat {
			n.expire(now)
			continue
		}
		n.flush(now)
		last = now
		n.expire(now)
	}
}

// flush publishes the buffered changes and the current totals as one batch. Only the swap of
// the pending changes is under n.mu: Record (on the request path) must never wait for the
// totals callback, the encoding or NATS, whose Publish writes to the socket when its buffer is
// full and then waits up to publishTimeout on a stalled server. seq and buf belong to the
// flusher goroutine alone.
func (n *Node) flush(now time.Time) {
	n.mu.Lock()
	deltas := n.pending
	n.pending = nil
	n.mu.Unlock()
	n.seq++
	url, ready := n.o.Status()
	b := Batch{Peer: n.o.ID, Epoch: n.epoch, Seq: n.seq, Sent: now.UnixNano(), SnapshotURL: url, Ready: ready,
		Deltas: deltas, Totals: n.o.Totals()}
	n.buf = EncodeBatch(n.buf[:0], &b)
	// Over NATS's max payload the batch is split: the totals go out alone and the changes are
	// dropped (counted); peers lose only the predicted blocks of those requests.
	if len(n.buf) > 1<<20-4096 {
		n.fault(faultDropped, n.met.dropped, uint64(len(b.Deltas)), "batch_bytes", len(n.buf))
		b.Deltas = nil
		n.buf = EncodeBatch(n.buf[:0], &b)
	}
	payload := n.buf
	err := n.nc.Publish(n.o.Subject, payload)
	if err != nil {
		n.fault(faultPublish, n.met.publishErrors, 1, "err", err)
		return
	}
	n.sentBytes.Add(uint64(len(payload)))
	n.met.bytes.WithLabelValues("sent").Add(float64(len(payload)))
	n.met.batches.WithLabelValues("sent").Inc()
}

// receive applies one peer's batch (NATS's delivery goroutine).
func (n *Node) receive(m *nats.Msg) {
	now := n.o.Now()
	n.met.bytes.WithLabelValues("received").Add(float64(len(m.Data)))
	b, err := DecodeBatch(m.Data)
	if err != nil {
		n.fault(faultDecode, n.met.decodeErrors, 1, "err", err)
		return
	}
	if b.Peer == n.o.ID && b.Epoch == n.epoch {
		return // our own
	}
	n.met.batches.WithLabelValues("received").Inc()
	n.met.lag.Observe(max(0, now.Sub(time.Unix(0, b.Sent)).Seconds()))
	n.peersMu.Lock()
	p := n.peers[b.Peer]
	if p == nil || p.epoch != b.Epoch {
		if p == nil {
			n.log.Info("router peer seen", "peer", b.Peer)
		}
		p = &peerInfo{epoch: b.Epoch}
		n.peers[b.Peer] = p
	} else if b.Seq <= p.seq {
		// Applying it again would count its routed requests twice in the balance windows.
		n.peersMu.Unlock()
		n.fault(faultStale, n.met.stale, 1, "peer", b.Peer, "seq", b.Seq, "applied", p.seq)
		return
	} else if b.Seq > p.seq+1 {
		n.fault(faultLost, n.met.lost, b.Seq-p.seq-1, "peer", b.Peer)
	}
	p.seq, p.seen, p.url, p.ready = b.Seq, now, b.SnapshotURL, b.Ready
	n.met.peers.Set(float64(len(n.peers)))
	n.peersMu.Unlock()
	n.o.Sink.ApplyPeer(b, now)
}

// expire drops peers silent for PeerTimeout, here and in the sink.
func (n *Node) expire(now time.Time) {
	deadline := now.Add(-n.o.PeerTimeout)
	n.peersMu.Lock()
	for name, p := range n.peers {
		if p.seen.Before(deadline) {
			delete(n.peers, name)
			n.log.Warn("router peer silent; its load share dropped", "peer", name, "silent_for", now.Sub(p.seen).Round(time.Millisecond))
		}
	}
	n.met.peers.Set(float64(len(n.peers)))
	n.peersMu.Unlock()
	n.o.Sink.Expire(deadline)
}

// Peers returns the live peers, by name.
func (n *Node) Peers() []Peer {
	n.peersMu.Lock()
	defer n.peersMu.Unlock()
	out := make([]Peer, 0, len(n.peers))
	for name, p := range n.peers {
		out = append(out, Peer{Name: name, SnapshotURL: p.url, Ready: p.ready, Seen: p.seen})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// SentBytesPer1kRouted is the bytes this router published per 1,000 requests it routed, over its
// life: the sync's cost in bytes per second at 1,000 requests per second.
func (n *Node) SentBytesPer1kRouted() float64 {
	r := n.routed.Load()
	if r == 0 {
		return 0
	}
	return float64(n.sentBytes.Load()) * 1000 / float64(r)
}

// Close stops publishing and leaves the cluster.
func (n *Node) Close() {
	select {
	case <-n.stop:
		return
	default:
	}
	close(n.stop)
	<-n.done
	if n.sub != nil {
		_ = n.sub.Unsubscribe()
	}
	n.nc.Close()
	n.shutdownServer()
}

func (n *Node) shutdownServer() {
	if n.ns != nil {
		n.ns.Shutdown()
		n.ns.WaitForShutdown()
	}
}

// nodeMetrics are the sync's collectors (kvroute_router_peer*).
type nodeMetrics struct {
	peers                                             prometheus.Gauge
	lag                                               prometheus.Histogram
	bytes, batches                                    *prometheus.CounterVec
	lost, stale, dropped, decodeErrors, publishErrors prometheus.Counter
}

func newNodeMetrics() nodeMetrics {
	const ns = "kvroute_router"
	return nodeMetrics{
		peers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "peers",
			Help: "Router peers whose load batches arrived within the peer timeout."}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "peer_sync_lag_seconds",
			Help:    "Time from a peer's flush to this router applying the batch (the peers' clocks).",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "peer_sync_bytes_total",
			Help: "Load-sync payload bytes, by direction (sent, received)."}, []string{"direction"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "peer_sync_batches_total",
			Help: "Load-sync batches, by direction (sent, received)."}, []string{"direction"}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "peer_sync_lost_batches_total",
			Help: "Peers' batches that never arrived (sequence gaps; the next batch's totals repair the share)."}),
		stale: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "peer_sync_stale_batches_total",
			Help: "Peers' batches at or before one already applied (delivered again), ignored."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "peer_sync_dropped_changes_total",
			Help: "Local changes not published (buffer full or batch over the payload limit; totals still carried)."}),
		decodeErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "peer_sync_decode_errors_total",
			Help: "Messages on the load subject that did not decode (dropped)."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "peer_sync_publish_errors_total",
			Help: "Batches NATS refused to publish (disconnected from an external server)."}),
	}
}

func (m nodeMetrics) collectors(per1k func() float64) []prometheus.Collector {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kvroute_router", Name: "peer_sync_sent_bytes_per_1k_requests",
		Help: "Load-sync bytes this router published per 1,000 requests it routed, over its life: bytes/s at 1,000 requests/s."}, per1k)
	return []prometheus.Collector{m.peers, m.lag, m.bytes, m.batches, m.lost, m.stale, m.dropped, m.decodeErrors, m.publishErrors, g}
}

// Register adds the sync's metrics to reg, with the bytes-per-1k-requests gauge.
func (n *Node) Register(reg prometheus.Registerer) error {
	for _, c := range n.met.collectors(n.SentBytesPer1kRouted) {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Collectors returns unregistered collectors of every metric a Node exports, for listing their
// names (docs checks); their values stay zero.
func Collectors() []prometheus.Collector {
	return newNodeMetrics().collectors(func() float64 { return 0 })
}
