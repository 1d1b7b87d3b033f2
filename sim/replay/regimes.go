package replay

import (
	"fmt"
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
	default:
		return Workload{}, fmt.Errorf("unknown regime %q (known: %s)", name, strings.Join(RegimeNames(), ", "))
	}
	return w, nil
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
