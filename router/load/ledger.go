// Package load is the router's ledger of the requests it has routed and not seen finish: one
// entry per request, keyed by its id, from Routed through FirstToken to Done (or Failed, which
// takes the request back). Everything a request adds to the router's picture of the fleet lives
// behind it: the replica's prefill, decode and running counters, the predicted side index (and
// the approximate one for replicas without a whole event stream), and the balance windows of
// routed prefill the kv policy's bounds read (score.Windows, read into Candidate.Window). The live router drives it with the wall
// clock, the fleet model (sim/fleet) with virtual time, so both count load by one code path.
package load

import (
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/route"
	"github.com/kvroute/kvroute/router/score"
)

// ID names one routed request in the ledger.
type ID uint64

// Options configure a Ledger.
type Options struct {
	// Now is the ledger's clock (side-index expiry and the time of each record); time.Now
	// when nil. The fleet model passes its virtual clock.
	Now func() time.Time
	// Policy is the scoring policy the ledger serialises with its records (Pick, OnRouted,
	// Retract, Forget). Required. A score.Windowed policy sets the balance windows' length.
	Policy score.Policy
	// PredictedTTL is the predicted side index's TTL (index.DefaultPredictedTTL when 0).
	PredictedTTL time.Duration
	// RecordTTL is a safety net: a request still in the ledger this long after it was routed
	// is ended by Expire as if done, and counted (ExpiredRecords). Every request's end is
	// its caller's to report (Done or Failed), and a request cannot outlive the router's
	// request timeout, so one that does is a lost release, whose load would otherwise stay on
	// its replica for good. 0: no expiry.
	RecordTTL time.Duration
	// Observers are told of every request's lifecycle, outside the ledger's lock. A Policy that
	// is an Observer too (one that fits what it reads from first tokens) is told after them.
	Observers []Observer
	// PeerPrefill is the prefill other router replicas have routed to the replica (by name)
	// whose first token they have not seen (their shared totals; router/peersync); nil: none.
	// A routing that finds it positive does not restart the replica's PrefillSince: the
	// replica was not idle, and the peers' prefill there has been draining since its last
	// progress (PeerProgress).
	PeerPrefill func(replica string) int64
}

// Observer is the seam where a request's lifecycle is watched (trace capture, prompt audit).
// Calls come in order for one request, from the goroutine that serves it; they must not block.
// The Record and what it points to (Keys, Tokens, Req, Cands) may be reused once the request
// has ended (Ledger.DecideInto): an observer copies what it keeps past its call.
type Observer interface {
	Routed(id ID, r *Record)
	FirstToken(id ID, r *Record, at time.Time)
	// Done is called once the engine's answer ended; u is nil when it carried no usage.
	Done(id ID, r *Record, u *Usage)
	// Failed is called when the request was taken back (the attempt never reached the engine,
	// or failed before its first token).
	Failed(id ID, r *Record)
}

// Usage is what the engine reported for a finished request.
type Usage struct {
	PromptTokens int
	CachedTokens int
	// HasCached is false when the engine reported no cached_tokens (CachedTokens is then 0).
	HasCached bool
	// CompletionTokens is usage.completion_tokens (the trace capture's output length).
	CompletionTokens int
}

// Replica is one replica's load as this router counts it. The counters are read without a
// lock by every decision; only the ledger writes them.
type Replica struct {
	ID   index.ReplicaID
	Name string // the policy's candidate ID ("engine/rank")

	prefill, decode, running atomic.Int64
	// prefillHeld is what the requests counted in prefill will hold once they decode (their
	// Routing.Held): Load.PrefillHeldTokens.
	prefillHeld atomic.Int64
	// prefillAttn is the attention of the requests counted in prefill, in token pairs
	// (Record.Attention): Load.PrefillAttention.
	prefillAttn atomic.Int64
	// transfer is the prompt tokens the requests before their first token pull from another
	// engine (Routing.Transfer): Load.TransferTokens.
	transfer atomic.Int64
	// since is when the replica's routed prefill last made progress the ledger saw: the last
	// first token (or end before one), or when its prefill went from none to some (unix ns on
	// the ledger's clock). See score.Candidate.PrefillSince.
	since atomic.Int64
	gone  atomic.Bool
}

