// Package route is the routing decision as a pure function: a request and read-only views of
// the exact index, the fleet and the load ledger go in; the candidates the policy scores, what
// each one is expected to have cached, and a breakdown of every number behind it come out. It
// reads no clock and changes nothing; the ledger (router/load) is what routes.
package route

import (
	"slices"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/score"
)

// CapBlockSize is the block size a decision does its arithmetic with while the fleet's is not
// known yet; no request is keyed with it.
const CapBlockSize = 16

// Unkeyed reasons set here (the caller may give others, e.g. multimodal).
const UnkeyedBlockSize = "block_size_unknown"

// Guards that take a replica out of a decision before the policy sees it.
const (
	GuardNotReady  = "not_ready" // discovery says the engine is not Ready
	GuardUnhealthy = "unhealthy" // probes or forwards failed and its backoff runs
	GuardTried     = "tried"     // this request already failed there
)

// Load is a replica's load counters at one moment: this router's (the ledger's, load.Replica)
// or the other router replicas' share (router/peersync).
type Load struct {
	// PrefillTokens: uncached prompt tokens routed there whose first token has not come.
	PrefillTokens int64 `json:"prefill_tokens"`
	// DecodeTokens: tokens held by its requests past their first token.
	DecodeTokens int64 `json:"decode_tokens"`
	// PrefillHeldTokens: tokens its requests before their first token will hold once they
	// decode (their whole prompts, cached part included; score.Candidate.PrefillHeldTokens).
	// Other routers' totals do not carry it (absent from their share).
	PrefillHeldTokens int64 `json:"prefill_held_tokens,omitempty"`
	// PrefillAttention: the attention its requests before their first token compute, in
	// token pairs (score.AttentionPairs). Other routers' totals do not carry it either.
	PrefillAttention int64 `json:"prefill_attention,omitempty"`
	// TransferTokens: prompt tokens its requests pull from another engine's cache before their
	// first token (the decode legs of split requests: vLLM's scheduler parks them in
	// WAITING_FOR_REMOTE_KVS, off the prefill budget), so counted apart from PrefillTokens.
	TransferTokens int64 `json:"transfer_tokens,omitempty"`
	// Running: requests routed there and not finished.
	Running int64 `json:"running"`
}

// ReplicaLoad is what a decision reads of one replica's load from the ledger: values, read at
// one moment (LedgerView.Load).
type ReplicaLoad struct {
	Load
	// PrefillSince is when the replica's routed prefill last made progress the ledger saw
	// (score.Candidate.PrefillSince).
	PrefillSince int64
}

// Replica is the decision's view of one replica, as the fleet published it.
type Replica struct {
	Name string
	// ID is its slot in the exact index, and the one its load is read by (LedgerView.Load).
	ID index.ReplicaID
	// Peer is what the other router replicas have in flight there (router/peersync; zero for a
	// router on its own). The candidate's load is the sum: every decision sees the fleet's.
	Peer Load
	// Ready and Healthy are the engine's discovery and health state at the decision's time.
	Ready, Healthy bool
	// Approximate: no whole event stream (none, not exact, or demoted), so the approximate
	// index is read too.
	Approximate bool
	// WarmupCredit is the already-decayed warm-up share (0..1).
	WarmupCredit float64
	// Queue and KVUtil are the engine's own figures (its /metrics), 0 when not read.
	Queue  int
	KVUtil float64
}

// Input is one request as the decision sees it.
type Input struct {
	Tokens []uint32
	// Keys, when set, are the prompt's block keys already made (the fleet model's traces carry
	// them), used instead of keying Tokens; Length is then the prompt's length in tokens.
	Keys     []blockkey.Key
	Length   int
	Identity blockkey.Identity
	Session  string
	// Unkeyed, when set, is why the request must be routed without keys.
	Unkeyed string
	// BlockSize is the fleet's block size, 0 when not known yet (the request goes unkeyed).
	BlockSize int
	// NowNs is the decision's time (the policy's windows use it).
	NowNs int64
	// Tried marks replicas (by position) this request already failed on; nil for none.
	Tried []bool
}

