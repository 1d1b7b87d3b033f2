package shadow

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/score"
)

// Production (round-robin, say) sent a request to a replica without its prefix; the kv shadow,
// on the same signals, picks the replica that holds it and the metrics show both.
func TestShadowKVOnProductionsSignals(t *testing.T) {
	pol, err := score.New("kv", score.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := New(pol)
	keys := make([]blockkey.Key, 10)
	for i := range keys {
		keys[i] = blockkey.Key(i + 1)
	}
	req := &score.Request{Keys: keys, Tokens: 160, BlockSize: 16}
	cands := []score.Candidate{
		{ID: "a", Healthy: true},
		{ID: "b", Healthy: true, ExactBlocks: 8, TierBlocks: [score.NumTiers]int{8}},
		{ID: "c", Healthy: true},
	}
	s.Observe(req, cands, 0)
	if got := testutil.ToFloat64(s.decisions.WithLabelValues("kv", "false")); got != 1 {
		t.Fatalf("disagreements %v, want 1", got)
	}
	if sh, pr := testutil.ToFloat64(s.cached.WithLabelValues("kv", "shadow")), testutil.ToFloat64(s.cached.WithLabelValues("kv", "production")); sh != 128 || pr != 0 {
		t.Fatalf("cached shadow %v production %v, want 128 and 0", sh, pr)
	}
	s.Observe(req, cands, 1)
	if got := testutil.ToFloat64(s.decisions.WithLabelValues("kv", "true")); got != 1 {
		t.Fatalf("agreements %v, want 1", got)
	}
	// Unkeyed requests are skipped.
	s.Observe(&score.Request{Tokens: 100, BlockSize: 16}, cands, 0)
	if got := testutil.ToFloat64(s.prompt); got != 320 {
		t.Fatalf("prompt tokens %v, want 320", got)
	}
}

func TestCachedTokensKeepsTheLastToken(t *testing.T) {
	req := &score.Request{Tokens: 32, BlockSize: 16}
	if got := CachedTokens(req, &score.Candidate{ExactBlocks: 2}); got != 31 {
		t.Fatalf("%d, want 31", got)
	}
	if got := CachedTokens(req, &score.Candidate{PredictedBlocks: 1}); got != 16 {
		t.Fatalf("%d, want 16", got)
	}
}