// PrefillSince is when the replica's routed prefill last made progress the ledger saw (unix ns
// on the ledger's clock; 0 before any routing).
func (r *Replica) PrefillSince() int64 { return r.since.Load() }

// Load is a replica's counters at one moment (the decision's value type).
type Load = route.Load

// Load reads the replica's counters.
func (r *Replica) Load() Load {
	return Load{PrefillTokens: r.prefill.Load(), DecodeTokens: r.decode.Load(),
		PrefillHeldTokens: r.prefillHeld.Load(), PrefillAttention: r.prefillAttn.Load(), TransferTokens: r.transfer.Load(), Running: r.running.Load()}
}

// Routing is what a decision hands the ledger for the request it routes.
type Routing struct {
	Replica *Replica
	// Keys are the prompt's block keys (nil for a request routed without keys).
	Keys []blockkey.Key
	// Approximate: the replica is scored from the approximate index too, so the decision is
	// recorded there as well.
	Approximate bool
	// Uncached is the prompt tokens the router expects the replica to compute (prefill load
	// until the first token); Held the tokens the request holds while it decodes (the live
	// router counts its prompt, the fleet model prompt and output).
	Uncached, Held int
	// Transfer is the prompt tokens the replica pulls from another engine's cache instead of
	// computing them: a split request's decode leg (router/app disagg.go). vLLM's scheduler
	// keeps such a request in WAITING_FOR_REMOTE_KVS, skipped by its prefill steps, until the
	// connector has received them (vllm/v1/core/sched/scheduler.py, _update_waiting_for_remote_kv),
	// then computes only what is left (the prompt's last token). So they are counted apart
	// (Load.TransferTokens), not as prefill, and the first token they wait for is no measure of
	// the replica's prefill drain.
	Transfer int
	// Cached is the prompt tokens the router expects the replica to have (for accounting, and
	// as the context its uncached tokens attend over: Record.Attention).
	Cached int
	// Req, Cands and Chosen are the policy's view of the decision (told OnRouted/Retract);
	// Req nil tells the policy nothing.
	Req    *score.Request
	Cands  []score.Candidate
	Chosen int
	// For observers only (router/capture, router/audit): the prompt's token ids as the engine
	// renders them (nil when never tokenized), what besides them changes KV content, and
	// whether media the ids do not show came with it. Shared with the request path: read-only.
	Tokens     []uint32
	Identity   blockkey.Identity
	Multimodal bool
}

// Record is one request in the ledger.
type Record struct {
	Routing
	// At is when it was routed (the ledger's clock); FirstTokenAt when its first token came.
	At, FirstTokenAt time.Time
	// What the replica carried when it was routed (what an observer fitting first-token times
	// reads): prefill tokens queued ahead, context tokens its steps carry
	// (score.Candidate.ContextTokens).
	Ahead, Decoding int
	// Attention is the request's prefill attention in token pairs: score.AttentionPairs of its
	// uncached tokens after its cached ones.
	Attention int64
	// predicted: the decision was entered into the side indexes at At.
	predicted bool
	first     bool
}

