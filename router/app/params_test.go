package app

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/score"
)

func TestKVParamsFromScoring(t *testing.T) {
	def := kvParams(config.Default().Scoring)
	// The live router's defaults are the fleet model's: the figures in docs/benchmarks.md hold
	// for a router started without a config.
	if math.Abs(def.Slack-score.DefaultKV.Slack) > 1e-9 {
		t.Errorf("imbalanceBound %v - 1 differs from score.DefaultKV.Slack %v", config.Default().Scoring.ImbalanceBound, score.DefaultKV.Slack)
	}
	def.Slack = score.DefaultKV.Slack // 1.2 - 1 is not exactly 0.2
	if def != score.DefaultKV {
		t.Errorf("kv parameters from the default configuration %+v differ from score.DefaultKV %+v", def, score.DefaultKV)
	}
	sc := config.Default().Scoring
	sc.LoadWeight = 2
	sc.ImbalanceBound = 1.5
	sc.Temperature = 0.1
	sc.TierWeights = config.TierWeights{GPU: 1, CPU: 0.4, Disk: 0.1}
	got := kvParams(sc)
	// The decode load is weighed inside QueuedPrefillWeight (router/score/kv.go, load): doubling that
	// doubles it; DecodeWeight is its exchange rate to prefill tokens and stays.
	if got.QueuedPrefillWeight != 2*score.DefaultKV.QueuedPrefillWeight || got.DecodeWeight != score.DefaultKV.DecodeWeight {
		t.Errorf("loadWeight 2 did not double every load term: %+v", got)
	}
	if got.Slack != 0.5 || got.Temperature != 0.1 || got.TierWeights != [score.NumTiers]float64{1, 0.4, 0.1} {
		t.Errorf("imbalanceBound, temperature or tierWeights not carried over: %+v", got)
	}
}
