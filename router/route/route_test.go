package route_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/route"
	"github.com/kvroute/kvroute/router/score"
)

// pickFirst is a policy that picks candidate 0; the decision never asks it anything.
type pickFirst struct{}

func (pickFirst) Name() string                                        { return "first" }
func (pickFirst) Pick(*score.Request, []score.Candidate) (int, error) { return 0, nil }
func (pickFirst) OnRouted(*score.Request, []score.Candidate, int)     {}

// world is four replicas over a real index and a real ledger:
//   - r0 holds the whole 10-block prompt: 6 blocks on GPU, 3 on CPU, 1 on disk, and carries
//     load (100 prefill tokens, one request);
//   - r1 holds nothing and is not ready, not healthy and already tried;
//   - r2 is scored approximately: 2 blocks exact, 5 in the approximate (and predicted) index;
//   - r3 has a whole stream and nothing exact, 7 blocks predicted (its approximate entries
//     must not be read).
type world struct {
	ix   *index.Index
	led  *load.Ledger
	reps []route.Replica
	// lds is each replica's counters in the ledger (what a routing there charges).
	lds  []*load.Replica
	toks []uint32
	keys []blockkey.Key
}

const bs = 4

func newWorld(t *testing.T) *world {
	t.Helper()
	now := time.Unix(1000, 0)
	w := &world{ix: index.New(index.Options{Now: func() time.Time { return now }}),
		led: load.New(load.Options{Now: func() time.Time { return now }, Policy: pickFirst{}})}
	// 40 tokens: 10 blocks of 4; at most (40-1)/4 = 9 can hit.
	w.toks = make([]uint32, 40)
	for i := range w.toks {
		w.toks[i] = uint32(100 + i)
	}
	var err error
	w.keys, err = blockkey.AppendPromptKeys(nil, w.toks, bs, blockkey.Identity{})
	if err != nil || len(w.keys) != 10 {
		t.Fatalf("keys: %d, %v", len(w.keys), err)
	}
	hashes := make([]uint64, len(w.keys))
	for i := range hashes {
		hashes[i] = uint64(7000 + i)
	}
	for r := range 4 {
		id, err := w.ix.AddReplica("e", r)
		if err != nil || int(id) != r {
			t.Fatalf("replica %d: id %d, %v", r, id, err)
		}
		w.lds = append(w.lds, w.led.NewReplica(id, "e/"))
		w.reps = append(w.reps, route.Replica{Name: "e/" + string(rune('0'+r)), ID: id, Ready: true, Healthy: true})
	}
	store := func(id index.ReplicaID, lo, hi int, tier index.Tier) {
		if err := w.ix.Store(id, hashes[lo:hi], w.keys[lo:hi], tier); err != nil {
			t.Fatal(err)
		}
	}
	store(0, 0, 6, index.GPU)
	store(0, 6, 9, index.CPU)
	store(0, 9, 10, index.Disk)
	store(2, 0, 2, index.GPU)
	w.led.Routed(load.Routing{Replica: w.lds[0], Uncached: 100, Held: 200})
	w.led.Routed(load.Routing{Replica: w.lds[2], Keys: w.keys[:5], Approximate: true})
	w.led.Routed(load.Routing{Replica: w.lds[3], Keys: w.keys[:7], Approximate: true})
	w.reps[0].Queue, w.reps[0].KVUtil, w.reps[0].WarmupCredit = 3, 0.5, 0.25
	w.reps[1].Ready, w.reps[1].Healthy = false, false
	w.reps[2].Approximate = true
	return w
}

func (w *world) input() route.Input {
	return route.Input{Tokens: w.toks, BlockSize: bs, NowNs: 1, Tried: []bool{false, true, false, false}}
}

