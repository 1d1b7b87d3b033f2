package score

import (
	"math/rand/v2"
	"sort"
	"strconv"

	"github.com/zeebo/xxh3"
)

// sessionPolicy (`session`) keeps a session on one replica: the session key is placed on a
// consistent-hash ring (production-stack's `session` uses a hash ring too) and the request goes
// to the first replica clockwise whose load is under the cap (consistent hashing with bounded
// loads), so one heavy session cannot pile up a replica. Requests without a session key go to the
// least-loaded replica, as production-stack falls back to lowest load.
type sessionPolicy struct {
	rng      *rand.Rand
	ids      []string // candidate IDs the ring was built for
	ring     []ringPoint
	loadCap  float64
	vnodes   int
	fallback *loadPolicy
}

type ringPoint struct {
	hash uint64
	id   string
}

// Session defaults: 64 virtual nodes per replica; a replica is skipped once its in-flight
// requests exceed 1.25 x the fleet mean (+1, so an idle fleet never skips).
const (
	sessionVNodes  = 64
	sessionLoadCap = 1.25
)

func newSession(o Options) *sessionPolicy {
	return &sessionPolicy{rng: NewRNG(o.Seed), loadCap: sessionLoadCap, vnodes: sessionVNodes,
		fallback: newLoad("load", o)}
}

func (p *sessionPolicy) Name() string { return "session" }

func (p *sessionPolicy) rebuild(cands []Candidate) {
	same := len(p.ids) == len(cands)
	for i := 0; same && i < len(cands); i++ {
		same = p.ids[i] == cands[i].ID
	}
	if same {
		return
	}
	p.ids = p.ids[:0]
	p.ring = p.ring[:0]
	for i := range cands {
		p.ids = append(p.ids, cands[i].ID)
		for v := 0; v < p.vnodes; v++ {
			p.ring = append(p.ring, ringPoint{xxh3.HashString(cands[i].ID + "#" + strconv.Itoa(v)), cands[i].ID})
		}
	}
	sort.Slice(p.ring, func(a, b int) bool { return p.ring[a].hash < p.ring[b].hash })
}

func (p *sessionPolicy) Pick(req *Request, cands []Candidate) (int, error) {
	if !AnyHealthy(cands) {
		return -1, ErrNoCandidate
	}
	if req.SessionKey == "" {
		return p.fallback.Pick(req, cands)
	}
	p.rebuild(cands)
	byID := make(map[string]int, len(cands))
	total := 0
	healthy := 0
	for i := range cands {
		byID[cands[i].ID] = i
		if cands[i].Healthy {
			total += cands[i].Queue + cands[i].Running
			healthy++
		}
	}
	limit := p.loadCap*float64(total)/float64(healthy) + 1
	h := xxh3.HashString(req.SessionKey)
	start := sort.Search(len(p.ring), func(k int) bool { return p.ring[k].hash >= h })
	for k := 0; k < len(p.ring); k++ {
		i := byID[p.ring[(start+k)%len(p.ring)].id]
		c := &cands[i]
		if c.Healthy && float64(c.Queue+c.Running) < limit {
			return i, nil
		}
	}
	return p.fallback.Pick(req, cands)
}

func (p *sessionPolicy) OnRouted(*Request, []Candidate, int) {}
