package app

import "github.com/kvroute/kvroute/router/route"

// Scoring modes of a decision, as the accuracy counters label them (route.Decision.Mode).
const (
	modeExact       = route.ModeExact
	modePredicted   = route.ModePredicted
	modeApproximate = route.ModeApproximate
	modeUnkeyed     = route.ModeUnkeyed
)

// accountMode adds an answer with usage to its mode's accuracy counters, and for exact-mode
// decisions to the replica's evidence for keys-wrong (predicted vs actual cached tokens).
func (s *Router) accountMode(rep *replica, mode string, prompt, predicted, actual int) {
	name := rep.eng.name
	s.met.ModePromptTokens.WithLabelValues(name, mode).Add(float64(prompt))
	s.met.ModePredictedCached.WithLabelValues(name, mode).Add(float64(predicted))
	s.met.ModeActualCached.WithLabelValues(name, mode).Add(float64(actual))
	if mode == modeExact {
		rep.h.exactPred.Add(uint64(predicted))
		rep.h.exactActual.Add(uint64(actual))
	}
}