// IndexView is the read side of the exact index.
type IndexView interface {
	Match(keys []blockkey.Key, out []index.Match) []index.Match
	Slots() int
}

// SessionView is the exact index's memory of where each session's blocks were stored (from
// the engines' BlockStored session_id); an IndexView without it routes no session affinity.
type SessionView interface {
	SessionReplica(session string) (index.ReplicaID, bool)
}

// LedgerView is the read side of the ledger's load counters, side indexes and balance windows
// (load.Ledger).
type LedgerView interface {
	// Load is the load of the replica in slot id now (zero for a slot the ledger does not
	// count).
	Load(id index.ReplicaID) ReplicaLoad
	Match(keys []blockkey.Key, slots int, approx bool, pred, appr []uint32) ([]uint32, []uint32)
	// Window is a replica's balance window at the decision's time.
	Window(id string, nowNs int64) score.Window
	// Calibration is a replica's engine timing fitted from first-token times.
	Calibration(id string) score.Calibration
	// Generation moves after every change to the load counters or side indexes.
	Generation() uint64
}

// Decision is what the policy is asked and what the answer is based on.
type Decision struct {
	Req   score.Request
	Cands []score.Candidate
	// Cached is, per candidate, the prompt tokens it is expected to have cached.
	Cached []int
	// Guards is, per candidate, the router guards that took it out (nil when none).
	Guards [][]string
	// Raw is, per candidate, the overlap before the cap to the prompt's computable blocks.
	Raw []Overlap
	// CapBlocks is the most blocks that can hit (the engine recomputes the last token).
	CapBlocks int
	// Unkeyed is why the request goes without keys ("" when keyed).
	Unkeyed string
	// Peer is, per candidate, the part of its load the other router replicas put there (nil
	// when no replica has any).
	Peer []Load

	// What Refresh re-reads against: the exact index's match and its slot count (read once),
	// whether any replica reads the approximate index, and the side-index buffers it reuses.
	exact      []index.Match
	slots      int
	anyApprox  bool
	pred, appr []uint32
	// Buffers kept from one decision to the next (Decision.Decide): the keys, the exact match,
	// the peers' load.
	keys     []blockkey.Key
	exactBuf []index.Match
	peerBuf  []Load
	// read: Refresh has read the ledger, at generation gen.
	read bool
	gen  uint64
	// home is one more than the candidate whose engine last stored blocks for the request's
	// session, 0 for none (SessionView).
	home int
}

// Overlap is one replica's raw overlap, in blocks.
type Overlap struct {
	Tiers       [score.NumTiers]int `json:"tiers"`
	Approximate int                 `json:"approximate"`
	Predicted   int                 `json:"predicted"`
}

// Decide builds the decision for in over reps. It is pure: the same views give the same
// decision.
func Decide(in Input, reps []Replica, ix IndexView, led LedgerView) (*Decision, error) {
	d := new(Decision)
	if err := d.Decide(in, reps, ix, led); err != nil {
		return nil, err
	}
	return d, nil
}

