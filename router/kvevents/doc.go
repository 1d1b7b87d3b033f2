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
// Replays run on the stream's worker, on a DEALER that lives only for the replay.
// libzmq reconnects a SUB by itself (ReconnectIvl, doubling up to ReconnectIvlMax).
//
// # Sequence states (StreamState)
//
//   - Exact: every batch since the engine's seq 0, or since the last AllBlocksCleared, was
//     applied in order. The index equals the engine's cache (up to the duplicate rule of package
//     index).
//   - Replaying: a gap was seen (a seq jump, or a message dropped because the stream's queue was
//     full: an overflow is a gap, never a silent drop) and the batches from the last applied seq
//     on are being fetched from the engine's replay socket; live messages wait in the queue.
//   - Approximate: the stream has no known beginning: the router joined after the engine's ring
//     had dropped its first batches (Partial is set), or there is no replay socket and the first
//     message was not seq 0. Every event seen is applied, so the index holds a subset of the
//     engine's blocks: missed hits, never phantom ones.
//   - Inexact: continuity was lost mid-stream: a gap older than the engine's ring, a failed
//     replay, a sequence going backwards, or Restarted. A missed BlockRemoved could leave a
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
// gives Exact, one starting later gives Approximate with Partial set.
//
// # Ingestion rules
//
//   - Only full-attention KV groups are indexed (kv_cache_spec_kind "full_attention",
//     "mla_attention", "sink_full_attention", or no kind at all from engines before v0.22); the
//     group of each group_idx is learned from BlockStored so BlockRemoved (which carries no kind)
//     of a sliding-window or Mamba group is skipped too.
//   - Tiers come from medium (index.ParseMedium). An unknown medium is skipped and counted: a new
//     connector tier may use another hash space.
//   - A BlockStored with parent nil chains from blockkey.RootKey and goes to index.Store (presence:
//     a full-mode re-announcement only refreshes); one with a parent chains from
//     index.ParentKey(replica, parent) and goes to index.StoreNew (new physical copies). A parent
//     the replica does not hold (a partial stream, or a parent on a skipped group) cannot be
//     re-keyed: the event is skipped and counted (UnknownParent), since a guessed chain would give
//     keys no request can ever produce.
//   - Parity: for a sample of BlockStored events with parent nil on the GPU tier, the first
//     block's vLLM hash is recomputed (algorithm, PYTHONHASHSEED, the event's extra keys) and its
//     wire int compared with the event's; mismatches are counted per stream. A block size other
//     than the configured one is counted apart (BlockSizeMismatches).
package kvevents
