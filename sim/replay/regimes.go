package replay

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// RegimeOptions shape a generated regime.
type RegimeOptions struct {
	Requests int           // total requests (default 160)
	Rate     float64       // mean arrivals per second of wall time (default 40)
	Replicas int           // fleet size the regime is meant for (scale-up: the final size)
	Seed     uint64        // changes arrivals, group order and unique blocks
	Warmup   time.Duration // scale-up: warm-up window of the new replicas (default 2 s)
}

func (o *RegimeOptions) defaults() {
	if o.Requests <= 0 {
		o.Requests = 160
	}
	if o.Rate <= 0 {
		o.Rate = 40
	}
	if o.Replicas <= 0 {
		o.Replicas = 4
	}
	if o.Warmup <= 0 {
		o.Warmup = 2 * time.Second
	}
}

// Regimes are the generated workloads `--regime` accepts, each with the question it answers.
var Regimes = map[string]string{
	"no-reuse":   "every prompt unique: nothing to gain from the cache; the router must not lose to load balancing",
	"hot-prefix": "one long system prompt shared by every request plus a unique question: any replica can hold it, balance decides",
	"siblings":   "bursts of 8 requests with the same long prefix arriving at once: the first one's blocks are not yet announced when the others are routed",
	"scale-up":   "shared-prefix groups on 4 replicas, grown to 8 mid-run through the engines file with warmup-until: do new replicas take traffic",
	"tenants":    "4 tenants with the same system prompt text but their own LoRA adapter and cache salt: blocks must not be shared across tenants",
	"eviction":   "Zipf-popular documents whose prefixes fill 2.4 replicas' caches (one copy fits the fleet, two do not), reused seconds apart: the engines evict LRU, and a view that sees only its own routings keeps believing what they evicted",
}

