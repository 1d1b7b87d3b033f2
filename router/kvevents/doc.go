// Package kvevents feeds the exact index from vLLM's KV-cache event streams: one ZMQ SUB per
// (engine, DP rank), sequence tracking, gap -> replay over a DEALER, reset detection, and the
// ingester that re-keys BlockStored events and applies them to router/index.
//
// # Goroutines and sockets
//
// A Subscriber polls every SUB socket from one goroutine (zmq.Poller; libzmq sockets are not
// thread-safe, so a socket is only touched by the goroutine that polls it). Streams are added and
// removed through a command channel, and an inproc PAIR wakes the poller so it never sleeps on a
// timeout to notice them. The poller only parses the frames (topic, seq), checks the topic and
// hands the message to the stream's bounded queue; a worker goroutine per stream decodes, keeps the
// sequence and applies to the index, so a slow stream never delays the others' receive path.
//
// A replay runs on a goroutine of its own, on a DEALER that lives only for the exchange, and
// hands what arrives to the worker in chunks; meanwhile the worker keeps taking live messages and
// holds them, in order, to apply after the replay (Replaying). vLLM answers a replay request with
// its whole ring from the asked seq in one burst through a ROUTER at libzmq's default send HWM of
// 1,000 (vllm/distributed/kv_events.py), and a ROUTER drops what does not fit: the DEALER's
// receive HWM is sized to the ring (Options.Ring), and a burst that comes back with a hole is
// asked for again from the first missing seq, until the ring is read or an exchange brings
// nothing new.
//
// libzmq reconnects a SUB by itself (ReconnectIvl, doubling up to ReconnectIvlMax) after a
// network error, but not after a protocol error; a monitor on each SUB sees the disconnection and
// a new SUB replaces it, followed by a replay from the last applied seq.
//
// # Bounds
//
//   - Message size: ZMQ_MAXMSGSIZE (Options.MaxMsgSize, 16 MiB) on the SUB and the replay DEALER.
//     libzmq closes a connection that brings a bigger frame, without a word to the reader: the SUB
//     is reopened (above) and the gap replayed; the replay DEALER's connection drops at the same
//     batch while the engine still accepts connections, so that batch is counted (TooLarge) and
//     skipped like one that does not decode, and the replay goes on after it.
//   - Queue: each stream's live messages accepted and not yet applied, queued or held during a
//     replay, are bounded in messages (QueueLen) and bytes (QueueBytes, 64 MiB); past either a
//     message is dropped as an overflow, a gap repaired by replay.
//   - Index: each replica holds at most MaxBlocks distinct GPU blocks (StreamConfig.MaxBlocks:
//     the engine's num_gpu_blocks with slack, MaxBlocksFor; else Options.MaxBlocks) and
//     MaxOffloadBlocks per offload tier. An engine cannot hold more; past it the replica is
//     cleared and the stream inexact (OverCap), instead of growing with the publisher.
//
// # Engine lifecycle
//
//   - Restarted (discovery saw a new incarnation): the replica is cleared and the new process's
//     ring replayed from seq 0.
//   - Down (the health probe fails): the stream stops counting as exact at once; its blocks stay.
//     A live seq that jumps ahead while the engine was unreachable is a new process that published
//     past the old one's last seq: the replica is cleared and the new ring replayed from seq 0.
//   - Up (the probe passes again): the ring is asked for the last applied batch; the same bytes
//     (a hash of the payload) mean the same process, and what it published meanwhile is replayed;
//     other bytes or none mean a new process, handled as above (SilentRestarts). Without a replay
//     socket nothing can tell the two apart, and the replica is cleared.
//   - Stale (the engine serves requests that should have produced events, and none came): not
//     exact until the next batch is applied in order; the blocks stay, so a publisher that
//     resumes brings the index back without a repair.
//   - AllBlocksCleared (a prefix-cache reset, sleep mode) clears the replica and heals the stream.
//
// # Sequence states (StreamState)
//
//   - Exact: every batch since the engine's seq 0, or since the last AllBlocksCleared, was
//     applied in order. The index equals the engine's cache (up to the duplicate rule of package
//     index).
//   - Replaying: a gap was seen (a seq jump, or a message dropped because the stream's queue was
//     full: an overflow is a gap, never a silent drop) and the batches from the last applied seq
//     on are being fetched from the engine's replay socket; live messages are held meanwhile.
//   - Approximate: the stream has no known beginning: the router joined after the engine's ring
//     had dropped its first batches (Partial is set), or there is no replay socket and the first
//     message was not seq 0. Every event seen is applied, so the index holds a subset of the
//     engine's blocks: missed hits, never phantom ones.
//   - Inexact: continuity was lost mid-stream: a gap older than the engine's ring, a failed
//     replay, a sequence going backwards, Restarted, or the replica past its block limit. A missed BlockRemoved could leave a
//     phantom block, so the replica's entries are cleared at that moment; events from then on
//     are applied (again a subset of the truth).
//
// Healing rule: an Approximate or Inexact stream becomes Exact when (a) it applies an
// AllBlocksCleared in order (the engine's cache was empty then, so from there the index mirrors
// it), or (b) it sees a fresh stream: the engine's seq 0, live or from a replay that reaches back
// to seq 0. A sequence going backwards is an engine restart: the replica is cleared and the
// batches of the new process are replayed from seq 0, so a restart whose new ring still holds
// seq 0 heals at once. Full-mode re-announcements put blocks back but cannot prove completeness,
// so they do not heal a stream by themselves.
//
// On router start every stream replays its ring from seq 0: an empty ring or one starting at 0
// gives Exact, one starting later gives Approximate with Partial set. While the engine is seen
// down or stale the stream shows Inexact whatever its sequence says.
//
// # Ingestion rules
//
//   - Only full-attention KV groups are indexed (kv_cache_spec_kind "full_attention",
//     "mla_attention", "sink_full_attention", or no kind at all from engines before v0.22); the
//     group of each group_idx is learned from BlockStored so BlockRemoved (which carries no kind)
//     of a sliding-window or Mamba group is skipped too.
//   - Tiers and residency come from medium and locality (index.ParseResidency). vLLM counts
//     copies per (medium, group, locality, ownership, hash); a copy the engine does not hold
//     itself (locality REMOTE, or the shared media FS, OBJ, STORAGE) is kept per residency key
//     in the ingester, counted and shown (shared_*), never routed on. An unknown medium or
//     locality is skipped and counted: a new connector tier may use another hash space.
//   - A BlockStored with parent nil chains from blockkey.RootKey and goes to index.Store (presence:
//     a full-mode re-announcement only refreshes), or with IngestOptions.CopyPerStore (no full
//     report mode) to index.StoreCopies, one more physical copy as vLLM's contract test has it;
//     one with a parent chains from
//     index.ParentKey(replica, parent) and goes to index.StoreNew (new physical copies). A parent
//     the replica does not hold (a partial stream, or a parent on a skipped group) cannot be
//     re-keyed: the event is skipped and counted (UnknownParent), since a guessed chain would give
//     keys no request can ever produce.
//   - AllBlocksCleared comes from the GPU block pool: it clears the GPU tier only; offloaded and
//     shared copies stay (docs/features/kv_events.md).
//   - Parity: for a sample of BlockStored events with parent nil on the GPU tier, the first
//     block's vLLM hash is recomputed (algorithm, PYTHONHASHSEED, the event's extra keys) and its
//     wire int compared with the event's; mismatches are counted per stream. A block size other
//     than the configured one is counted apart (BlockSizeMismatches).
package kvevents