func TestDecideOverlapCapsGuardsAndLoad(t *testing.T) {
	w := newWorld(t)
	d, err := route.Decide(w.input(), w.reps, w.ix, w.led)
	if err != nil {
		t.Fatal(err)
	}
	if d.Unkeyed != "" || len(d.Req.Keys) != 10 || d.CapBlocks != 9 || d.Req.Tokens != 40 || d.Req.BlockSize != bs {
		t.Fatalf("request: unkeyed %q keys %d cap %d tokens %d bs %d", d.Unkeyed, len(d.Req.Keys), d.CapBlocks, d.Req.Tokens, d.Req.BlockSize)
	}
	// r0: 10 blocks capped to 9, the excess taken off the slowest tier (disk) first.
	c := d.Cands[0]
	if c.ExactBlocks != 9 || c.TierBlocks != [score.NumTiers]int{6, 3, 0} || d.Raw[0].Tiers != [score.NumTiers]int{6, 3, 1} {
		t.Fatalf("r0 overlap: exact %d tiers %v raw %v", c.ExactBlocks, c.TierBlocks, d.Raw[0].Tiers)
	}
	if !c.Healthy || c.PrefillTokens != 100 || c.DecodeTokens != 0 || c.Running != 1 || c.Queue != 3 || c.KVUtil != 0.5 || c.WarmupCredit != 0.25 {
		t.Fatalf("r0 load terms: %+v", c)
	}
	if d.Cached[0] != 36 || d.Uncached(0) != 4 || d.Mode(0) != route.ModeExact {
		t.Fatalf("r0: cached %d uncached %d mode %s", d.Cached[0], d.Uncached(0), d.Mode(0))
	}
	// r1: every guard, in order, and no overlap.
	if d.Cands[1].Healthy || !reflect.DeepEqual(d.Guards[1], []string{route.GuardNotReady, route.GuardUnhealthy, route.GuardTried}) || d.Cached[1] != 0 {
		t.Fatalf("r1: healthy %v guards %v cached %d", d.Cands[1].Healthy, d.Guards[1], d.Cached[1])
	}
	if d.Guards[0] != nil || d.Guards[2] != nil {
		t.Fatalf("guards on healthy replicas: %v %v", d.Guards[0], d.Guards[2])
	}
	// r2: the approximate index's 5 blocks beat the exact 2 and count as GPU blocks.
	c = d.Cands[2]
	if !c.Approximate || c.ExactBlocks != 5 || c.TierBlocks != [score.NumTiers]int{5, 0, 0} || c.PredictedBlocks != 5 ||
		d.Raw[2] != (route.Overlap{Tiers: [score.NumTiers]int{2, 0, 0}, Approximate: 5, Predicted: 5}) || d.Mode(2) != route.ModeApproximate {
		t.Fatalf("r2: %+v raw %+v mode %s", c, d.Raw[2], d.Mode(2))
	}
	// r3: a whole stream, so its approximate entries are not read; the predicted 7 are.
	c = d.Cands[3]
	if c.ExactBlocks != 0 || c.PredictedBlocks != 7 || d.Raw[3].Approximate != 0 || d.Cached[3] != 28 || d.Uncached(3) != 12 || d.Mode(3) != route.ModePredicted {
		t.Fatalf("r3: %+v raw %+v cached %d mode %s", c, d.Raw[3], d.Cached[3], d.Mode(3))
	}
}

func TestDecideCapsPredictedToo(t *testing.T) {
	w := newWorld(t)
	w.led.Routed(load.Routing{Replica: w.lds[3], Keys: w.keys})
	d, err := route.Decide(w.input(), w.reps, w.ix, w.led)
	if err != nil {
		t.Fatal(err)
	}
	if d.Raw[3].Predicted != 10 || d.Cands[3].PredictedBlocks != 9 || d.Cached[3] != 36 {
		t.Fatalf("r3: raw predicted %d, capped %d, cached %d", d.Raw[3].Predicted, d.Cands[3].PredictedBlocks, d.Cached[3])
	}
}

func TestDecideIsPure(t *testing.T) {
	w := newWorld(t)
	before := w.led.Stats()
	a, err := route.Decide(w.input(), w.reps, w.ix, w.led)
	if err != nil {
		t.Fatal(err)
	}
	b, err := route.Decide(w.input(), w.reps, w.ix, w.led)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two decisions over the same views differ:\n%+v\n%+v", a, b)
	}
	if after := w.led.Stats(); after != before {
		t.Fatalf("the ledger changed: %+v -> %+v", before, after)
	}
	for i := range w.reps {
		if w.lds[i].Load() != loadOf(b, i) {
			t.Fatalf("replica %d load changed", i)
		}
	}
}

// loadOf is candidate i's load terms as the ledger's counters.
func loadOf(d *route.Decision, i int) load.Load {
	c := &d.Cands[i]
	return load.Load{PrefillTokens: int64(c.PrefillTokens), DecodeTokens: int64(c.DecodeTokens),
		PrefillHeldTokens: int64(c.PrefillHeldTokens), PrefillAttention: c.PrefillAttention, Running: int64(c.Running)}
}