// RegimeNames lists the regimes in a stable order.
func RegimeNames() []string {
	var ns []string
	for n := range Regimes {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

// Sizes of the generated prompts, in trace blocks (512 trace tokens each).
const (
	regimePrefixBlocks = 12 // a 6k-token system prompt / shared document
	regimeSuffixBlocks = 3  // a 1.5k-token question
	regimeOutput       = 200
	siblingsBurst      = 8
	tenantCount        = 4
)

// The eviction regime's shape (EvictionGroups). The sizes are in trace blocks against the
// benchmark's replica of 600 trace blocks of KV (docs/benchmarks.md, kvbench replay's
// --sim-num-gpu-blocks default).
const (
	ReplicaCacheTraceBlocks = 600
	evictionPrefixBlocks    = 32  // a 16k-token document
	evictionSuffixBlocks    = 4   // a 2k-token question: unique, it churns the LRU on every request
	evictionFleetShare      = 0.6 // the documents' prefixes fill this share of the fleet's KV
	EvictionZipfS           = 0.8 // popularity of document rank k is proportional to k^-s
)

// EvictionGroups is how many documents the eviction regime draws from on a fleet of replicas:
// together their prefixes fill evictionFleetShare of the fleet's KV, so one copy of each fits
// the fleet with room for the questions' churn, two copies do not, and with 3 replicas or more
// they exceed one replica's cache.
func EvictionGroups(replicas int) int {
	return int(math.Ceil(evictionFleetShare * float64(replicas*ReplicaCacheTraceBlocks) / evictionPrefixBlocks))
}

// Regime generates the named workload. Hash ids are drawn from disjoint ranges per role (shared
// prefixes below 1<<32, unique blocks above), so only the intended blocks repeat.
func Regime(name string, o RegimeOptions) (Workload, error) {
	o.defaults()
	g := &gen{rng: rand.New(rand.NewPCG(o.Seed, 0x5eed)), next: 1 << 32}
	w := Workload{Name: name}
	arrivals := g.poisson(o.Requests, o.Rate)
	switch name {
	case "no-reuse":
		for _, at := range arrivals {
			w.Requests = append(w.Requests, g.request(at, nil, regimePrefixBlocks+regimeSuffixBlocks))
		}
	case "hot-prefix":
		hot := g.prefix(0, regimePrefixBlocks)
		for _, at := range arrivals {
			w.Requests = append(w.Requests, g.request(at, hot, regimeSuffixBlocks))
		}
	case "siblings":
		// Bursts at Poisson times of mean gap burst/rate, so the request rate stays o.Rate.
		bursts := g.poisson((o.Requests+siblingsBurst-1)/siblingsBurst, o.Rate/siblingsBurst)
		for b, at := range bursts {
			p := g.prefix(uint64(b), regimePrefixBlocks)
			for k := 0; k < siblingsBurst && len(w.Requests) < o.Requests; k++ {
				w.Requests = append(w.Requests, g.request(at, p, regimeSuffixBlocks))
			}
		}
	case "scale-up":
		// 5 prompts per group, groups revisited: llm-d's shared-prefix shape, small.
		groups := max(o.Requests/10, 4)
		prefixes := make([][]uint64, groups)
		for i := range prefixes {
			prefixes[i] = g.prefix(uint64(i), regimePrefixBlocks)
		}
		for _, at := range arrivals {
			w.Requests = append(w.Requests, g.request(at, prefixes[g.rng.IntN(groups)], regimeSuffixBlocks))
		}
		from := max(o.Replicas/2, 1)
		w.ScaleUp = &ScaleUp{At: arrivals[len(arrivals)/3], From: from, To: o.Replicas, Warmup: o.Warmup}
	case "tenants":
		shared := g.prefix(0, regimePrefixBlocks) // the same text for every tenant
		for t := 0; t < tenantCount; t++ {
			w.Adapters = append(w.Adapters, fmt.Sprintf("tenant-%d", t))
		}
		for _, at := range arrivals {
			t := g.rng.IntN(tenantCount)
			r := g.request(at, shared, regimeSuffixBlocks)
			r.Tenant, r.Model, r.CacheSalt = w.Adapters[t], w.Adapters[t], fmt.Sprintf("salt-%d", t)
			w.Requests = append(w.Requests, r)
		}
	case "eviction":
		// Document k (by popularity rank) is drawn with probability proportional to (k+1)^-s:
		// the head is reused within a second and stays cached anywhere, the tail is reused tens
		// of seconds apart, after its replica's LRU has turned over. The approximate view ages a
		// replica's blocks by the routings it made itself; it cannot see the other routers'
		// placements once their predictions expire (5 s), nor what their traffic evicted.
		groups := EvictionGroups(o.Replicas)
		cdf := zipfCDF(groups, EvictionZipfS)
		prefixes := make([][]uint64, groups)
		for i := range prefixes {
			prefixes[i] = g.prefix(uint64(i), evictionPrefixBlocks)
		}
		for _, at := range arrivals {
			k := sort.SearchFloat64s(cdf, g.rng.Float64())
			w.Requests = append(w.Requests, g.request(at, prefixes[min(k, groups-1)], evictionSuffixBlocks))
		}
	default:
		return Workload{}, fmt.Errorf("unknown regime %q (known: %s)", name, strings.Join(RegimeNames(), ", "))
	}
	return w, nil
}

// zipfCDF is the cumulative distribution of ranks 0..n-1 with weights (k+1)^-s.
func zipfCDF(n int, s float64) []float64 {
	cdf := make([]float64, n)
	sum := 0.0
	for k := range cdf {
		sum += math.Pow(float64(k+1), -s)
		cdf[k] = sum
	}
	for k := range cdf {
		cdf[k] /= sum
	}
	return cdf
}

type gen struct {
	rng  *rand.Rand
	next uint64 // next unique block id
}

// poisson returns n arrival offsets with exponential gaps of mean 1/rate seconds, from 0.
func (g *gen) poisson(n int, rate float64) []time.Duration {
	out := make([]time.Duration, n)
	t := 0.0
	for i := range out {
		out[i] = time.Duration(t * float64(time.Second))
		t += g.rng.ExpFloat64() / rate
	}
	return out
}

// prefix is shared prefix number k: ids k<<16 + i, the same for every seed.
func (g *gen) prefix(k uint64, blocks int) []uint64 {
	p := make([]uint64, blocks)
	for i := range p {
		p[i] = k<<16 + uint64(i)
	}
	return p
}

func (g *gen) request(at time.Duration, prefix []uint64, unique int) Request {
	ids := append([]uint64(nil), prefix...)
	for i := 0; i < unique; i++ {
		ids = append(ids, g.next+g.rng.Uint64N(1<<20)<<24) // seed-dependent, never below 1<<32
		g.next++
	}
	return Request{At: at, HashIDs: ids, InputLength: len(ids) * 512, OutputLength: regimeOutput}
}
