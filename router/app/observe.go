package app

import (
	"context"
	"errors"

	"github.com/kvroute/kvroute/router/score"
)

// NewPolicy builds a policy the way the router builds its own (the configured scoring knobs,
// another seed), for a shadow that re-decides requests without acting on them (router/shadow).
func (s *Router) NewPolicy(name string) (score.Policy, error) {
	if name == "least-loaded" {
		name = "load"
	}
	kv := kvParams(s.o.Config.Scoring)
	return s.o.Policies.New(name, score.Options{Seed: s.o.Seed + 1, KV: &kv})
}

// Detokenize turns token ids into text through a healthy engine's /detokenize (the prompt
// audit reads the shape of a varying span with it). It is the router's own call: it carries
// the engine API key.
func (s *Router) Detokenize(ctx context.Context, ids []uint32) (string, error) {
	e := s.tokenizerEngine(s.reps())
	if e == nil {
		return "", errors.New("no healthy engine to detokenize with")
	}
	return s.tok.Detokenize(ctx, e.Discovery().URL, e.Model, ids)
}
