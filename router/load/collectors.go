package load

import "github.com/prometheus/client_golang/prometheus"

// Collectors put the engine timing the ledger fits from first tokens on /metrics: the kv
// policy's prefill drain rate and its attention weight. Both steer every decision, so a drift (a
// slower engine image, a new GPU, a fit gone wrong) must be visible, not only felt.
func (l *Ledger) Collectors() []prometheus.Collector {
	g := func(name, help string, read func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kvroute_router", Name: name, Help: help}, read)
	}
	return []prometheus.Collector{
		g("prefill_drain_tokens_per_second", "Rate at which routed uncached prefill reaches first tokens while some is pending, measured by the ledger (kv's drain credit); 0 before the first first token.",
			func() float64 { return l.cal.Read().DrainTokensPerS }),
		g("prefill_drain_attention_weight", "Tokens of prefill one token pair of attention costs at the drain rate, measured beside it from first tokens of different prompt lengths (kv's drain credit); 0 while they do not tell it apart.",
			func() float64 { return l.cal.Read().DrainAttentionWeight }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "ledger_records_expired_total",
			Help: "Routed requests the ledger ended because their end was never reported within the request timeout and a minute (a lost release: their load would have stayed on the replica); should stay 0."},
			func() float64 { return float64(l.expired.Load()) }),
	}
}
