// Package blockkey computes the two block identities kvroute works with: the router's own
// chained 64-bit keys over token ids (what the index is keyed by), and vLLM's exact engine block
// hash (for tools, the simulator and the parity check).
package blockkey

// Key is the router's chained 64-bit key of one full block: it depends on every token of the
// block and of all blocks before it, and on the identity that changes KV content (LoRA adapter,
// cache salt, multimodal inputs). Equal keys mean equal KV.
type Key uint64
