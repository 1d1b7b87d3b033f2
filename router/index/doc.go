// Package index is the router's live view of which prefix blocks sit in which replica's KV
// cache. It holds three things, kept apart on purpose:
//
//   - Index, the exact index, fed only by engine events (BlockStored, BlockRemoved,
//     AllBlocksCleared) through Store, StoreNew, Remove and Clear;
//   - a predicted side index (NewPredicted, TTL of a few seconds) that records the router's own
//     decisions so sibling requests sent before the engine's first BlockStored co-locate;
//   - an approximate index (NewApproximate, TTL of minutes) learned from decisions, used for
//     replicas whose event stream is missing or unhealthy.
//
// The two side indexes are the same SideIndex type with different TTLs and caps; router
// decisions never enter the exact index, so a wrong guess can never look like engine truth.
//
// # Replicas
//
// A replica is one event stream: (engine, DP rank). The caller registers it with AddReplica and
// gets a small dense ReplicaID (reused after RemoveReplica). Match results are slices indexed by
// ReplicaID.
//
// # Keys
//
// The index is keyed by router keys (blockkey.Key). Per replica and tier it keeps the engine
// hash (uint64: the wire int, or the last 8 bytes big-endian of a raw digest) -> router key, because
// BlockRemoved carries engine hashes only; ParentKey lets the ingester chain a BlockStored whose
// parent is an earlier block.
//
// # Tiers
//
// A block is held on a replica per tier (GPU, CPU, Disk), independently: offloading can keep a
// block on GPU and CPU at once, and a BlockRemoved names the medium it leaves. ParseMedium maps
// the event's medium: nil/"" (engines before medium existed had only the GPU pool) and "GPU" to
// GPU, "CPU" to CPU, "STORAGE"/"DISK" to Disk. An unknown medium maps to Disk, the slowest tier,
// and reports known=false: a new connector tier is certainly not GPU memory, and counting it as
// GPU would overstate the hit and mis-route; the caller can also choose to skip such events.
//
// # Presence, not counts, and duplicate physical blocks
//
// vLLM does not de-duplicate physical blocks: two requests computing the same block at the same
// time each cache a copy, each copy gets its own BlockStored, and each eviction its own
// BlockRemoved. Under kv_cache_report_mode "full", prefix hits are re-announced as BlockStored
// with parent nil, from token 0, and such an event changes nothing in the engine. On the wire a
// re-announcement looks exactly like the BlockStored of a fresh request that found no hit (both
// have parent nil), but it never has a parent: a BlockStored with a parent comes from
// cache_full_blocks continuing a request past its cached prefix, so each of its blocks is a new
// physical block.
//
// The rule: per (replica, tier, engine hash) the index keeps a copy count that is a lower bound
// of the physical copies.
//
//   - Store (use it for parent == nil): the block is present; if it was already present nothing
//     is counted and nothing changes. A re-announcement can therefore never keep an
//     evicted block alive.
//   - StoreNew (use it for parent != nil, or for every event of a stream known never to carry
//     full-mode requests): each already-present hash counts one more physical copy.
//   - Remove takes one copy away; the block leaves the index when the count reaches zero.
//
// Since the count never exceeds the real number of copies, a block whose last copy was evicted
// always leaves the index. The one case it cannot see is a duplicate created by a parent-nil
// fresh request racing another: that block leaves after the first BlockRemoved although one copy
// remains (a missed hit, never a phantom one), and the next full-mode re-announcement of it puts
// it back.
//
// # Layout and memory
//
// Replicas are packed 63 to a group. Per group one map router key -> uint64 holds the replicas
// having the key on any tier (bit 63 flags a key that some replica holds off GPU; its per-tier
// masks then live in a second, normally small, map). Per replica and tier one map
// engine hash -> router key, plus a map of extra copies that is empty unless duplicates occur.
// That is two 16-byte map slots per (block, replica) when no other replica holds the block, and
// one when all do. A Go map slot costs 17 bytes over a load factor between 7/16 and 7/8, so an
// entry costs about 20-39 bytes when every replica holds the block and 39-78 when only one does,
// depending on where the map sits between two doublings; BenchmarkMemory measures it (the
// built-in map is kept over a hand-written table: growth variance, not slot size, is what a
// custom table could win). Match is one map lookup and a few word operations per block, for up
// to 63 replicas at once, and stops at the first block no replica holds.
//
// # Concurrency
//
// One sync.RWMutex guards an Index. Writers (one ingestion goroutine per stream) hold it for one
// event's batch of blocks, a few microseconds; readers (routing decisions) hold the read lock for
// one Match. Sharding by key would make a Match take a lock per block or every shard's lock, and
// sharding by replica would make a Match visit one map per replica instead of one per group of
// 63, so one lock is both the simplest and the fastest choice at this size.
//
// # Recency
//
// Per replica the index keeps a logical clock (Gen: blocks stored or refreshed so far) and the
// time of the last applied event (ReplicaStats). Per-block recency is deliberately not stored in
// the exact index: a scorer could only read it through a lookup by (replica, key) that Match does
// not do, and it would cost 8 bytes per entry. Decision recency per (key, replica) is what the
// side indexes hold.
package index
