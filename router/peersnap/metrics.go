package peersnap

import "github.com/prometheus/client_golang/prometheus"

// Results of a starting router's search for a peer's snapshot (Metrics.Taken's label).
const (
	ResultApplied = "applied"
	ResultNoPeer  = "no_peer"
	ResultFailed  = "failed"
)

// Metrics count the snapshots a router took and served.
type Metrics struct {
	// Taken: snapshots a starting router sought from its peers, by result.
	Taken *prometheus.CounterVec
	// Served: snapshots this router served to starting peers.
	Served prometheus.Counter
}

// NewMetrics returns the snapshot counters, unregistered.
func NewMetrics() *Metrics {
	m := &Metrics{
		Taken: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "peer_snapshots_total",
			Help: "Snapshots a starting router sought from its peers, by result (applied, no_peer, failed)."}, []string{"result"}),
		Served: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "peer_snapshots_served_total",
			Help: "Index snapshots this router served to starting peers."}),
	}
	for _, r := range []string{ResultApplied, ResultNoPeer, ResultFailed} {
		m.Taken.WithLabelValues(r) // present at 0, so an alert can use rate() from the start
	}
	return m
}

// Collectors are the metrics to register (and for test/ship to list).
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Taken, m.Served}
}