// Decide is the package's Decide into d, reusing the memory of d's earlier decision: once d is
// warm a decision allocates nothing. Everything d's earlier decision handed out (Req.Keys,
// Cands, the per-candidate slices) is overwritten, so the caller may reuse d only once nothing
// reads that decision any more (router/app: once the ledger has ended its request).
func (d *Decision) Decide(in Input, reps []Replica, ix IndexView, led LedgerView) error {
	bs := in.BlockSize
	d.reset(in.Unkeyed, len(reps))
	if bs <= 0 {
		bs = CapBlockSize
		if d.Unkeyed == "" {
			d.Unkeyed = UnkeyedBlockSize
		}
	}
	n := len(in.Tokens)
	if in.Keys != nil {
		n = in.Length
	}
	d.Req = score.Request{Tokens: n, BlockSize: bs, SessionKey: in.Session, LoRA: in.Identity.LoRAName, NowNs: in.NowNs}
	if in.Keys != nil && d.Unkeyed == "" {
		d.Req.Keys = in.Keys
	} else if len(in.Tokens) > 0 && d.Unkeyed == "" {
		keys, err := blockkey.AppendPromptKeys(d.keys[:0], in.Tokens, bs, in.Identity)
		if err != nil {
			return err
		}
		d.keys = keys
		d.Req.Keys = keys
	}
	// The engine recomputes the last prompt token, so at most tokens-1 can hit, in whole blocks.
	if n > 0 {
		d.CapBlocks = (n - 1) / bs
	}
	for i := range reps {
		d.anyApprox = d.anyApprox || reps[i].Approximate
	}
	if len(d.Req.Keys) > 0 {
		d.exact = ix.Match(d.Req.Keys, d.exactBuf)
		d.exactBuf = d.exact
	}
	for i := range reps {
		r := &reps[i]
		var g uint8
		if !r.Ready {
			g |= 1
		}
		if !r.Healthy {
			g |= 2
		}
		if i < len(in.Tried) && in.Tried[i] {
			g |= 4
		}
		d.Guards[i] = guardSets[g]
	}
	d.slots = ix.Slots()
	if sv, ok := ix.(SessionView); ok && in.Session != "" {
		if id, ok := sv.SessionReplica(in.Session); ok {
			for i := range reps {
				if reps[i].ID == id {
					d.home = i + 1
					break
				}
			}
		}
	}
	d.Refresh(reps, led)
	return nil
}

// guardSets is every combination of the router guards, by bit (1 not ready, 2 unhealthy, 4
// tried), in that order: shared, read-only, so a decision names its guards without allocating.
var guardSets = func() [8][]string {
	var out [8][]string
	for g := range 8 {
		for b, name := range []string{GuardNotReady, GuardUnhealthy, GuardTried} {
			if g&(1<<b) != 0 {
				out[g] = append(out[g], name)
			}
		}
		out[g] = slices.Clip(out[g])
	}
	return out
}()

// reset empties d for a decision over n replicas, keeping its buffers.
func (d *Decision) reset(unkeyed string, n int) {
	*d = Decision{Unkeyed: unkeyed,
		Cands: resize(d.Cands, n), Cached: resize(d.Cached, n), Guards: resize(d.Guards, n), Raw: resize(d.Raw, n),
		keys: d.keys, exactBuf: d.exactBuf, pred: d.pred, appr: d.appr, peerBuf: d.peerBuf}
}

