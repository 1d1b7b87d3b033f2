package score

// Calibration is one replica's engine timing as the router has measured it (router/load fits it
// from observed first-token times): the expected time to first token of a request routed there
// is
//
//	LatencyS + SecondsPerToken x (prefill tokens queued ahead + its own uncached tokens)
//	         + SecondsPerDecodeToken x tokens held by running sequences
//
// The zero value means "not measured": policies use DefaultCalibration.
type Calibration struct {
	LatencyS              float64
	SecondsPerToken       float64
	SecondsPerDecodeToken float64
	// DrainTokensPerS is the measured rate at which a replica's routed prefill reaches first
	// tokens while some is pending (router/load, Calibrations.ObserveDrain); 0 before any.
	DrainTokensPerS float64
	// Observations is the (decayed) weight of first-token times behind the fit; 0 when the
	// values are the prior.
	Observations float64
}

// DefaultCalibration is the prior a replica uses before anything is measured in the fleet: a
// vLLM engine's order of magnitude (10k prefill tokens/s, a 50 ms step and transfer, 0.1 ms of
// step time per 1k tokens of decode context). Only its
// proportions matter while every replica uses it; the first observations replace it.
var DefaultCalibration = Calibration{
	LatencyS:              0.05,
	SecondsPerToken:       1e-4,
	SecondsPerDecodeToken: 1e-7,
}

// Or is c, or d when c was never measured (zero).
func (c Calibration) Or(d Calibration) Calibration {
	if c.SecondsPerToken <= 0 {
		return d
	}
	return c
}

// TTFT is the expected time to first token of a request whose own uncached prefill is uncached
// tokens on a replica with candidate c's load, under this calibration.
func (c Calibration) TTFT(cand *Candidate, uncached float64) float64 {
	return c.LatencyS + c.SecondsPerToken*(float64(cand.PrefillTokens)+uncached) +
		c.SecondsPerDecodeToken*float64(cand.DecodeTokens)
}
