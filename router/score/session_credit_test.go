package score

import (
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
)

// kv credits the session's home replica one block only when the overlap tells no candidate
// apart: it decides between otherwise equal replicas and a load difference under a block, never
// against a longer overlap or a real load difference.
func TestSessionHomeCreditOnlyWithoutOverlapDifference(t *testing.T) {
	p := newKV(Options{Seed: 1})
	req := &Request{Keys: make([]blockkey.Key, 5), Tokens: 64, BlockSize: 16, SessionKey: "conv", NowNs: 1}
	cands := func() []Candidate {
		cs := make([]Candidate, 3)
		for i := range cs {
			cs[i] = Candidate{ID: string(rune('a' + i)), Healthy: true, ExactBlocks: 3, TierBlocks: [NumTiers]int{3, 0, 0}}
		}
		return cs
	}
	pick := func(cs []Candidate) int {
		t.Helper()
		i, err := p.Pick(req, cs)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	// a is a little less loaded (under a block's prefill); c is the session's home.
	cs := cands()
	cs[1].PrefillTokens, cs[2].PrefillTokens = 20, 20
	if got := pick(cs); got != 0 {
		t.Fatalf("without a home: picked %d, want 0 (least loaded)", got)
	}
	cs[2].SessionHome = true
	if got := pick(cs); got != 2 {
		t.Fatalf("home within a block of the least loaded: picked %d, want 2", got)
	}
	// The request carries no session: no credit.
	noSess := *req
	noSess.SessionKey = ""
	if i, _ := p.Pick(&noSess, cs); i != 0 {
		t.Fatalf("no session key: picked %d, want 0", i)
	}
	// An overlap difference decides: b holds one more block, the home gets no credit.
	cs = cands()
	cs[1].ExactBlocks, cs[1].TierBlocks = 4, [NumTiers]int{4, 0, 0}
	cs[2].SessionHome = true
	req.Tokens = 80
	if got := pick(cs); got != 1 {
		t.Fatalf("longer overlap elsewhere: picked %d, want 1", got)
	}
	req.Tokens = 64
	// A load difference past a block decides against the home.
	cs = cands()
	cs[2].SessionHome = true
	cs[2].PrefillTokens = 400
	if got := pick(cs); got == 2 {
		t.Fatal("home with far more prefill ahead picked")
	}
	// Explain shows the credit on the home.
	cs = cands()
	cs[2].SessionHome = true
	ex := p.Explain(req, cs)
	found := false
	for _, term := range ex[2].Terms {
		found = found || (term.Name == "session_home_credit" && term.Value == -16)
	}
	if !found || ex[2].Cost >= ex[0].Cost {
		t.Fatalf("explanation of the home %+v (others' cost %v)", ex[2], ex[0].Cost)
	}
}
