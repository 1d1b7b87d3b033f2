package app

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/router/backlog"
)

// backlog is the fleet's queued prefill in seconds and its utilisation (router/backlog), from
// the same ledger figures the kv policy reads: this router's load plus its peers' shared
// totals, the replica's last progress, the measured drain rate and the balance windows.
func (s *Router) backlog(reps []*replica) backlog.Fleet {
	now := s.now()
	ms := make([]backlog.Member, len(reps))
	for i, r := range reps {
		ms[i] = backlog.Member{ID: r.ID, Name: r.Name, Ready: r.View().Ready && r.Eng.Health.Healthy(now),
			PeerPrefill: s.peer.Load(r.Name).PrefillTokens}
	}
	return backlog.FromLedger(s.ledger, ms, now.Sub(s.started), now)
}

// backlogCollector reads the backlog at scrape time. The seconds and the utilisation are left
// out while the drain rate is not measured (no first token yet), so that a query falls back to
// the engines' queue length (`or`) rather than reading a false zero.
type backlogCollector struct {
	s                              *Router
	fleetSec, repSec, tokens, util *prometheus.Desc
	measured                       *prometheus.Desc
}

func newBacklogCollector(s *Router) *backlogCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("kvroute_router_"+name, help, append([]string{"model_name"}, labels...), nil)
	}
	return &backlogCollector{s: s,
		fleetSec: d("backlog_seconds", "Prefill queued on the model's replicas, in seconds of their measured drain (pending uncached prefill after kv's drain credit, over the drain rate), summed over replicas; with several routers the fleet's, not this router's share (take the max over router pods). Absent until the drain rate is measured."),
		repSec:   d("replica_backlog_seconds", "Prefill queued on one replica in seconds of the measured drain (as backlog_seconds). Absent until the drain rate is measured.", "engine", "rank"),
		tokens:   d("backlog_prefill_tokens", "Uncached prefill tokens routed to the model's replicas and still ahead of their first tokens (kv's pending prefill after its drain credit), all routers'."),
		util:     d("prefill_utilisation", "Uncached prefill routed per second over the balance window against what the ready replicas drain per second: above 1 the backlog grows. Absent until the drain rate is measured or while no replica is ready."),
		measured: d("backlog_measured", "1 when the prefill drain rate is measured and backlog_seconds is exported, else 0."),
	}
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.fleetSec, c.repSec, c.tokens, c.util, c.measured} {
		ch <- d
	}
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	reps := c.s.reps()
	f := c.s.backlog(reps)
	model := c.s.o.Model
	measured := 0.0
	if f.Measured {
		measured = 1
		ch <- prometheus.MustNewConstMetric(c.fleetSec, prometheus.GaugeValue, f.Seconds, model)
		if f.Ready > 0 {
			ch <- prometheus.MustNewConstMetric(c.util, prometheus.GaugeValue, f.Utilisation, model)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.measured, prometheus.GaugeValue, measured, model)
	ch <- prometheus.MustNewConstMetric(c.tokens, prometheus.GaugeValue, f.PendingTokens, model)
	if !f.Measured {
		return
	}
	for i, rb := range f.Replicas {
		ch <- prometheus.MustNewConstMetric(c.repSec, prometheus.GaugeValue, rb.Seconds, model, reps[i].Eng.Name, strconv.Itoa(reps[i].Rank))
	}
}

// BacklogDescs describes the backlog's metrics without a router, for the checks that every
// metric kvrouter can expose is documented (test/ship).
func BacklogDescs(ch chan<- *prometheus.Desc) { newBacklogCollector(nil).Describe(ch) }

// Held is how many requests the hold keeps now for want of a ready replica (the
// kvroute_router_held_requests gauge): the demand the router reports to its KVRoutedModel.
func (s *Router) Held() int { return s.hold.Waiting() }

// BacklogSeconds is the fleet's backlog as /metrics exports it (kvroute_router_backlog_seconds),
// and whether the drain rate is measured (else there is no figure).
func (s *Router) BacklogSeconds() (float64, bool) {
	f := s.backlog(s.reps())
	return f.Seconds, f.Measured
}
