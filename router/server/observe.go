package server

import (
	"context"
	"errors"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/score"
)

// RequestObserver is the request-lifecycle seam: it is told about every generation request
// that was parsed, when the request is done (answered, failed or cut), on the request's own
// goroutine. The trace capture (router/capture) and the prompt audit (router/audit) hang off
// it; their logic stays in their packages. An observer must return quickly and never block on
// I/O: queue the work and count what it drops.
type RequestObserver interface {
	RequestDone(*RequestDone)
}

// RequestDone is what an observer learns about one request. Its slices are shared with the
// request path: read them during the call, copy what is kept.
type RequestDone struct {
	// Arrival is when the router received the request; Done when it finished with it.
	Arrival, Done time.Time
	// Tokens are the prompt's token ids as the engine renders them; nil when the request was
	// never tokenized (tokenization failed, no engine).
	Tokens []uint32
	// Identity is the LoRA adapter and cache salt, which change KV content besides tokens.
	Identity blockkey.Identity
	// Multimodal requests carry media the token ids do not show.
	Multimodal bool
	// Engine is the replica of the last attempt ("" when none was tried); Status its HTTP
	// status (0 when none came).
	Engine string
	Status int
	// Usage is the engine's usage when the answer carried one.
	Usage *proxy.Usage
	// TTFT is the time to the first token (0 when none came).
	TTFT time.Duration
	// Decision is the last attempt's routing decision (nil when none was made).
	Decision *Decision
}

// Decision is what a routing decision saw: the request as scored, every candidate's signals at
// that moment, and the pick. A shadow policy (router/shadow) re-decides on it.
type Decision struct {
	Request    *score.Request
	Candidates []score.Candidate
	Chosen     int
}

func (s *Server) observe(p *prepared, arrival time.Time, engine string, out *proxy.Outcome, dec *decision) {
	d := &RequestDone{Arrival: arrival, Done: s.now(), Tokens: p.toks, Identity: p.id,
		Multimodal: p.unkeyed == unkeyedMultimodal, Engine: engine, Status: out.Status, Usage: out.Usage, TTFT: out.TTFT}
	if dec != nil {
		d.Decision = &Decision{Request: &dec.req, Candidates: dec.cands, Chosen: dec.chosen}
	}
	for _, o := range s.o.Observers {
		o.RequestDone(d)
	}
}

// NewPolicy builds a policy the way the server builds its own (the configured scoring knobs and
// seed), for a shadow that re-decides requests without acting on them.
func (s *Server) NewPolicy(name string) (score.Policy, error) {
	if name == "least-loaded" {
		name = "load"
	}
	kv := kvParams(s.o.Config.Scoring)
	return score.New(name, score.Options{Seed: s.o.Seed + 1, KV: &kv})
}

// Detokenize turns token ids into text through a healthy engine's /detokenize (the prompt
// audit shows the shape of a varying span with it). It is the router's own call: it carries
// the engine API key.
func (s *Server) Detokenize(ctx context.Context, ids []uint32) (string, error) {
	reps, _ := s.table.snapshot()
	e := s.tokenizerEngine(reps)
	if e == nil {
		return "", errors.New("no healthy engine to detokenize with")
	}
	return s.tok.Detokenize(ctx, e.dp.Load().URL, e.model, ids)
}