// resize returns s with length n and every element zero, reusing its array when it is large
// enough.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// Refresh (re)reads what the ledger owns into every candidate: the load counters (other
// routers' share added), the balance window and the side indexes' overlap, capped to the
// computable blocks. Decide calls it once; the ledger calls it again under its lock just before
// the policy picks (load.Ledger.Decide), because candidates built before the lock miss every
// sibling routed in between: eight siblings arriving together would each see the prefix nowhere and
// every replica idle, and scatter. The exact index is engine truth and is not re-read. reps must
// be the ones Decide was given. Nothing is re-read when the ledger has not changed since the
// last read (its Generation), so a decision made alone pays for one read.
func (d *Decision) Refresh(reps []Replica, led LedgerView) {
	g := led.Generation()
	if d.read && g == d.gen {
		return
	}
	d.read, d.gen = true, g
	var pred, appr []uint32
	if len(d.Req.Keys) > 0 {
		// The approximate index is only read for replicas without a whole stream.
		pred, appr = led.Match(d.Req.Keys, d.slots, d.anyApprox, d.pred, d.appr)
		d.pred, d.appr = pred, appr
	}
	d.Peer = nil
	for i := range reps {
		r := &reps[i]
		rl := led.Load(r.ID)
		ld := rl.Load
		if r.Peer != (Load{}) {
			if d.Peer == nil {
				d.peerBuf = resize(d.peerBuf, len(reps))
				d.Peer = d.peerBuf
			}
			d.Peer[i] = r.Peer
			ld.PrefillTokens += r.Peer.PrefillTokens
			ld.DecodeTokens += r.Peer.DecodeTokens
			// The peers' totals do not carry what their requests in prefill hold, nor their
			// attention (peersync.Load); their uncached part, in the peers' prefill counter, is
			// the part known.
			ld.PrefillHeldTokens += r.Peer.PrefillTokens
			ld.Running += r.Peer.Running
		}
		c := score.Candidate{ID: r.Name, Healthy: len(d.Guards[i]) == 0,
			PrefillTokens: int(ld.PrefillTokens), PrefillAttention: ld.PrefillAttention, PrefillSince: rl.PrefillSince,
			DecodeTokens: int(ld.DecodeTokens), PrefillHeldTokens: int(ld.PrefillHeldTokens), Running: int(ld.Running),
			Queue: r.Queue, KVUtil: r.KVUtil, WarmupCredit: r.WarmupCredit, Approximate: r.Approximate,
			Window: led.Window(r.Name, d.Req.NowNs), Calib: led.Calibration(r.Name), SessionHome: i+1 == d.home}
		d.Raw[i] = Overlap{}
		if int(r.ID) < len(d.exact) {
			m := d.exact[r.ID]
			c.ExactBlocks = int(m.Blocks)
			c.TierBlocks = [score.NumTiers]int{int(m.Blocks - m.CPU - m.Disk), int(m.CPU), int(m.Disk)}
			d.Raw[i].Tiers = c.TierBlocks
			if c.Approximate && int(r.ID) < len(appr) {
				a := int(appr[r.ID])
				d.Raw[i].Approximate = a
				if a > c.ExactBlocks {
					c.ExactBlocks, c.TierBlocks = a, [score.NumTiers]int{a, 0, 0}
				}
			}
			if int(r.ID) < len(pred) { // Slots read after the exact match: a replica may have come or gone
				c.PredictedBlocks = int(pred[r.ID])
				d.Raw[i].Predicted = c.PredictedBlocks
			}
		}
		capCandidate(&c, d.CapBlocks)
		d.Cached[i] = max(c.ExactBlocks, c.PredictedBlocks) * d.Req.BlockSize
		d.Cands[i] = c
	}
}

// capCandidate limits every overlap to capBlocks, taking the excess off the slowest tier first.
func capCandidate(c *score.Candidate, capBlocks int) {
	c.PredictedBlocks = min(c.PredictedBlocks, capBlocks)
	over := c.ExactBlocks - capBlocks
	if over <= 0 {
		return
	}
	c.ExactBlocks = capBlocks
	for t := score.NumTiers - 1; t >= 0 && over > 0; t-- {
		n := min(over, c.TierBlocks[t])
		c.TierBlocks[t] -= n
		over -= n
	}
}

// Uncached is the prompt tokens candidate i is expected to compute.
func (d *Decision) Uncached(i int) int { return max(d.Req.Tokens-d.Cached[i], 0) }

// Mode is the scoring mode behind candidate i's expected cached tokens, as the accuracy
// counters label it.
func (d *Decision) Mode(i int) string {
	c := &d.Cands[i]
	switch {
	case d.Unkeyed != "":
		return ModeUnkeyed
	case c.Approximate:
		return ModeApproximate
	case c.PredictedBlocks > c.ExactBlocks:
		return ModePredicted
	}
	return ModeExact
}

// Scoring modes of a decision.
const (
	ModeExact       = "exact"       // the chosen replica's exact index gave the overlap
	ModePredicted   = "predicted"   // the predicted side index gave more than the exact one
	ModeApproximate = "approximate" // the replica has no whole stream (or is demoted)
	ModeUnkeyed     = "unkeyed"     // no keys: block size unknown, multimodal
)

