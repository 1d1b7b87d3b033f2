package replay

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim/fleet"
)

func TestTokenizerDeterministicAndBlockwise(t *testing.T) {
	tk := Tokenizer{PerBlock: 32}
	a := &Request{HashIDs: []uint64{0, 1, 2}, InputLength: 3 * 512}
	b := &Request{HashIDs: []uint64{0, 1, 9}, InputLength: 3 * 512}
	pa, pb := tk.Prompt(a), tk.Prompt(b)
	if len(pa) != 96 || len(pb) != 96 {
		t.Fatalf("prompt lengths %d, %d; want 96", len(pa), len(pb))
	}
	for i := 0; i < 64; i++ {
		if pa[i] != pb[i] {
			t.Fatalf("token %d differs inside shared blocks 0,1: %d vs %d", i, pa[i], pb[i])
		}
	}
	same := 0
	for i := 64; i < 96; i++ {
		if pa[i] == pb[i] {
			same++
		}
	}
	if same > 2 {
		t.Fatalf("blocks 2 and 9 share %d of 32 tokens", same)
	}
	if again := tk.Prompt(a); !equalU32(again, pa) {
		t.Fatal("the same request gave different tokens")
	}
	for _, id := range pa {
		if id < tokenLo || id >= tokenHi || id >= 151643 {
			t.Fatalf("token %d outside the safe vocabulary range", id)
		}
	}
	// Within a block, positions differ (a block is not one repeated token).
	distinct := map[uint32]bool{}
	for _, id := range pa[:32] {
		distinct[id] = true
	}
	if len(distinct) < 30 {
		t.Fatalf("block 0 has only %d distinct tokens", len(distinct))
	}
}

func TestTokenizerPartialLastBlockAndScale(t *testing.T) {
	tk := Tokenizer{PerBlock: 32}
	r := &Request{HashIDs: []uint64{5, 6}, InputLength: 512 + 256} // one and a half blocks
	if got := tk.PromptLen(r); got != 48 {
		t.Fatalf("PromptLen = %d, want 48", got)
	}
	if got := len(tk.Prompt(r)); got != 48 {
		t.Fatalf("len(Prompt) = %d, want 48", got)
	}
	tiny := &Request{HashIDs: []uint64{5}, InputLength: 1}
	if got := len(tk.Prompt(tiny)); got != 1 {
		t.Fatalf("a 1-token request gave %d tokens, want at least 1", got)
	}
	full := Tokenizer{PerBlock: fleet.TraceBlockTokens}
	if got := len(full.Prompt(r)); got != 768 {
		t.Fatalf("unscaled prompt %d tokens, want 768", got)
	}
}

