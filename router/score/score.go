// Package score turns what the router knows about each replica (cache overlap and load) into a
// choice of replica. It holds the production policies (kvroute's own cost model `kv`, load,
// round-robin, session) and the interface every policy implements; the benchmark policies (the
// peers' emulations, kvbench's) implement it in sim/policies and are added to a Registry by the
// benchmark tools only, so the live router and the fleet model run every policy identically.
package score

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
)

// Tier is where a cached block sits on a replica.
type Tier int

// Tiers in the order of their value to a request.
const (
	TierGPU Tier = iota
	TierCPU
	TierDisk
	NumTiers
)

// Request is the routing view of one request.
type Request struct {
	// Keys are the chained router keys of the prompt's full blocks, in order.
	Keys []blockkey.Key
	// Tokens is the prompt length in tokens (the last block may be partial, so it can exceed
	// len(Keys)*BlockSize).
	Tokens int
	// BlockSize is the engines' block size in tokens.
	BlockSize int
	// SessionKey is the caller's session identity; empty when the request carries none.
	SessionKey string
	// LoRA is the adapter name ("" for the base model); it is already mixed into Keys.
	LoRA string
	// NowNs is the decision time in nanoseconds on any monotonic clock (simulated in the fleet
	// model). Policies that keep time-windowed state use it, never the wall clock.
	NowNs int64
}

// PromptBlocks is the number of blocks the prompt occupies, a partial last block included.
func (r *Request) PromptBlocks() int {
	if r.BlockSize <= 0 {
		return len(r.Keys)
	}
	n := (r.Tokens + r.BlockSize - 1) / r.BlockSize
	if n < len(r.Keys) {
		n = len(r.Keys)
	}
	return n
}

// Candidate is one replica (one engine stream: pod + DP rank) with the signals the router has.
type Candidate struct {
	// ID names the replica stably across decisions (policies with state key by it).
	ID string
	// ExactBlocks is the longest run of leading prompt blocks the replica holds, any tier.
	ExactBlocks int
	// TierBlocks splits ExactBlocks by tier (TierGPU..TierDisk); if all zero while ExactBlocks
	// is set, all of it is taken as GPU.
	TierBlocks [NumTiers]int
	// PredictedBlocks is the leading-block overlap from the short-TTL side index of recent
	// routing decisions whose BlockStored has not arrived yet.
	PredictedBlocks int
	// PrefillTokens is the uncached prompt tokens routed to the replica whose prefill has not
	// finished (queued or running).
	PrefillTokens int
	// PrefillSince is when PrefillTokens last dropped (a first token) or went from none to
	// some, in unix ns on the request clock (0: unknown): the oldest routed prefill there has
	// been computing since then at the latest (vLLM schedules FCFS). With several routers it is
	// the last such moment any of them saw (load.Ledger.PeerProgress). kv reads it to credit
	// the progress the counter does not show (calib.go, PrefillAhead).
	PrefillSince int64
	// PrefillAttention is the attention the requests counted in PrefillTokens compute, in token
	// pairs (AttentionPairs; the peers' part is not shared, so this router's own).
	PrefillAttention int64
	// DecodeTokens is the tokens held by the replica's sequences past their first token.
	DecodeTokens int
	// PrefillHeldTokens is the tokens the requests counted in PrefillTokens will hold once they
	// decode: their whole prompts, cached part included (ContextTokens).
	PrefillHeldTokens int
	// Queue is the number of waiting requests; Running the number of running ones.
	Queue   int
	Running int
	// KVUtil is the share of KV blocks held by running requests, 0..1.
	KVUtil float64
	// WarmupCredit is the already-decayed warm-up share (0..1) for a newly Ready replica.
	WarmupCredit float64
	// Healthy is false for a replica that must not receive traffic.
	Healthy bool
	// Approximate marks a replica whose event stream is not whole; its overlap is a guess.
	Approximate bool
	// Window is the prefill routed to the replica inside the balance window (the ledger's).
	Window Window
	// Calib is the fleet's measured prefill drain (the ledger's online fit); zero when not
	// measured.
	Calib Calibration
	// SessionHome: the request carries a session key and this replica's engine last stored
	// blocks for that session (its BlockStored events' session_id, router/index). kv credits it
	// one block when the overlap tells no candidate apart (SessionCredit).
	SessionHome bool
}

// ContextTokens is the context the replica's steps carry over the few steps a request sent
// there now waits: the tokens of the sequences decoding and of those still in prefill. vLLM's
// scheduler (vllm/v1/core/sched/scheduler.py, Scheduler.schedule) keeps a request in its running
// list from its first prefill chunk on and gives it a decode token every step once its prefill
// ends, its whole prompt as attention context, so a request whose prefill is about to end weighs
// on the next steps as much as one already decoding. Counting decoding sequences alone would
// make a replica whose last request is still in prefill look the least busy of the replicas
// whose prefill counters have drained.
func (c *Candidate) ContextTokens() int { return c.DecodeTokens + c.PrefillHeldTokens }