// Ledger holds every routed request until it is done. Safe for concurrent use.
type Ledger struct {
	now  func() time.Time
	obs  []Observer
	next atomic.Uint64
	// gen moves after every change a decision reads (load counters, side indexes), so a
	// decision built earlier knows whether it must re-read them (Generation).
	gen atomic.Uint64

	// mu serialises the policy (Pick, OnRouted, Retract, Forget) with the records, so a
	// decision made right after another already sees it.
	mu     sync.Mutex
	pol    score.Policy
	live   map[ID]*Record
	pred   *index.SideIndex
	approx *index.SideIndex
	// win is every replica's routed uncached prefill over the balance window (its own lock;
	// written under mu with the records).
	win *score.Windows
	// cal is every replica's engine timing, fitted from first-token times (its own lock).
	cal *Calibrations
	// recordTTL is Options.RecordTTL; expired counts the records it ended.
	recordTTL time.Duration
	expired   atomic.Uint64
	// peerPrefill is Options.PeerPrefill (none without peers).
	peerPrefill func(replica string) int64
	// reps is every counted replica by its ReplicaID (Load), copied on write: a decision reads
	// it without the lock; NewReplica and Remove replace it under regMu.
	reps  atomic.Pointer[[]*Replica]
	regMu sync.Mutex
}

// ErrUnknown is returned for an id the ledger does not hold (finished, or never routed).
var ErrUnknown = errors.New("load: unknown request")

// New returns an empty ledger.
func New(o Options) *Ledger {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.PeerPrefill == nil {
		o.PeerPrefill = func(string) int64 { return 0 }
	}
	span := score.DefaultWindow
	if w, ok := o.Policy.(score.Windowed); ok {
		span = w.WindowSpan()
	}
	obs := o.Observers
	if po, ok := o.Policy.(Observer); ok {
		obs = append(slices.Clone(obs), po)
	}
	return &Ledger{now: o.Now, obs: obs, pol: o.Policy, live: map[ID]*Record{},
		pred:   index.NewPredicted(index.SideOptions{TTL: o.PredictedTTL}),
		approx: index.NewApproximate(index.SideOptions{}),
		win:    score.NewWindows(span), cal: NewCalibrations(), peerPrefill: o.PeerPrefill, recordTTL: o.RecordTTL}
}

// Generation is a number that moves after every change to what a decision reads from the ledger
// (a replica's load counters, the side indexes; expiry aside, which Match applies by time). Read
// it before reading them: if it is unchanged later, so are they.
func (l *Ledger) Generation() uint64 { return l.gen.Load() }

// SetCapacity bounds the replica's entries in the side indexes by its engine's KV capacity in
// blocks (num_gpu_blocks; 0 when not known: index.DefaultCapacityBlocks), so its predictions are
// evicted as the engine's cache would evict those blocks. A smaller capacity evicts at once.
func (l *Ledger) SetCapacity(r *Replica, blocks int) {
	l.pred.SetCapacity(r.ID, blocks)
	l.approx.SetCapacity(r.ID, blocks)
	l.gen.Add(1)
}

// Now reads the ledger's clock.
func (l *Ledger) Now() time.Time { return l.now() }

// Policy is the policy's name.
func (l *Ledger) Policy() string { return l.pol.Name() }

// NewReplica starts counting a replica. Requests hold their replica: one in flight when the
// replica is removed settles on it, not on a newcomer that reuses its index slot.
func (l *Ledger) NewReplica(id index.ReplicaID, name string) *Replica {
	r := &Replica{ID: id, Name: name}
	l.register(id, r, nil)
	return r
}

// register puts r in slot id when the slot holds want (any replica when want is nil).
func (l *Ledger) register(id index.ReplicaID, r, want *Replica) {
	l.regMu.Lock()
	defer l.regMu.Unlock()
	var cur []*Replica
	if p := l.reps.Load(); p != nil {
		cur = *p
	}
	if want != nil && (int(id) >= len(cur) || cur[id] != want) {
		return
	}
	next := make([]*Replica, max(len(cur), int(id)+1))
	copy(next, cur)
	next[id] = r
	l.reps.Store(&next)
}

