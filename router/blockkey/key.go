// Package blockkey computes the two block identities kvroute works with: the router's own
// chained 64-bit keys over token ids (what the index is keyed by), and vLLM's exact engine block
// hash (for tools, the simulator and the parity check).
package blockkey

// Key is the router's chained 64-bit key of one full block: it depends on every token of the
// block and of all blocks before it, and on the identity that changes KV content (LoRA adapter,
// cache salt, multimodal inputs). Equal keys mean equal KV.
type Key uint64

// MaxBlockSize is the largest KV block size, in tokens, that kvroute accepts from anywhere: its
// configuration, a pod annotation, or a BlockStored event. vLLM's own choices are 1..256 for
// attention (--block-size) and a few hundred to about two thousand when it raises the attention
// block size of a hybrid (Mamba) model to match its state page; 4096 leaves room above that. The
// bound matters because block_size arrives on the wire: it is multiplied by a block count and
// used to slice token ids, and a forged 2^62 wraps that product to 0.
const MaxBlockSize = 4096

// ValidBlockSize reports whether n is a block size kvroute can key with.
func ValidBlockSize(n int64) bool { return n >= 1 && n <= MaxBlockSize }
