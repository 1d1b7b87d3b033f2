// Package replay is the live replay harness behind `kvbench replay`: it turns a Mooncake trace (or a
// generated regime) into token-id prompts, starts vllm-sim engines and one kvrouter per policy as
// real processes on loopback, replays the requests at a chosen speed with streaming, and summarises
// TTFT, latency, throughput and cached tokens over seeds with 95% intervals.
package replay

import "github.com/kvroute/kvroute/sim/fleet"

// Token ids are drawn from [tokenLo, tokenHi): below vllm-sim's 151,936-id vocabulary and clear
// of its special ids (151643..), so a prompt never contains an end-of-text or chat marker.
const (
	tokenLo = 1000
	tokenHi = 150000
)

// DefaultTokensPerTraceBlock scales each 512-token trace block down to 32 tokens: prefill on
// two shared cores stays affordable while equal blocks still give equal KV blocks.
const DefaultTokensPerTraceBlock = 32

// Tokenizer maps trace hash ids to deterministic token ids: equal ids give equal tokens, so
// equal trace blocks give equal engine KV blocks.
type Tokenizer struct {
	// PerBlock is the number of tokens each trace block becomes (fleet.TraceBlockTokens for the
	// trace's own size; smaller to make prefill cheaper).
	PerBlock int
}

// BlockTokens appends the PerBlock token ids of one trace block to dst.
func (t Tokenizer) BlockTokens(dst []uint32, id uint64) []uint32 {
	for i := 0; i < t.PerBlock; i++ {
		dst = append(dst, tokenAt(id, i))
	}
	return dst
}

// Prompt returns the token ids of a request: its blocks in order, cut to the input length scaled
// by PerBlock/512 (the last trace block may be partial), at least one token.
func (t Tokenizer) Prompt(r *Request) []uint32 {
	n := t.PromptLen(r)
	out := make([]uint32, 0, n+t.PerBlock)
	for _, id := range r.HashIDs {
		if len(out) >= n {
			break
		}
		out = t.BlockTokens(out, id)
	}
	return out[:min(n, len(out))]
}

// PromptLen is the scaled prompt length of a request.
func (t Tokenizer) PromptLen(r *Request) int {
	n := (r.InputLength*t.PerBlock + fleet.TraceBlockTokens/2) / fleet.TraceBlockTokens
	n = min(max(n, 1), len(r.HashIDs)*t.PerBlock)
	return n
}

// tokenAt is splitmix64 over (id, position): a fixed, well-mixed function, hand-written because
// it is four lines and must never change between versions (it defines the replayed prompts).
func tokenAt(id uint64, pos int) uint32 {
	z := id*0x9E3779B97F4A7C15 + uint64(pos)*0xBF58476D1CE4E5B9 + 0x94D049BB133111EB
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return tokenLo + uint32(z%(tokenHi-tokenLo))
}
