package server

// Scoring modes of a decision, as the accuracy counters label them.
const (
	modeExact       = "exact"       // the chosen replica's exact index gave the overlap
	modePredicted   = "predicted"   // the predicted side index gave more than the exact one
	modeApproximate = "approximate" // the replica has no whole stream (or is demoted)
	modeUnkeyed     = "unkeyed"     // no keys: block size unknown, multimodal
)

// mode is the scoring mode behind the decision's predicted cached tokens.
func (d *decision) mode() string {
	c := &d.cands[d.chosen]
	switch {
	case d.unkeyed != "":
		return modeUnkeyed
	case c.Approximate:
		return modeApproximate
	case c.PredictedBlocks > c.ExactBlocks:
		return modePredicted
	}
	return modeExact
}

// accountMode adds an answer with usage to its mode's accuracy counters, and for exact-mode
// decisions to the replica's evidence for keys-wrong (predicted vs actual cached tokens).
func (s *Server) accountMode(rep *replica, mode string, prompt, predicted, actual int) {
	name := rep.eng.name
	s.met.ModePromptTokens.WithLabelValues(name, mode).Add(float64(prompt))
	s.met.ModePredictedCached.WithLabelValues(name, mode).Add(float64(predicted))
	s.met.ModeActualCached.WithLabelValues(name, mode).Add(float64(actual))
	if mode == modeExact {
		rep.h.exactPred.Add(uint64(predicted))
		rep.h.exactActual.Add(uint64(actual))
	}
}
