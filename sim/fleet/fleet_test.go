package fleet

import (
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/router/score"
)

func trace(t *testing.T, jsonl string) *Trace {
	t.Helper()
	tr, err := ReadTrace(strings.NewReader(jsonl))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// Access sequence 1 2 3 | 1 2 4 | 1 2 3. With 3 blocks both lines find 1,2 twice (4/9): LRU
// loses 3 to 4, and Belady evicts 3 too (its next use is the farthest). With 4 blocks LRU also
// keeps 3 (5/9). On a cycle 1 2 3 x3 with 2 blocks LRU always evicts the next block needed (0),
// while Belady keeps blocks whose next use is nearest (3/9).
func TestReferenceLinesOnHandMadeTraces(t *testing.T) {
	tr := trace(t, `{"timestamp":0,"input_length":1536,"output_length":1,"hash_ids":[1,2,3]}
{"timestamp":1,"input_length":1536,"output_length":1,"hash_ids":[1,2,4]}
{"timestamp":2,"input_length":1536,"output_length":1,"hash_ids":[1,2,3]}`)
	if got := GlobalLRU(tr, 3); !near(got, 4.0/9) {
		t.Errorf("global-lru = %v, want 4/9", got)
	}
	if got := Belady(tr, 3); !near(got, 4.0/9) {
		t.Errorf("belady = %v, want 4/9", got)
	}
	if got := GlobalLRU(tr, 4); !near(got, 5.0/9) {
		t.Errorf("global-lru with 4 blocks = %v, want 5/9", got)
	}
	// Cyclic access 1 2 3 1 2 3 1 2 3 with room for 2: LRU always evicts the next block needed
	// (0 hits), Belady keeps one of them: hits on positions 4 (1), 6 (3)... = 3/9 here.
	cyc := trace(t, `{"timestamp":0,"input_length":1536,"output_length":1,"hash_ids":[1,2,3]}
{"timestamp":1,"input_length":1536,"output_length":1,"hash_ids":[1,2,3]}
{"timestamp":2,"input_length":1536,"output_length":1,"hash_ids":[1,2,3]}`)
	if got := GlobalLRU(cyc, 2); got != 0 {
		t.Errorf("cyclic global-lru = %v, want 0", got)
	}
	if got, lru := Belady(cyc, 2), GlobalLRU(cyc, 2); got <= lru || !near(got, 3.0/9) {
		t.Errorf("cyclic belady = %v, want 3/9 (> lru %v)", got, lru)
	}
}

func TestReadTraceRejectsBadInput(t *testing.T) {
	for name, in := range map[string]string{
		"not json":     "{",
		"no blocks":    `{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[]}`,
		"too long":     `{"timestamp":0,"input_length":2000,"output_length":1,"hash_ids":[1]}`,
		"negative":     `{"timestamp":-1,"input_length":10,"output_length":1,"hash_ids":[1]}`,
		"empty":        "\n\n",
		"wrong fields": `{"timestamp":"x"}`,
	} {
		if _, err := ReadTrace(strings.NewReader(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestSessionKeySkipsSharedPrefix(t *testing.T) {
	var b strings.Builder
	// 200 requests all starting with block 0; each conversation's own block follows.
	for i := 0; i < 200; i++ {
		b.WriteString(`{"timestamp":` + itoa(i) + `,"input_length":1024,"output_length":1,"hash_ids":[0,` + itoa(1000+i/2) + `]}` + "\n")
	}
	tr := trace(t, b.String())
	if tr.Requests[0].Session != 1000 || tr.Requests[1].Session != 1000 || tr.Requests[2].Session != 1001 {
		t.Errorf("sessions %d %d %d, want 1000 1000 1001", tr.Requests[0].Session, tr.Requests[1].Session, tr.Requests[2].Session)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestServiceModelOnOneReplica(t *testing.T) {
	// Two identical prompts of 2 blocks, one after the other: the second hits both blocks.
	tr := trace(t, `{"timestamp":0,"input_length":1024,"output_length":10,"hash_ids":[7,8]}
{"timestamp":10000,"input_length":1024,"output_length":10,"hash_ids":[7,8]}`)
	r, err := Run(tr, Config{Replicas: 1, CapacityBlocks: 10}, "round-robin")
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.HitRateBlocks, 0.5) || !near(r.HitRateTokens, 0.5) {
		t.Errorf("hit rates %v/%v, want 0.5", r.HitRateBlocks, r.HitRateTokens)
	}
	// TTFTs: 1024/20000 s for the cold one, 1 token for the warm one.
	if !near(r.TTFTs[1], 1024.0/20000) || !near(r.TTFTs[0], 1.0/20000) {
		t.Errorf("ttfts %v", r.TTFTs)
	}
}

func TestQueueingAndPinning(t *testing.T) {
	// max-num-seqs 1: the second request waits for the first to finish decoding (10 x 20 ms).
	tr := trace(t, `{"timestamp":0,"input_length":512,"output_length":10,"hash_ids":[1]}
{"timestamp":0,"input_length":512,"output_length":10,"hash_ids":[2]}`)
	r, err := Run(tr, Config{Replicas: 1, CapacityBlocks: 1, MaxNumSeqs: 1, Engine: EngineSerial}, "load")
	if err != nil {
		t.Fatal(err)
	}
	first := 512.0 / 20000
	if !near(r.TTFTs[1], first+0.2+first) {
		t.Errorf("queued ttft %v, want %v", r.TTFTs[1], first+0.2+first)
	}
}

// The step engine schedules like vLLM v1 (step.go): the first token comes out of the step that
// computes the last prompt token, so 10 output tokens take that step and 9 decode steps; a
// prompt arriving during a step waits for the next one, and decodes share steps with prefill
// chunks; a prompt over the step's token budget is chunked; a request scheduled in the same
// step as another already hits the blocks that one's chunk fills.
func TestStepEngineOnOneReplica(t *testing.T) {
	for _, c := range []struct {
		name    string
		maxSeqs int
		jsonl   string
		ttfts   []float64 // in trace order
		hitTok  float64
	}{
		{"max-num-seqs 1: the second waits for 1 prefill step and 9 decode steps", 1, `{"timestamp":0,"input_length":512,"output_length":10,"hash_ids":[1]}
{"timestamp":0,"input_length":512,"output_length":10,"hash_ids":[2]}`,
			[]float64{0.0256, 0.0256 + 9*0.020 + 0.0256}, 0},
		// A: prefill [0, 0.0256), decode [0.0256, 0.0456); B arrives at 0.030 and joins the next
		// step beside A's decode: 4096/20000 + 0.020 s, ending 0.2704.
		{"a decode shares the step with a prefill", 32, `{"timestamp":0,"input_length":512,"output_length":3,"hash_ids":[1]}
{"timestamp":30,"input_length":4096,"output_length":3,"hash_ids":[11,12,13,14,15,16,17,18]}`,
			[]float64{0.0256, 0.2704 - 0.030}, 0},
		// A takes 6144 of the 8192-token budget; B hits A's first 4 blocks (registered when A was
		// scheduled) and gets 2048 of its 4096 uncached tokens, the rest in the next step beside
		// A's first decode: 2048/20000 + 0.020 s.
		{"chunked prefill and a same-step hit", 32, `{"timestamp":0,"input_length":6144,"output_length":3,"hash_ids":[1,2,3,4,5,6,7,8,9,10,11,12]}
{"timestamp":0,"input_length":6144,"output_length":3,"hash_ids":[1,2,3,4,21,22,23,24,25,26,27,28]}`,
			[]float64{0.4096, 0.4096 + 0.1024 + 0.020}, 2048.0 / 12288},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := Run(trace(t, c.jsonl), Config{Replicas: 1, CapacityBlocks: 100, MaxNumSeqs: c.maxSeqs}, "round-robin")
			if err != nil {
				t.Fatal(err)
			}
			// r.TTFTs is sorted; every case's TTFTs are in trace order already.
			for i, want := range c.ttfts {
				if math.Abs(r.TTFTs[i]-want) > 1e-9 {
					t.Errorf("ttft %d = %v, want %v", i, r.TTFTs[i], want)
				}
			}
			if !near(r.HitRateTokens, c.hitTok) {
				t.Errorf("token hit rate %v, want %v", r.HitRateTokens, c.hitTok)
			}
		})
	}
}

func TestDeterministic(t *testing.T) {
	tr, err := LoadTrace("../../testdata/traces/mooncake/synthetic_trace.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	tr.Requests = tr.Requests[:800]
	for _, p := range []string{"kv", "random", "prefix-char", "sglang-cache-aware", "llmd-default", "session"} {
		a, err := Run(tr, Config{}, p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Run(tr, Config{}, p)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: two runs differ", p)
		}
	}
}

func TestPublishedReferenceFigures(t *testing.T) {
	for _, c := range []struct {
		file        string
		lru, belady float64
		rr          float64
	}{
		{"mooncake/conversation_trace.jsonl", 0.105, 0.339, 0.050},
		{"mooncake/synthetic_trace.jsonl", 0.276, 0.520, 0.044},
		{"synthetic/llmd_shared_prefix_150x5_6000_1200_1000.jsonl", 0.982, 0.982, 0.196},
	} {
		tr, err := LoadTrace("../../testdata/traces/" + c.file)
		if err != nil {
			t.Fatal(err)
		}
		if got := GlobalLRU(tr, 4800); math.Abs(got-c.lru) > 0.0006 {
			t.Errorf("%s global-lru %.4f, published %.3f", c.file, got, c.lru)
		}
		if got := Belady(tr, 4800); math.Abs(got-c.belady) > 0.0006 {
			t.Errorf("%s belady %.4f, published %.3f", c.file, got, c.belady)
		}
		// Round-robin runs through the timed model, so only roughly the published figure.
		r, err := Run(tr, Config{}, "round-robin")
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(r.HitRateBlocks-c.rr) > 0.005 {
			t.Errorf("%s round-robin %.4f, published %.3f", c.file, r.HitRateBlocks, c.rr)
		}
	}
}

func TestBadConfig(t *testing.T) {
	tr := trace(t, `{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[1]}`)
	if _, err := Run(tr, Config{Replicas: 10, CapacityBlocks: 5}, "kv"); err == nil {
		t.Error("capacity below one block per replica accepted")
	}
	if _, err := Run(tr, Config{}, "nope"); err == nil {
		t.Error("unknown policy accepted")
	}
}

// A capture's "replicas" is the fleet the router had: requests are routed over that many
// replicas only, and a replica joining takes requests from then on. Without the field every
// replica is in the fleet from the start.
func TestMembershipFromTrace(t *testing.T) {
	lines := func(sizes ...int) string {
		var b strings.Builder
		for i, n := range sizes {
			at := i * 1000
			if i >= 3 {
				at = 61000 + i*1000 // the second 60 s window
			}
			b.WriteString(`{"timestamp":` + itoa(at) + `,"input_length":512,"output_length":1,"hash_ids":[` + itoa(100+i) + `]`)
			if n > 0 {
				b.WriteString(`,"replicas":` + itoa(n))
			}
			b.WriteString("}\n")
		}
		return b.String()
	}
	r, err := Run(trace(t, lines(1, 1, 1, 2, 2)), Config{Replicas: 2, CapacityBlocks: 10}, "round-robin")
	if err != nil {
		t.Fatal(err)
	}
	if w := r.WindowLoad[0]; w[0] != 3*512 || w[1] != 0 {
		t.Errorf("first window's prefill per replica %v, want all on r0 (r1 not in the fleet yet)", w)
	}
	if w := r.WindowLoad[1]; w[1] == 0 {
		t.Errorf("second window's prefill per replica %v: r1 joined and took nothing", w)
	}
	r, err = Run(trace(t, lines(0, 0, 0, 0, 0)), Config{Replicas: 2, CapacityBlocks: 10}, "round-robin")
	if err != nil {
		t.Fatal(err)
	}
	if w := r.WindowLoad[0]; w[1] == 0 {
		t.Errorf("without membership, first window %v: r1 should take requests from the start", w)
	}
}

// seen is a policy that picks replica 0 and keeps a copy of every candidate list it was asked
// about.
type seen struct{ cands [][]score.Candidate }

func (p *seen) Name() string { return "seen" }
func (p *seen) Pick(_ *score.Request, c []score.Candidate) (int, error) {
	p.cands = append(p.cands, slices.Clone(c))
	return 0, nil
}
func (p *seen) OnRouted(*score.Request, []score.Candidate, int) {}

// The fleet model's candidates are the live router's (router/route): a prompt whose every
// block is cached is offered at most its computable blocks (the engine recomputes the last
// token), and a replica with a prompt still in prefill carries that prompt's attention.
func TestCandidatesAreTheRoutersOwn(t *testing.T) {
	// 1: 1024 tokens, 2 blocks, cold. 2: the same prompt long after (both blocks cached).
	// 3 and 4 arrive together: 4 sees 3 in prefill on replica 0.
	tr := trace(t, `{"timestamp":0,"input_length":1024,"output_length":1,"hash_ids":[7,8]}
{"timestamp":10000,"input_length":1024,"output_length":1,"hash_ids":[7,8]}
{"timestamp":20000,"input_length":600,"output_length":1,"hash_ids":[20,21]}
{"timestamp":20000,"input_length":600,"output_length":1,"hash_ids":[30,31]}`)
	cfg, err := Config{Replicas: 2, CapacityBlocks: 20}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	pol := &seen{}
	if _, err := run(tr, cfg, pol.Name(), pol); err != nil {
		t.Fatal(err)
	}
	if len(pol.cands) != 4 {
		t.Fatalf("%d decisions, want 4", len(pol.cands))
	}
	// (1024-1)/512 = 1 block can hit, though both are cached.
	if c := pol.cands[1][0]; c.ExactBlocks != 1 || c.PredictedBlocks != 1 || c.TierBlocks != [score.NumTiers]int{1, 0, 0} {
		t.Errorf("fully cached prompt offered %d exact, %d predicted blocks (%v); want the cap, 1", c.ExactBlocks, c.PredictedBlocks, c.TierBlocks)
	}
	// Request 3's 600 uncached tokens over each other: 600 x 599 / 2 token pairs.
	if c := pol.cands[3][0]; c.PrefillAttention != 600*599/2 || c.PrefillTokens != 600 {
		t.Errorf("replica 0 with a prompt in prefill: attention %d, prefill %d; want %d, 600", c.PrefillAttention, c.PrefillTokens, 600*599/2)
	}
}