func TestDecideUnkeyed(t *testing.T) {
	w := newWorld(t)
	in := w.input()
	in.BlockSize = 0
	d, err := route.Decide(in, w.reps, w.ix, w.led)
	if err != nil {
		t.Fatal(err)
	}
	if d.Unkeyed != route.UnkeyedBlockSize || d.Req.Keys != nil || d.Req.BlockSize != route.CapBlockSize || d.CapBlocks != 39/route.CapBlockSize {
		t.Fatalf("block size unknown: unkeyed %q keys %d bs %d cap %d", d.Unkeyed, len(d.Req.Keys), d.Req.BlockSize, d.CapBlocks)
	}
	for i := range d.Cands {
		if d.Cached[i] != 0 || d.Mode(i) != route.ModeUnkeyed {
			t.Fatalf("candidate %d: cached %d mode %s", i, d.Cached[i], d.Mode(i))
		}
	}
	in = w.input()
	in.Unkeyed = "multimodal"
	if d, err = route.Decide(in, w.reps, w.ix, w.led); err != nil || d.Unkeyed != "multimodal" || d.Req.Keys != nil || d.Cached[0] != 0 {
		t.Fatalf("caller's reason: %v unkeyed %q keys %d cached %d", err, d.Unkeyed, len(d.Req.Keys), d.Cached[0])
	}
	in = w.input()
	in.Tokens = nil
	if d, err = route.Decide(in, w.reps, w.ix, w.led); err != nil || d.CapBlocks != 0 || d.Req.Keys != nil || d.Uncached(0) != 0 {
		t.Fatalf("empty prompt: %v cap %d keys %d", err, d.CapBlocks, len(d.Req.Keys))
	}
}

func TestBreakdownsCarryTheNumbers(t *testing.T) {
	w := newWorld(t)
	d, err := route.Decide(w.input(), w.reps, w.ix, w.led)
	if err != nil {
		t.Fatal(err)
	}
	ex := []score.Explanation{{Cost: 1}, {Cost: 0.5}, {Cost: 2}, {Cost: 3}}
	b := d.Breakdowns(ex)
	want0 := route.Breakdown{Overlap: route.Overlap{Tiers: [score.NumTiers]int{6, 3, 1}}, ExactBlocks: 9, CachedTokens: 36, UncachedTokens: 4,
		WarmupCredit: 0.25, PrefillTokens: 100, PrefillHeldTokens: 200, Running: 1, Queue: 3, KVUtil: 0.5, Policy: &ex[0],
		PrefillAttention: 100 * 99 / 2} // the world's 100 uncached tokens, nothing cached before them
	if !reflect.DeepEqual(b[0], want0) {
		t.Fatalf("r0 breakdown\n got %+v\nwant %+v", b[0], want0)
	}
	if !reflect.DeepEqual(b[1].Guards, []string{route.GuardNotReady, route.GuardUnhealthy, route.GuardTried}) || b[3].PredictedBlocks != 7 || b[3].Policy.Cost != 3 {
		t.Fatalf("r1 guards %v, r3 predicted %d cost %v", b[1].Guards, b[3].PredictedBlocks, b[3].Policy.Cost)
	}
	if nb := d.Breakdowns(nil); nb[0].Policy != nil {
		t.Fatal("a policy without explanations has none in the breakdown")
	}
}

func TestCheapest(t *testing.T) {
	cands := []score.Candidate{{Healthy: true}, {Healthy: false}, {Healthy: true}, {Healthy: true}}
	ex := []score.Explanation{{Cost: 3}, {Cost: 1}, {Cost: 2}, {Cost: 2}}
	if i := route.Cheapest(cands, ex); i != 2 {
		t.Fatalf("cheapest %d, want 2 (the unhealthy one is out; the first of a tie wins)", i)
	}
	ex[2].Excluded = "over_bound"
	if i := route.Cheapest(cands, ex); i != 3 {
		t.Fatalf("cheapest %d, want 3 once 2 is excluded by the policy", i)
	}
	if i := route.Cheapest(cands, nil); i != -1 {
		t.Fatalf("no explanations: %d, want -1", i)
	}
	for i := range ex {
		ex[i].Excluded = "x"
	}
	if i := route.Cheapest(cands, ex); i != -1 {
		t.Fatalf("all excluded: %d, want -1", i)
	}
}

