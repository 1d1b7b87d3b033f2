package policies

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/router/score"
)

// prefixChar (`prefix-char`) follows vLLM production-stack's `prefixaware` router: the prompt
// text is cut into 128-character chunks, each hashed (xxhash64 there) along a trie path, each trie
// node keeps the endpoints that were sent that prefix. The longest match wins, ties are broken
// with random.choice, the chosen endpoint is inserted. There is no load term and no eviction
// ("we assume that there is no eviction of prefix cache"). The router sees tokens, not text: a
// token counts as CharsPerToken characters and the chunks are derived from the block keys.
type prefixChar struct {
	rng *rand.Rand
	idx *approxIndex
}

// Production-stack prefixaware constants.
const (
	prefixChunkChars = 128
	// CharsPerToken is how many characters character-based peers take a token to be.
	CharsPerToken = 4
)

func newPrefixChar(o score.Options) *prefixChar {
	return &prefixChar{rng: score.NewRNG(o.Seed), idx: newApproxIndex(0)}
}

func (p *prefixChar) Name() string { return "prefix-char" }

// chunkKeys returns the chained chunk keys of the prompt and how many chunks each stands for.
// The block keys are chained (a key depends on every block before it), as a trie path is.
func chunkKeys(r *score.Request) ([]uint64, int) {
	// All chunks inside one block share the block's membership (whole prompts are inserted), so
	// a block key stands for its chunks.
	per := max(r.BlockSize*CharsPerToken/prefixChunkChars, 1)
	return keysOf(r.Keys), per
}

func (p *prefixChar) Pick(req *score.Request, cands []score.Candidate) (int, error) {
	keys, _ := chunkKeys(req)
	i := score.PickMin(cands, func(i int) float64 { return -float64(p.idx.match(cands[i].ID, keys)) }, p.rng)
	if i < 0 {
		return -1, score.ErrNoCandidate
	}
	return i, nil
}

func (p *prefixChar) OnRouted(req *score.Request, cands []score.Candidate, i int) {
	keys, _ := chunkKeys(req)
	p.idx.insert(cands[i].ID, keys)
}

// Forget drops a replica's learned keys (it left the fleet).
func (p *prefixChar) Forget(id string) { p.idx.forget(id) }