// Load is the load of the replica the ledger counts in slot id now: its counters and
// PrefillSince, as values (route.LedgerView); zero for a slot it does not count.
func (l *Ledger) Load(id index.ReplicaID) route.ReplicaLoad {
	p := l.reps.Load()
	if p == nil || int(id) >= len(*p) || (*p)[id] == nil {
		return route.ReplicaLoad{}
	}
	r := (*p)[id]
	return route.ReplicaLoad{Load: r.Load(), PrefillSince: r.PrefillSince()}
}

// Remove forgets everything the ledger and the policy keep about a replica that left the
// fleet: its side-index entries and the policy's per-replica state. Requests still in flight
// on it settle on the Replica they hold.
func (l *Ledger) Remove(r *Replica) {
	r.gone.Store(true)
	l.register(r.ID, nil, r)
	l.mu.Lock()
	if f, ok := l.pol.(score.Forgetter); ok {
		f.Forget(r.Name)
	}
	l.win.Forget(r.Name)
	l.mu.Unlock()
	l.pred.DropReplica(r.ID)
	l.approx.DropReplica(r.ID)
	l.gen.Add(1)
}

// Match returns, indexed by ReplicaID, the leading keys each replica holds in the predicted
// side index and (when approx) in the approximate one, at the ledger's now; slots as
// index.Index.Slots. The slices are reused when their capacity allows.
func (l *Ledger) Match(keys []blockkey.Key, slots int, approx bool, pred, appr []uint32) ([]uint32, []uint32) {
	now := l.now()
	pred = l.pred.Match(keys, now, slots, pred)
	if approx {
		appr = l.approx.Match(keys, now, slots, appr)
	}
	return pred, appr
}

// Pick asks the policy for a choice without recording anything (the policy may still draw
// from its tie-break generator). Decide is the call that routes.
func (l *Ledger) Pick(req *score.Request, cands []score.Candidate) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pol.Pick(req, cands)
}