// Two siblings decided from candidates built at the same moment: the second, refreshed under
// the ledger's lock as the router does, sees the first one's predicted blocks and load; without
// the refresh it sees an idle fleet with the prefix nowhere (the TestSiblingsColocate flake:
// eight concurrent siblings scattered over the fleet).
func TestRefreshSeesSiblingRoutedSinceBuilt(t *testing.T) {
	w := newWorld(t)
	reps, lds := w.reps[3:], w.lds[3:] // the replica with a whole stream and nothing exact
	in := route.Input{Tokens: w.toks, BlockSize: bs}
	first, err := route.Decide(in, reps, w.ix, w.led)
	if err != nil {
		t.Fatal(err)
	}
	second, err := route.Decide(in, reps, w.ix, w.led)
	if err != nil {
		t.Fatal(err)
	}
	before := second.Cands[0]
	if _, _, err := w.led.Decide(first, reps, func(i int) load.Routing {
		return load.Routing{Replica: lds[i], Keys: first.Req.Keys, Uncached: first.Uncached(i), Held: first.Req.Tokens}
	}); err != nil {
		t.Fatal(err)
	}
	if second.Cands[0] != before {
		t.Fatalf("candidates changed without a refresh: %+v -> %+v", before, second.Cands[0])
	}
	second.Refresh(reps, w.led)
	got := second.Cands[0]
	if got.PredictedBlocks != second.CapBlocks || got.Running != before.Running+1 ||
		got.PrefillTokens != before.PrefillTokens+first.Uncached(0) {
		t.Fatalf("refreshed candidate %+v; want the sibling's %d predicted blocks (cap), one more running and %d more prefill tokens than %+v",
			got, second.CapBlocks, first.Uncached(0), before)
	}
	if second.Cached[0] != second.CapBlocks*bs || second.Raw[0].Predicted != 10 {
		t.Fatalf("refreshed cached %d raw %+v; want %d cached and 10 raw predicted", second.Cached[0], second.Raw[0], second.CapBlocks*bs)
	}
}

// A burst of eight siblings under `load` whose candidates were all built at the same moment
// (eight requests reaching the router together, as the siblings regime sends them), decided one
// after another under the ledger's lock as the router does: each decision counts the ones
// before it (their prefill reserved in the ledger at routing, not the engines' scraped queue),
// so an idle fleet of four takes two each. Had the load signal stood still inside the burst
// (the engines' /metrics, refreshed every few seconds), the eight would tie on every replica.
func TestLoadSpreadsABurstOfSiblings(t *testing.T) {
	now := time.Unix(1000, 0)
	pol, err := score.New("load", score.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	ix := index.New(index.Options{Now: func() time.Time { return now }})
	led := load.New(load.Options{Now: func() time.Time { return now }, Policy: pol})
	var reps []route.Replica
	var lds []*load.Replica
	for r := range 4 {
		id, err := ix.AddReplica("e", r)
		if err != nil {
			t.Fatal(err)
		}
		lds = append(lds, led.NewReplica(id, "e/"))
		reps = append(reps, route.Replica{Name: "e/" + string(rune('0'+r)), ID: id, Ready: true, Healthy: true})
	}
	prompt := func(k int) []uint32 { // a 40-token shared prefix and an 8-token suffix of its own
		toks := make([]uint32, 48)
		for i := range toks {
			toks[i] = uint32(100 + i)
			if i >= 40 {
				toks[i] = uint32(10_000*(k+1) + i)
			}
		}
		return toks
	}
	var ds []*route.Decision
	for k := range 8 {
		d, err := route.Decide(route.Input{Tokens: prompt(k), BlockSize: bs}, reps, ix, led)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	per := make([]int, len(reps))
	for _, d := range ds {
		_, rc, err := led.Decide(d, reps, func(i int) load.Routing {
			return load.Routing{Replica: lds[i], Keys: d.Req.Keys, Uncached: d.Uncached(i), Held: d.Req.Tokens}
		})
		if err != nil {
			t.Fatal(err)
		}
		per[rc.Chosen]++
	}
	if !reflect.DeepEqual(per, []int{2, 2, 2, 2}) {
		t.Fatalf("load put the burst %v over four idle replicas, want two each", per)
	}
}