// Breakdown is why one candidate stands where it does: every number the decision weighed.
type Breakdown struct {
	// Overlap is the raw overlap in blocks per tier (GPU, CPU, disk), from the approximate
	// index and from the predicted side index, before the cap.
	Overlap Overlap `json:"overlap"`
	// ExactBlocks, PredictedBlocks: what the policy was given (capped, approximate folded in).
	ExactBlocks     int `json:"exact_blocks"`
	PredictedBlocks int `json:"predicted_blocks"`
	// CachedTokens and UncachedTokens: the prompt split the router expects there.
	CachedTokens   int     `json:"cached_tokens"`
	UncachedTokens int     `json:"uncached_tokens"`
	WarmupCredit   float64 `json:"warmup_credit"`
	// Load terms: the ledger's (prefill, decode, running; other routers' share included) and
	// the engine's (queue, KV use).
	PrefillTokens int `json:"prefill_tokens"`
	DecodeTokens  int `json:"decode_tokens"`
	// PrefillHeldTokens: what the requests still in prefill will hold once they decode (kv's
	// decode term weighs it with DecodeTokens; peers' part: their prefill tokens).
	PrefillHeldTokens int `json:"prefill_held_tokens"`
	// PrefillAttention: the attention of the requests still in prefill, in token pairs
	// (score.AttentionPairs; this router's own): kv's drain credit weighs it.
	PrefillAttention int64   `json:"prefill_attention"`
	Running          int     `json:"running"`
	Queue            int     `json:"queue"`
	KVUtil           float64 `json:"kv_util"`
	// PeerLoad is the part of the load terms the other router replicas put there (absent for a
	// router on its own, or when they have nothing there).
	PeerLoad *Load `json:"peer_load,omitempty"`
	// Guards are the router guards that excluded it (not_ready, unhealthy, tried); the
	// policy's own guard is Policy.Excluded.
	Guards []string `json:"guards,omitempty"`
	// Policy is the policy's explanation (its cost and terms), when it gives one.
	Policy *score.Explanation `json:"policy,omitempty"`
}

// Breakdowns returns every candidate's breakdown; ex is the policy's explanations (nil when it
// gives none).
func (d *Decision) Breakdowns(ex []score.Explanation) []Breakdown {
	out := make([]Breakdown, len(d.Cands))
	for i := range d.Cands {
		c := &d.Cands[i]
		b := Breakdown{Overlap: d.Raw[i], ExactBlocks: c.ExactBlocks, PredictedBlocks: c.PredictedBlocks,
			CachedTokens: d.Cached[i], UncachedTokens: d.Uncached(i), WarmupCredit: c.WarmupCredit,
			PrefillTokens: c.PrefillTokens, DecodeTokens: c.DecodeTokens, PrefillHeldTokens: c.PrefillHeldTokens,
			PrefillAttention: c.PrefillAttention, Running: c.Running, Queue: c.Queue, KVUtil: c.KVUtil,
			Guards: d.Guards[i]}
		if i < len(d.Peer) && d.Peer[i] != (Load{}) {
			p := d.Peer[i]
			b.PeerLoad = &p
		}
		if i < len(ex) {
			e := ex[i]
			b.Policy = &e
		}
		out[i] = b
	}
	return out
}

// Cheapest is the pick an explanation implies: the lowest cost among candidates no guard
// excluded (the first on a tie); -1 when there is none. /debug/route answers with it for a
// policy that explains itself, so asking never draws from the policy's tie-break generator.
func Cheapest(cands []score.Candidate, ex []score.Explanation) int {
	best := -1
	for i := range cands {
		if i >= len(ex) || !cands[i].Healthy || ex[i].Excluded != "" {
			continue
		}
		if best < 0 || ex[i].Cost < ex[best].Cost {
			best = i
		}
	}
	return best
}