// Explain returns the policy's explanation of every candidate, or nil when the policy does not
// explain itself (score.Explainer). It changes nothing.
func (l *Ledger) Explain(req *score.Request, cands []score.Candidate) []score.Explanation {
	ex, ok := l.pol.(score.Explainer)
	if !ok {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return ex.Explain(req, cands)
}

// Decide asks the policy for a replica and routes the request there in one step: rec builds
// the Routing for the chosen index. Under the same lock it first re-reads into d what the
// ledger owns (load counters, side indexes, windows: route.Decision.Refresh over reps, which
// must be the ones d was decided over), so a sibling decided just before this one is seen even
// when d was built while it was being decided. Nothing is re-read when nothing changed since d
// read the ledger (its Generation).
func (l *Ledger) Decide(d *route.Decision, reps []route.Replica, rec func(i int) Routing) (ID, *Record, error) {
	return l.DecideInto(new(Record), d, reps, rec)
}

// DecideInto is Decide with the request's Record in rc, the caller's memory (router/app keeps
// it with the rest of a decision and reuses both): the ledger holds rc until Done or Failed
// returns for the request, and the caller must not reuse it before. Observers must not keep
// the Record, or the slices it carries, past their calls.
func (l *Ledger) DecideInto(rc *Record, d *route.Decision, reps []route.Replica, rec func(i int) Routing) (ID, *Record, error) {
	l.mu.Lock()
	d.Refresh(reps, l)
	req, cands := &d.Req, d.Cands
	i, err := l.pol.Pick(req, cands)
	if err != nil {
		l.mu.Unlock()
		return 0, nil, err
	}
	r := rec(i)
	r.Req, r.Cands, r.Chosen = req, cands, i
	id := l.routedLocked(r, rc)
	l.mu.Unlock()
	l.notifyRouted(id, rc)
	return id, rc, nil
}

// Routed records a request routed to r.Replica (a choice made elsewhere: the fleet model, or a
// caller's override).
func (l *Ledger) Routed(r Routing) (ID, *Record) {
	rc := new(Record)
	l.mu.Lock()
	id := l.routedLocked(r, rc)
	l.mu.Unlock()
	l.notifyRouted(id, rc)
	return id, rc
}

func (l *Ledger) routedLocked(r Routing, rc *Record) ID {
	if r.Req != nil {
		l.pol.OnRouted(r.Req, r.Cands, r.Chosen)
		if r.Chosen >= 0 && r.Chosen < len(r.Cands) {
			l.win.Routed(r.Req.NowNs, r.Cands, r.Chosen, float64(r.Uncached))
		}
	}
	*rc = Record{Routing: r, At: l.now(), Attention: score.AttentionPairs(r.Uncached, r.Cached)}
	// What the replica carried is what the policy saw when it chose (peers' load included, the
	// prefill ahead less what drained since it last moved: score.PrefillAhead); a choice made
	// elsewhere reads this router's counters.
	if r.Req != nil && r.Chosen >= 0 && r.Chosen < len(r.Cands) {
		c := &r.Cands[r.Chosen]
		rc.Ahead, rc.Decoding = int(math.Round(score.PrefillAhead(c, r.Req.NowNs))), c.ContextTokens()
	} else {
		ld := r.Replica.Load()
		rc.Ahead, rc.Decoding = int(ld.PrefillTokens), int(ld.DecodeTokens+ld.PrefillHeldTokens)
	}
	if len(r.Keys) > 0 {
		rc.predicted = true
		l.pred.Predict(r.Replica.ID, r.Keys, rc.At)
		// The approximate index stands in for a missing stream; a replica with a whole stream
		// never reads it, so its decisions are not written there.
		if r.Approximate {
			l.approx.Predict(r.Replica.ID, r.Keys, rc.At)
		}
	}
	if r.Replica.prefill.Add(int64(r.Uncached)) == int64(r.Uncached) && l.peerPrefill(r.Replica.Name) <= 0 {
		r.Replica.since.Store(rc.At.UnixNano())
	}
	r.Replica.prefillHeld.Add(int64(r.Held))
	r.Replica.prefillAttn.Add(rc.Attention)
	r.Replica.transfer.Add(int64(r.Transfer))
	r.Replica.running.Add(1)
	l.gen.Add(1)
	id := ID(l.next.Add(1))
	l.live[id] = rc
	return id
}

func (l *Ledger) notifyRouted(id ID, rc *Record) {
	for _, o := range l.obs {
		o.Routed(id, rc)
	}
}

// FirstToken moves the request's load from prefill to decode. A second call for the same
// request changes nothing and tells no observer.
func (l *Ledger) FirstToken(id ID) error {
	l.mu.Lock()
	rc, ok := l.live[id]
	moved := ok && !rc.first
	if moved {
		rc.first = true
		rc.FirstTokenAt = l.now()
		rc.Replica.prefill.Add(-int64(rc.Uncached))
		rc.Replica.transfer.Add(-int64(rc.Transfer))
		// The replica's prefill was pending without a break since `since`: this first token
		// is one measure of how fast it drains (Calibrations.ObserveDrain). A request that
		// pulled its prompt waited on the transfer instead: no measure of the prefill.
		now := rc.FirstTokenAt.UnixNano()
		if rc.Transfer == 0 {
			if since := rc.Replica.since.Swap(now); since > 0 && now >= since {
				l.cal.ObserveDrain(rc.Uncached, rc.Attention, float64(now-since)/1e9)
			}
		}
		rc.Replica.prefillHeld.Add(-int64(rc.Held))
		rc.Replica.prefillAttn.Add(-rc.Attention)
		rc.Replica.decode.Add(int64(rc.Held))
		l.gen.Add(1)
	}
	l.mu.Unlock()
	if !ok {
		return ErrUnknown
	}
	if !moved {
		return nil
	}
	for _, o := range l.obs {
		o.FirstToken(id, rc, rc.FirstTokenAt)
	}
	return nil
}

// Done ends a request the engine took: its load leaves the replica; its predictions stay until
// events confirm them or they expire. u is the engine's usage (nil when none came).
func (l *Ledger) Done(id ID, u *Usage) (*Record, error) {
	rc, err := l.end(id, false)
	if err != nil {
		return nil, err
	}
	for _, o := range l.obs {
		o.Done(id, rc, u)
	}
	return rc, nil
}

// Failed takes a request back: it never reached the engine, or failed before the engine
// computed anything. Its load leaves the replica, and the policy and the side indexes forget
// the decision, so the replica that just failed does not attract the next request with the
// same prefix through blocks it never computed.
func (l *Ledger) Failed(id ID) (*Record, error) {
	rc, err := l.end(id, true)
	if err != nil {
		return nil, err
	}
	for _, o := range l.obs {
		o.Failed(id, rc)
	}
	return rc, nil
}

func (l *Ledger) end(id ID, rollback bool) (*Record, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rc, ok := l.live[id]
	if !ok {
		return nil, ErrUnknown
	}
	delete(l.live, id)
	rep := rc.Replica
	if rc.first {
		rep.decode.Add(-int64(rc.Held))
	} else {
		rep.prefill.Add(-int64(rc.Uncached))
		rep.prefillHeld.Add(-int64(rc.Held))
		rep.prefillAttn.Add(-rc.Attention)
		rep.transfer.Add(-int64(rc.Transfer))
		rep.since.Store(l.now().UnixNano())
	}
	rep.running.Add(-1)
	defer l.gen.Add(1) // after the side indexes too, when rolled back
	if !rollback {
		return rc, nil
	}
	if rc.Req != nil {
		if rt, ok := l.pol.(score.Retractor); ok {
			rt.Retract(rc.Req, rc.Cands, rc.Chosen)
		}
		if rc.Chosen >= 0 && rc.Chosen < len(rc.Cands) {
			l.win.Retract(rc.Cands[rc.Chosen].ID, rc.Req.NowNs, float64(rc.Uncached))
		}
	}
	if rc.predicted && !rep.gone.Load() {
		l.pred.Unpredict(rep.ID, rc.Keys, rc.At)
		if rc.Approximate {
			l.approx.Unpredict(rep.ID, rc.Keys, rc.At)
		}
	}
	return rc, nil
}

// Unpredict takes a routed request's blocks out of the predicted side index before they expire
// (the fleet model: the engine started it, so its blocks are in the cache now).
func (l *Ledger) Unpredict(id ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rc, ok := l.live[id]; ok && rc.predicted {
		l.pred.Unpredict(rc.Replica.ID, rc.Keys, rc.At)
		rc.predicted = false
		l.gen.Add(1)
	}
}

// RoutedPeer enters a request another router replica routed to r: its blocks into the
// predicted side index, so that a sibling reaching this router goes where its prefix is being
// computed, and its uncached prefill into r's balance window, at the ledger's now. The blocks
// expire like this router's own predictions and are never taken back here (the peer's request
// is not in this ledger, and its failure is the peer's to account). Without the window entry
// each router's bounds would read only its own third of the fleet's work (three routers), and
// the token bound would turn a sibling away from the replica computing its prefix on an
// imbalance the fleet does not have (docs/router.md, "Several router replicas"). The window
// entry is not taken back when the peer's request fails either: it leaves with its age.
func (l *Ledger) RoutedPeer(r *Replica, keys []blockkey.Key, uncached int) {
	if r.gone.Load() {
		return
	}
	now := l.now()
	if len(keys) > 0 {
		l.pred.Predict(r.ID, keys, now)
	}
	l.win.Add(r.Name, now.UnixNano(), float64(uncached))
	l.gen.Add(1)
}

// PeerProgress records that another router replica saw r's routed prefill move at the ledger's
// now: one of its requests there reached its first token or failed before one, or it routed
// prefill to r while r had none pending (idle, as far as this router's counter and the peers'
// shared totals say). r's PrefillSince then covers the whole replica's prefill, not only this
// router's part, so kv's drain credit applies to the peers' part too, and this router's next
// drain observation measures from the replica's last progress rather than its own (through
// N routers its own is about N first tokens old, so a rate measured from it would read about
// 1/N of the engine's). A peer's change arrives within its flush interval (20 ms) plus
// transit: PrefillSince can only be that much late, which credits less, never more. It never
// moves PrefillSince back.
func (l *Ledger) PeerProgress(r *Replica) {
	if r.gone.Load() {
		return
	}
	now := l.now().UnixNano()
	for {
		old := r.since.Load()
		if old >= now || r.since.CompareAndSwap(old, now) {
			return
		}
	}
}

// ExportApprox returns at most max of r's unexpired approximate-index entries (a peer's
// snapshot of the replicas without events).
func (l *Ledger) ExportApprox(r *Replica, max int) []index.SideEntry {
	return l.approx.Export(r.ID, l.now(), max)
}

// ImportApprox loads entries taken from a peer's snapshot into r's approximate index.
func (l *Ledger) ImportApprox(r *Replica, entries []index.SideEntry) {
	if r.gone.Load() {
		return
	}
	l.approx.Import(r.ID, entries, l.now())
	l.gen.Add(1)
}

// Expire drops side-index and window entries expired at the ledger's now (Routed also does as
// it goes), and ends the records older than Options.RecordTTL as done, telling the observers
// (Done, without usage). It returns the records it ended: each is a request whose end was never
// reported, which the caller logs.
func (l *Ledger) Expire() []*Record {
	now := l.now()
	l.pred.Expire(now)
	l.approx.Expire(now)
	l.win.Expire(now.UnixNano())
	if l.recordTTL <= 0 {
		return nil
	}
	deadline := now.Add(-l.recordTTL)
	var old []ID
	l.mu.Lock()
	for id, rc := range l.live {
		if rc.At.Before(deadline) {
			old = append(old, id)
		}
	}
	l.mu.Unlock()
	var ended []*Record
	for _, id := range old {
		rc, err := l.Done(id, nil)
		if err != nil {
			continue // ended by its caller meanwhile
		}
		l.expired.Add(1)
		ended = append(ended, rc)
	}
	return ended
}

// ExpiredRecords is how many records Expire ended past Options.RecordTTL.
func (l *Ledger) ExpiredRecords() uint64 { return l.expired.Load() }

// Window is the replica's balance window at nowNs (the decisions' clock), for
// Candidate.Window. It changes nothing.
func (l *Ledger) Window(id string, nowNs int64) score.Window { return l.win.Read(id, nowNs) }

// Calibration is the engines' prefill drain as fitted from first tokens so far, for
// Candidate.Calib (one fit for the fleet: Calibrations). It changes nothing.
func (l *Ledger) Calibration(id string) score.Calibration { return l.cal.Read() }

// Stats is the ledger's size, for /metrics and state comparisons.
type Stats struct {
	InFlight    int `json:"in_flight"`
	Predicted   int `json:"predicted_entries"`
	Approximate int `json:"approximate_entries"`
	// PredictedEvicted and ApproximateEvicted count the side indexes' entries dropped because
	// their replica's KV capacity was full (SetCapacity), as the engine evicts.
	PredictedEvicted   uint64 `json:"predicted_evicted"`
	ApproximateEvicted uint64 `json:"approximate_evicted"`
}

// Stats reads the ledger's size.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	n := len(l.live)
	l.mu.Unlock()
	return Stats{InFlight: n, Predicted: l.pred.Len(), Approximate: l.approx.Len(),
		PredictedEvicted: l.pred.Evicted(), ApproximateEvicted: l.approx.Evicted()}
}

// WindowSpan is the length of the balance windows (Window).
func (l *Ledger) WindowSpan() time.Duration { return l.win.Span() }