// GPUEquivalentBlocks weighs exact overlap by tier: a CPU or disk block still has to be loaded.
func (c *Candidate) GPUEquivalentBlocks(w [NumTiers]float64) float64 {
	t := c.TierBlocks
	if t[TierGPU]+t[TierCPU]+t[TierDisk] == 0 {
		return float64(c.ExactBlocks)
	}
	return w[TierGPU]*float64(t[TierGPU]) + w[TierCPU]*float64(t[TierCPU]) + w[TierDisk]*float64(t[TierDisk])
}

// Policy chooses a replica for a request.
type Policy interface {
	// Name is the registry name.
	Name() string
	// Pick returns the index into cands of the chosen replica. It fails only when no candidate
	// is healthy.
	Pick(req *Request, cands []Candidate) (int, error)
	// OnRouted tells the policy the request went to cands[i] (its own pick, or an override by
	// the caller, e.g. a failover), so it can update its own state.
	OnRouted(req *Request, cands []Candidate, i int)
}

// Retractor is implemented by policies whose OnRouted state should not count a request whose
// attempt failed before the engine took it (the router retries it elsewhere): Retract takes
// back the OnRouted call with the same arguments.
type Retractor interface {
	Retract(req *Request, cands []Candidate, i int)
}

// Forgetter is implemented by policies that keep per-replica state: Forget drops the state of a
// replica that left the fleet.
type Forgetter interface {
	Forget(id string)
}

// Windowed is implemented by policies that read Candidate.Window: WindowSpan is the length of
// the windows the ledger keeps for them (DefaultWindow for every other policy).
type Windowed interface {
	WindowSpan() time.Duration
}

// ErrNoCandidate is returned when there is no healthy replica to choose.
var ErrNoCandidate = errors.New("score: no healthy candidate")

// Options configure a policy. Zero values take the documented defaults.
type Options struct {
	// Seed seeds every random choice (tie-breaks, random, temperature).
	Seed int64
	// KV tunes the `kv` cost model; the zero value means DefaultKV.
	KV *KVParams
}

// Factory builds a fresh policy (with its own state).
type Factory func(Options) Policy

// ProductionPolicies is the one list of the policies kvroute ships: what kvrouter --policy and
// --shadow-policy, router/config and the CRD's spec.router.policy and shadowPolicy accept (their
// kubebuilder enums must list exactly these; policies_test.go checks it). least-loaded is an
// alias of load.
var ProductionPolicies = []string{"kv", "load", "least-loaded", "round-robin", "session"}

var production = map[string]Factory{
	"kv":           func(o Options) Policy { return newKV(o) },
	"load":         func(o Options) Policy { return newLoad("load", o) },
	"least-loaded": func(o Options) Policy { return newLoad("least-loaded", o) },
	"round-robin":  func(o Options) Policy { return newRoundRobin() },
	"session":      func(o Options) Policy { return newSession(o) },
}

// Registry is the set of policies one binary offers, by name. kvrouter runs Production();
// kvbench adds the benchmark policies to its own copy (sim/policies), so no policy reaches the
// router binary unless its main registers it. Not safe for concurrent Register.
type Registry struct {
	names []string
	f     map[string]Factory
}

// Production returns a new registry holding the production policies, in ProductionPolicies'
// order.
func Production() *Registry {
	r := &Registry{f: map[string]Factory{}}
	for _, n := range ProductionPolicies {
		r.names = append(r.names, n)
		r.f[n] = production[n]
	}
	return r
}

// Register adds a policy under name; a name already registered is an error.
func (r *Registry) Register(name string, f Factory) error {
	if _, ok := r.f[name]; ok || name == "" || f == nil {
		return fmt.Errorf("score: cannot register policy %q (empty, nil or already registered)", name)
	}
	r.names = append(r.names, name)
	r.f[name] = f
	return nil
}

// Names lists the registered policies, in the order they were registered.
func (r *Registry) Names() []string { return append([]string(nil), r.names...) }

// New returns a fresh policy (with its own state) by name.
func (r *Registry) New(name string, o Options) (Policy, error) {
	f, ok := r.f[name]
	if !ok {
		return nil, fmt.Errorf("score: unknown policy %q (known: %s)", name, strings.Join(r.names, ", "))
	}
	return f(o), nil
}

// New returns a fresh production policy by name (Production().New).
func New(name string, o Options) (Policy, error) { return Production().New(name, o) }

// AnyHealthy reports whether some candidate may take traffic.
func AnyHealthy(cands []Candidate) bool {
	for i := range cands {
		if cands[i].Healthy {
			return true
		}
	}
	return false
}