// threeRequestTrace is a trace of three requests at 1 s, 3 s and 9 s, the second sharing the
// first's block.
func threeRequestTrace(t *testing.T) *fleet.Trace {
	t.Helper()
	tr, err := fleet.ReadTrace(strings.NewReader(`{"timestamp": 1000, "input_length": 10, "output_length": 5, "hash_ids": [1]}
{"timestamp": 3000, "input_length": 10, "output_length": 5, "hash_ids": [1, 2]}
{"timestamp": 9000, "input_length": 10, "output_length": 5, "hash_ids": [3]}
`))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestTraceSliceCompressesAndBounds(t *testing.T) {
	tr := threeRequestTrace(t)
	w, err := TraceSlice(tr, 0, 0, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, time.Second, 4 * time.Second}
	for i, r := range w.Requests {
		if r.At != want[i] {
			t.Fatalf("request %d at %v, want %v", i, r.At, want[i])
		}
	}
	w, _ = TraceSlice(tr, 1, 1, 1, 0)
	if len(w.Requests) != 1 || w.Requests[0].At != 0 || len(w.Requests[0].HashIDs) != 2 {
		t.Fatalf("offset 1, max 1: %+v", w.Requests)
	}
	w, _ = TraceSlice(tr, 0, 0, 1, 3*time.Second)
	if len(w.Requests) != 2 {
		t.Fatalf("duration bound 3 s kept %d requests, want 2", len(w.Requests))
	}
	if _, err := TraceSlice(tr, 5, 0, 1, 0); err == nil {
		t.Fatal("offset past the end accepted")
	}
	if _, err := TraceSlice(tr, 0, 0, 0, 0); err == nil {
		t.Fatal("speed 0 accepted")
	}
}

func TestJitteredIsSeededAndSorted(t *testing.T) {
	w, _ := Regime("no-reuse", RegimeOptions{Requests: 50, Seed: 1})
	a, b := w.Jittered(7, 50*time.Millisecond), w.Jittered(7, 50*time.Millisecond)
	c := w.Jittered(8, 50*time.Millisecond)
	diff := false
	for i := range a.Requests {
		if a.Requests[i].At != b.Requests[i].At {
			t.Fatal("same seed, different arrivals")
		}
		if a.Requests[i].At != c.Requests[i].At {
			diff = true
		}
		if i > 0 && a.Requests[i].At < a.Requests[i-1].At {
			t.Fatal("jittered arrivals out of order")
		}
		if d := a.Requests[i].At - w.Requests[i].At; i == 0 && (d < 0 || d >= 50*time.Millisecond) {
			t.Fatalf("first arrival moved by %v", d)
		}
	}
	if !diff {
		t.Fatal("seeds 7 and 8 gave identical arrivals")
	}
	if same := w.Jittered(7, 0); len(same.Requests) != len(w.Requests) || same.Requests[3].At != w.Requests[3].At {
		t.Fatal("zero jitter changed the workload")
	}
}

// blockUse counts how many requests hold each block id.
func blockUse(w Workload) map[uint64]int {
	m := map[uint64]int{}
	for _, r := range w.Requests {
		for _, h := range r.HashIDs {
			m[h]++
		}
	}
	return m
}

func TestRegimes(t *testing.T) {
	for _, name := range RegimeNames() {
		w, err := Regime(name, RegimeOptions{Requests: 80, Replicas: 8, Seed: 3})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(w.Requests) != 80 {
			t.Fatalf("%s: %d requests, want 80", name, len(w.Requests))
		}
		for i, r := range w.Requests {
			if i > 0 && r.At < w.Requests[i-1].At {
				t.Fatalf("%s: arrivals not sorted at %d", name, i)
			}
			if r.InputLength != len(r.HashIDs)*512 || r.OutputLength <= 0 {
				t.Fatalf("%s: request %d lengths %d/%d for %d blocks", name, i, r.InputLength, r.OutputLength, len(r.HashIDs))
			}
		}
		again, _ := Regime(name, RegimeOptions{Requests: 80, Replicas: 8, Seed: 3})
		if again.Requests[10].HashIDs[len(again.Requests[10].HashIDs)-1] != w.Requests[10].HashIDs[len(w.Requests[10].HashIDs)-1] || again.Requests[10].At != w.Requests[10].At {
			t.Fatalf("%s: not deterministic for a seed", name)
		}
		use := blockUse(w)
		switch name {
		case "no-reuse":
			for h, n := range use {
				if n != 1 {
					t.Fatalf("no-reuse: block %d used %d times", h, n)
				}
			}
		case "hot-prefix", "tenants":
			if use[0] != 80 {
				t.Fatalf("%s: hot block used by %d of 80", name, use[0])
			}
		case "siblings":
			for i := 0; i < 80; i += siblingsBurst {
				g := w.Requests[i : i+siblingsBurst]
				for _, r := range g {
					if r.At != g[0].At || r.HashIDs[0] != g[0].HashIDs[0] {
						t.Fatalf("siblings: burst at %d not simultaneous with one prefix", i)
					}
				}
			}
		case "scale-up":
			su := w.ScaleUp
			if su == nil || su.From != 4 || su.To != 8 || su.At <= 0 || su.At >= w.Span() {
				t.Fatalf("scale-up: %+v over span %v", su, w.Span())
			}
		}
		if name == "tenants" {
			salts := map[string]string{}
			for _, r := range w.Requests {
				if r.Model == "" || r.CacheSalt == "" {
					t.Fatal("tenants: a request without adapter or salt")
				}
				if prev, ok := salts[r.Model]; ok && prev != r.CacheSalt {
					t.Fatalf("tenant %s has two salts", r.Model)
				}
				salts[r.Model] = r.CacheSalt
			}
			if len(salts) != tenantCount || len(w.Adapters) != tenantCount {
				t.Fatalf("tenants: %d tenants seen, %d adapters", len(salts), len(w.Adapters))
			}
		}
	}
	if _, err := Regime("nope", RegimeOptions{}); err == nil || !strings.Contains(err.Error(), "no-reuse") {
		t.Fatalf("unknown regime error %v does not list the known ones", err)
	}
}

// A regime as a fleet-model trace: arrivals in milliseconds, lengths and block ids kept; a
// tenant's adapter and salt give it its own copy of the shared prefix, which no other tenant's
// request shares, while one tenant's requests still share theirs.
func TestWorkloadTrace(t *testing.T) {
	w, err := Regime("hot-prefix", RegimeOptions{Requests: 40, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	tr := w.Trace()
	if tr.Name != "hot-prefix" || len(tr.Requests) != 40 {
		t.Fatalf("trace %q of %d requests", tr.Name, len(tr.Requests))
	}
	for i, q := range tr.Requests {
		r := w.Requests[i]
		if q.TimestampMs != r.At.Milliseconds() || q.InputLength != r.InputLength || q.OutputLength != r.OutputLength ||
			!slices.Equal(q.HashIDs, r.HashIDs) {
			t.Fatalf("request %d: %+v from %+v", i, q, r)
		}
	}
	w, err = Regime("tenants", RegimeOptions{Requests: 80, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	tr = w.Trace()
	firstBlock := map[string]uint64{} // tenant -> its copy of the shared prefix's first block
	owner := map[uint64]string{}      // block id -> the tenant using it
	for i, q := range tr.Requests {
		tenant := w.Requests[i].Model
		if f, ok := firstBlock[tenant]; ok && q.HashIDs[0] != f {
			t.Fatalf("tenant %s: request %d starts at block %d, its first began at %d", tenant, i, q.HashIDs[0], f)
		}
		firstBlock[tenant] = q.HashIDs[0]
		for _, id := range q.HashIDs {
			if o, ok := owner[id]; ok && o != tenant {
				t.Fatalf("block %d shared by tenants %s and %s", id, o, tenant)
			}
			owner[id] = tenant
		}
	}
	if len(firstBlock) != tenantCount {
		t.Fatalf("%d tenants in the trace, want %d", len(firstBlock), tenantCount)
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	for p, want := range map[float64]float64{0: 1, 0.5: 3, 0.9: 4.6, 1: 5, 0.25: 2} {
		if got := Percentile(xs, p); math.Abs(got-want) > 1e-9 {
			t.Errorf("p%.2f = %v, want %v", p, got, want)
		}
	}
	if xs[0] != 5 {
		t.Fatal("Percentile sorted its input")
	}
	if !math.IsNaN(Percentile(nil, 0.5)) {
		t.Fatal("percentile of nothing is not NaN")
	}
}

func TestTInterval(t *testing.T) {
	iv := TInterval([]float64{1, 2, 3})
	// mean 2, s = 1, t(2) = 4.303: half-width 4.303/sqrt(3) = 2.4843
	if iv.N != 3 || math.Abs(iv.Mean-2) > 1e-9 || math.Abs(iv.Hi-2-2.48434) > 1e-4 || iv.Lo != 0 { // 2-2.48 cut at 0
		t.Fatalf("TInterval(1,2,3) = %+v", iv)
	}
	if one := TInterval([]float64{7}); one.Lo != 7 || one.Hi != 7 || one.N != 1 {
		t.Fatalf("one seed: %+v", one)
	}
	// Two seeds: their min..max, never a negative time.
	if two := TInterval([]float64{0.1, 0.9}); !two.Range || two.Lo != 0.1 || two.Hi != 0.9 || math.Abs(two.Mean-0.5) > 1e-9 {
		t.Errorf("TInterval(0.1, 0.9) = %+v, want the range 0.1..0.9", two)
	}
	// Three widely spread non-negative values: the lower end is cut at 0.
	if wide := TInterval([]float64{0.01, 0.02, 5}); wide.Lo != 0 || wide.Range || wide.Hi <= 5 {
		t.Errorf("TInterval(0.01, 0.02, 5) = %+v, want lo 0", wide)
	}
	if neg := TInterval([]float64{-1, 0, 1}); neg.Lo >= -1 {
		t.Errorf("TInterval(-1, 0, 1) = %+v: values below zero keep the plain t-interval", neg)
	}
	if nan := TInterval([]float64{math.NaN(), 4, 4}); nan.N != 2 || nan.Mean != 4 || nan.Lo != 4 {
		t.Fatalf("NaN not skipped: %+v", nan)
	}
	b, err := json.Marshal(TInterval(nil))
	if err != nil || string(b) != `{"mean":null,"lo":null,"hi":null,"n":0}` {
		t.Fatalf("empty interval JSON %s, %v", b, err)
	}
}

func TestSummarizeAndScaleUp(t *testing.T) {
	mk := func(seed int, ttfts ...float64) *RunResult {
		r := &RunResult{Policy: "kv", Seed: seed, Wall: 2}
		for i, v := range ttfts {
			r.Outcomes = append(r.Outcomes, Outcome{Index: i, TTFT: v, E2E: v + 1, PromptTokens: 100, CachedTokens: 50, OutputTokens: 10})
		}
		return r
	}
	bad := mk(2, 0.1, 0.2)
	bad.Outcomes = append(bad.Outcomes, Outcome{Err: "HTTP 503: no engine"})
	rr := &RunResult{Policy: "round-robin", Seed: 1, Wall: 1, Outcomes: []Outcome{{TTFT: 1, E2E: 2, PromptTokens: 10}}}
	s := Summarize([]*RunResult{mk(1, 0.1, 0.2, 0.3, 0.4), rr, bad})
	if len(s) != 2 || s[0].Policy != "kv" || s[1].Policy != "round-robin" {
		t.Fatalf("grouping: %+v", s)
	}
	kv := s[0]
	if kv.Seeds != 2 || kv.Errors != 1 || len(kv.FirstErrors) != 1 || kv.CachedRatio.Mean != 0.5 {
		t.Fatalf("kv summary %+v", kv)
	}
	if math.Abs(kv.Throughput.Mean-1.5) > 1e-9 { // (4/2 + 2/2) / 2
		t.Fatalf("throughput %v, want 1.5", kv.Throughput.Mean)
	}
	if s[1].CachedRatio.Mean != 0 || s[1].TTFTP90.Mean != 1 {
		t.Fatalf("round-robin summary %+v", s[1])
	}

	// 3 of 4 requests on engine-0 of 2 engines: 1.5 x a fair share; the error is not counted.
	sp := &RunResult{Policy: "kv", Seed: 1, Wall: 1, Engines: []string{"engine-0", "engine-1"}}
	for _, e := range []string{"engine-0", "engine-0", "engine-1", "engine-0"} {
		sp.Outcomes = append(sp.Outcomes, Outcome{Engine: e, TTFT: 0.1, PromptTokens: 1})
	}
	sp.Outcomes = append(sp.Outcomes, Outcome{Engine: "engine-1", Err: "HTTP 502"})
	if got := Summarize([]*RunResult{sp})[0].MaxEngineShare.Mean; got != 1.5 {
		t.Fatalf("max engine share %v, want 1.5", got)
	}
	// Work: engine-1's one request is 600 uncached tokens against engine-0's three of 100 (one
	// of them half cached): 600 of 850 on 2 engines is 1.41 x a fair share, where requests are
	// 1.5 on engine-0.
	wk := &RunResult{Policy: "kv", Seed: 1, Wall: 1, Engines: []string{"engine-0", "engine-1"}}
	wk.Outcomes = []Outcome{{Engine: "engine-0", PromptTokens: 100}, {Engine: "engine-0", PromptTokens: 100, CachedTokens: 50},
		{Engine: "engine-0", PromptTokens: 100}, {Engine: "engine-1", PromptTokens: 600}}
	if got, want := Summarize([]*RunResult{wk})[0].MaxEngineWorkShare.Mean, 600.0*2/850; math.Abs(got-want) > 1e-9 {
		t.Fatalf("max engine work share %v, want %v", got, want)
	}
	// An engine that got nothing still counts towards the fair share.
	if got := maxShare(map[string]int{"a": 2}, 4, 2); got != 4 {
		t.Fatalf("all on one of 4 engines: %v, want 4", got)
	}

	su := &ScaleUp{At: 10 * time.Second, From: 4, To: 8, Warmup: 2 * time.Second}
	out := []Outcome{
		{SentAt: 9 * time.Second, Engine: "engine-0", PromptTokens: 100, CachedTokens: 80},
		{SentAt: 10 * time.Second, Engine: "engine-5", PromptTokens: 100, CachedTokens: 0},
		{SentAt: 11 * time.Second, Engine: "engine-1", PromptTokens: 100, CachedTokens: 80},
		{SentAt: 11 * time.Second, Engine: "engine-2", PromptTokens: 100, CachedTokens: 80},
		{SentAt: 11 * time.Second, Engine: "engine-3", PromptTokens: 100, CachedTokens: 80},
		{SentAt: 13 * time.Second, Engine: "engine-6", PromptTokens: 100, CachedTokens: 0}, // after the window
	}
	r := scaleUpResult(out, []string{"engine-4", "engine-5", "engine-6", "engine-7"}, su, 4)
	// 1 of 4 in the window on a new replica, fair share 0.5: 0.5 of fair.
	if r.NewShareOfFair != 0.5 || r.HitBefore != 0.8 || math.Abs(r.HitDuring-0.6) > 1e-9 || math.Abs(r.HitDrop-0.25) > 1e-9 {
		t.Fatalf("scale-up result %+v", r)
	}
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// An unmeasured figure (NaN) is JSON null, not an encoding error (kvbench replay --json on a
// scale-up whose window saw no request).
func TestUnmeasuredFiguresAreJSONNull(t *testing.T) {
	b, err := json.Marshal(RunResult{Policy: "kv", ScaleUp: &ScaleUpResult{NewShareOfFair: math.NaN(), HitBefore: 0.5, HitDuring: math.NaN(), HitDrop: math.Inf(1)}})
	if err != nil || !strings.Contains(string(b), `"scale_up":{"new_share_of_fair":null,"hit_before":0.5,"hit_during":null,"hit_drop":null}`) {
		t.Fatalf("%s (%v)", b, err)
	}
	b, err = json.Marshal(TInterval(nil))
	if err != nil || string(b) != `{"mean":null,"lo":null,"hi":null,"n":0}` {
		t.Fatalf("%s (%v)", b, err)
	}
	b, err = json.Marshal(TInterval([]float64{1, 2, 3}))
	var back Interval
	if err != nil || json.Unmarshal(b, &back) != nil || back.Mean != 2 || back.N != 3 {
		t.Fatalf("%s (%v) -> %+v", b, err, back)
	}
}

func TestWarmSliceIsTheTrafficBeforeTheOffset(t *testing.T) {
	tr := threeRequestTrace(t)
	warm, err := WarmSlice(tr, 2, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(warm) != 2 || warm[0].At != 0 || warm[1].At != time.Second || len(warm[1].HashIDs) != 2 {
		t.Fatalf("the 2 requests before offset 2 at speed 2: %+v", warm)
	}
	if warm, err := WarmSlice(tr, 2, 0, 1); err != nil || warm != nil {
		t.Fatalf("no warm-up: %v, %v", warm, err)
	}
	for _, c := range []struct{ offset, n int }{{1, 2}, {4, 1}} {
		if _, err := WarmSlice(tr, c.offset, c.n, 1); err == nil {
			t.Errorf("offset %d, %d warm-up requests accepted", c.offset, c.n)
		}
	}
	if _, err := WarmSlice(tr, 2, 1, 0); err == nil {
		t.Error("speed 0 accepted")
	}
}
