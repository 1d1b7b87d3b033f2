package kvevents

// Counter is one of a stream's counters, named for exporters: Metric is its Prometheus name
// after the router's namespace, Key its name in /debug/engines.
type Counter struct {
	Field  string // the Stats field
	Metric string
	Key    string
	Help   string
	Value  uint64
	// Gauge: a level that goes up and down (bytes held, messages pending), not a count.
	Gauge bool
	// Drop: something was dropped or skipped and nothing logs it where it happens; the router
	// logs its first increase on each stream (FirstDrops).
	Drop bool
}

// counterSpec is one row of the table every exporter reads. TestEveryStatsCounterIsExported
// fails for a uint64 field of Stats that has no row, so a new counter cannot be left unexported.
type counterSpec struct {
	field, metric, key, help string
	get                      func(*Stats) uint64
}

// gaugeFields are the rows that are levels, not counts.
var gaugeFields = map[string]bool{"QueuedBytes": true, "Pending": true, "QuietRequests": true, "SharedBlocks": true, "SharedCopies": true}

// How each counter's movement is told beyond /metrics and /debug/engines: every row is in
// exactly one of these sets (TestEveryCounterIsToldOnce), so a new counter must choose.
var (
	// trafficFields are normal flow (messages, batches, blocks, sampled checks, the repair of a
	// gap and replay overlap): counted only.
	trafficFields = map[string]bool{"Received": true, "Applied": true, "QueuedBytes": true, "Pending": true, "Replays": true,
		"ReplayedBatches": true, "Duplicates": true, "Events": true, "BlocksStored": true, "BlocksReannounced": true, "BlocksRemoved": true, "Clears": true,
		"ParityChecked": true, "Heartbeats": true,
		"CopiesStored": true, "SharedStored": true, "SharedRemoved": true, "SharedBlocks": true, "SharedCopies": true, "SessionStores": true,
		"TokenlessResolved": true}
	// stateFields move with a stream state change (a gap, a restart, a reset, the engine down),
	// which the router logs once with the counters that moved.
	stateFields = map[string]bool{"Gaps": true, "Uncoverable": true, "Backwards": true, "Downs": true, "SilentRestarts": true,
		"Restarts": true, "Resets": true, "SubReconnects": true, "PublisherRestarts": true, "Stalls": true,
		"Snapshots": true, "SnapshotsInstalled": true}
	// siteLoggedFields are logged where they happen, with the batch's seq and payload head
	// (logDrop, logPanic), the requests that showed it (the router's stale mark), or the reason a
	// peer's snapshot was not used (seedRejected).
	siteLoggedFields = map[string]bool{"DecodeErrors": true, "TooLarge": true, "OverCap": true, "Panics": true, "StaleMarks": true, "QuietRequests": true,
		"SeedRejected": true, "SnapshotFailures": true}
	// dropFields are dropped or skipped messages, batches and events that nothing logs where
	// they happen: the router logs the first increase of each on a stream (FirstDrops).
	dropFields = map[string]bool{"TopicMismatches": true, "MalformedFrames": true, "Overflows": true, "ByteOverflows": true,
		"ReplayFailures": true, "ReplayShort": true, "UnknownEvents": true, "UnknownParent": true, "RekeyErrors": true,
		"SkippedGroups": true, "SkippedMedia": true, "UnknownRemoves": true, "IndexErrors": true, "BlockSizeMismatches": true,
		"ParityMismatches": true, "ParitySkipped": true, "SharedDropped": true, "TokenlessUnresolved": true}
)

// counterTable lists every counter of Stats. Metric names that dashboards and alerts already
// use are kept as they were (stream_gaps_total, parity_mismatches_total, ...); the rest are
// stream_<key>_total.
var counterTable = []counterSpec{
	{"Received", "stream_received_total", "received", "Messages taken off the SUB socket for the stream.", func(s *Stats) uint64 { return s.Received }},
	{"Applied", "stream_applied_total", "applied", "Batches applied in order (live and replayed).", func(s *Stats) uint64 { return s.Applied }},
	{"TopicMismatches", "stream_topic_mismatches_total", "topic_mismatches", "Messages whose topic was not the engine's (dropped).", func(s *Stats) uint64 { return s.TopicMismatches }},
	{"MalformedFrames", "stream_malformed_frames_total", "malformed_frames", "Messages that were not [topic, seq, payload] (dropped).", func(s *Stats) uint64 { return s.MalformedFrames }},
	{"DecodeErrors", "stream_decode_errors_total", "decode_errors", "Event batches that did not decode or failed the wire checks (skipped).", func(s *Stats) uint64 { return s.DecodeErrors }},
	{"Panics", "stream_panics_total", "panics", "Event batches whose decoding or applying panicked (recovered, skipped).", func(s *Stats) uint64 { return s.Panics }},
	{"Overflows", "stream_overflows_total", "overflows", "Messages dropped on the router's queue (healed by replay).", func(s *Stats) uint64 { return s.Overflows }},
	{"ByteOverflows", "stream_byte_overflows_total", "byte_overflows", "Of the overflows, messages dropped because the queue held its byte budget.", func(s *Stats) uint64 { return s.ByteOverflows }},
	{"QueuedBytes", "stream_queued_bytes", "queued_bytes", "Bytes of live messages accepted and not yet applied (queue and held during a replay).", func(s *Stats) uint64 { return uint64(max(s.QueuedBytes, 0)) }},
	{"Pending", "stream_pending_messages", "pending", "Live messages held while a replay runs.", func(s *Stats) uint64 { return uint64(max(s.Pending, 0)) }},
	{"TooLarge", "stream_too_large_total", "too_large", "Event batches over the message size limit (skipped).", func(s *Stats) uint64 { return s.TooLarge }},
	{"SubReconnects", "stream_sub_reconnects_total", "sub_reconnects", "Times the SUB socket lost its connection (e.g. on an oversize frame) and was opened again.", func(s *Stats) uint64 { return s.SubReconnects }},
	{"Gaps", "stream_gaps_total", "gaps", "Sequence gaps (and queue overflows) seen.", func(s *Stats) uint64 { return s.Gaps }},
	{"Replays", "stream_replays_total", "replays", "Replays requested.", func(s *Stats) uint64 { return s.Replays }},
	{"ReplayFailures", "stream_replay_failures_total", "replay_failures", "Replays that failed (no replay socket, timeout, bad reply).", func(s *Stats) uint64 { return s.ReplayFailures }},
	{"ReplayedBatches", "stream_replayed_batches_total", "replayed_batches", "Batches applied from replays.", func(s *Stats) uint64 { return s.ReplayedBatches }},
	{"Uncoverable", "stream_uncoverable_gaps_total", "uncoverable", "Gaps the engine's replay ring no longer covered.", func(s *Stats) uint64 { return s.Uncoverable }},
	{"Duplicates", "stream_duplicates_total", "duplicates", "Batches seen again (replay overlap) and skipped.", func(s *Stats) uint64 { return s.Duplicates }},
	{"Backwards", "stream_backwards_total", "backwards", "Sequence decreases (engine restarts seen on the wire).", func(s *Stats) uint64 { return s.Backwards }},
	{"ReplayShort", "stream_replay_short_total", "replay_short", "Replay bursts that came back with a hole (the engine's ROUTER dropped at its HWM) and were asked for again.", func(s *Stats) uint64 { return s.ReplayShort }},
	{"Downs", "stream_downs_total", "downs", "Times the engine's health probe was seen failing (stream taken out of exact).", func(s *Stats) uint64 { return s.Downs }},
	{"SilentRestarts", "stream_silent_restarts_total", "silent_restarts", "Engine restarts found by a seq jump after an outage or the identity check on return.", func(s *Stats) uint64 { return s.SilentRestarts }},
	{"OverCap", "stream_over_limit_total", "over_limit", "Times the replica went past its block limit (cleared, stream inexact).", func(s *Stats) uint64 { return s.OverCap }},
	{"QuietRequests", "stream_quiet_requests", "quiet_requests", "Block-storing answers in a row the engine gave with no batch applied for 2s (3 mark the stream stale; 0 again once an answer finds events flowing).", func(s *Stats) uint64 { return s.QuietRequests }},
	{"StaleMarks", "stream_stale_marks_total", "stale_marks", "Times the engine served requests with no events coming (stream taken out of exact).", func(s *Stats) uint64 { return s.StaleMarks }},
	{"SeedRejected", "stream_seed_rejected_total", "seed_rejected", "Peer snapshots not used for the stream (another engine process, the ring wrapped past them, no replay socket, over the block limit); its ring was replayed from seq 0.", func(s *Stats) uint64 { return s.SeedRejected }},
	{"Restarts", "stream_restarts_total", "restarts", "Engine restarts reported by discovery.", func(s *Stats) uint64 { return s.Restarts }},
	{"PublisherRestarts", "stream_publisher_restarts_total", "publisher_restarts", "Engine restarts seen as a changed publisher id in the 24-byte sequence frame (each resets the replica).", func(s *Stats) uint64 { return s.PublisherRestarts }},
	{"Stalls", "stream_stalls_total", "stalls", "Times an engine that sends heartbeats went silent past the stall limit (stream taken out of exact until a batch comes).", func(s *Stats) uint64 { return s.Stalls }},
	{"Heartbeats", "stream_heartbeats_total", "heartbeats", "Batches with no events applied (idle engines with a snapshot endpoint send one a second).", func(s *Stats) uint64 { return s.Heartbeats }},
	{"Snapshots", "stream_snapshots_total", "snapshots", "Snapshots asked of the engine (its snapshot endpoint): at start, or for a gap its ring no longer covered.", func(s *Stats) uint64 { return s.Snapshots }},
	{"SnapshotsInstalled", "stream_snapshots_installed_total", "snapshots_installed", "Engine snapshots installed (the replica rebuilt from the engine's whole cache state).", func(s *Stats) uint64 { return s.SnapshotsInstalled }},
	{"SnapshotFailures", "stream_snapshot_failures_total", "snapshot_failures", "Engine snapshots not installed (timeout, unavailable, malformed, over the block limit); the stream fell back to its ring.", func(s *Stats) uint64 { return s.SnapshotFailures }},
	{"Resets", "stream_resets_total", "resets", "Times the replica's entries were dropped (stream inexact).", func(s *Stats) uint64 { return s.Resets }},
	{"Events", "stream_events_total", "events", "Events applied.", func(s *Stats) uint64 { return s.Events }},
	{"BlocksStored", "stream_blocks_stored_total", "blocks_stored", "Blocks indexed from BlockStored events.", func(s *Stats) uint64 { return s.BlocksStored }},
	{"BlocksReannounced", "stream_blocks_reannounced_total", "blocks_reannounced", "Of the blocks stored, those the replica already held (kv_cache_report_mode full: re-announced prefix hits; none under full mode means the engines ignore it).", func(s *Stats) uint64 { return s.BlocksReannounced }},
	{"BlocksRemoved", "stream_blocks_removed_total", "blocks_removed", "Blocks removed by BlockRemoved events.", func(s *Stats) uint64 { return s.BlocksRemoved }},
	{"Clears", "stream_clears_total", "clears", "AllBlocksCleared events applied.", func(s *Stats) uint64 { return s.Clears }},
	{"UnknownEvents", "stream_unknown_events_total", "unknown_events", "Events of a type this version does not know (skipped).", func(s *Stats) uint64 { return s.UnknownEvents }},
	{"UnknownParent", "stream_unknown_parents_total", "unknown_parents", "BlockStored events whose parent the replica does not hold (skipped).", func(s *Stats) uint64 { return s.UnknownParent }},
	{"RekeyErrors", "stream_rekey_errors_total", "rekey_errors", "BlockStored events whose sizes or extras cannot be keyed (skipped).", func(s *Stats) uint64 { return s.RekeyErrors }},
	{"SkippedGroups", "stream_skipped_groups_total", "skipped_groups", "Events of non-attention KV cache groups (sliding window, Mamba; skipped).", func(s *Stats) uint64 { return s.SkippedGroups }},
	{"SkippedMedia", "stream_skipped_media_total", "skipped_media", "Events with a medium or locality this version does not know (skipped: failing closed).", func(s *Stats) uint64 { return s.SkippedMedia }},
	{"CopiesStored", "stream_copies_stored_total", "copies_stored", "Of the blocks stored, those already held that counted one more physical copy (each copy is removed on its own).", func(s *Stats) uint64 { return s.CopiesStored }},
	{"SharedStored", "stream_shared_stored_total", "shared_stored", "Block copies stored in storage the engine reaches but does not hold (locality REMOTE; media FS, OBJ, STORAGE): shown, not routed on.", func(s *Stats) uint64 { return s.SharedStored }},
	{"SharedRemoved", "stream_shared_removed_total", "shared_removed", "Shared-storage block copies removed.", func(s *Stats) uint64 { return s.SharedRemoved }},
	{"SharedDropped", "stream_shared_dropped_total", "shared_dropped", "Shared-storage block copies not kept: the stream's bound on shared residency keys was reached.", func(s *Stats) uint64 { return s.SharedDropped }},
	{"SharedBlocks", "stream_shared_blocks", "shared_blocks", "Residency keys (medium, group, locality, ownership, hash) with a copy in shared storage.", func(s *Stats) uint64 { return s.SharedBlocks }},
	{"SharedCopies", "stream_shared_copies", "shared_copies", "Block copies in shared storage.", func(s *Stats) uint64 { return s.SharedCopies }},
	{"TokenlessResolved", "stream_tokenless_resolved_total", "tokenless_resolved", "Blocks of token-less stores (an engine snapshot's tier updates) resolved through the engine hash the replica held.", func(s *Stats) uint64 { return s.TokenlessResolved }},
	{"TokenlessUnresolved", "stream_tokenless_unresolved_total", "tokenless_unresolved", "Blocks of token-less stores whose engine hash the replica did not hold (skipped: no tokens to key them by).", func(s *Stats) uint64 { return s.TokenlessUnresolved }},
	{"SessionStores", "stream_session_stores_total", "session_stores", "BlockStored events that carried a session_id.", func(s *Stats) uint64 { return s.SessionStores }},
	{"UnknownRemoves", "stream_unknown_removes_total", "unknown_removes", "Removed hashes the replica did not hold.", func(s *Stats) uint64 { return s.UnknownRemoves }},
	{"IndexErrors", "stream_index_errors_total", "index_errors", "Index calls that failed (replica removed under the stream).", func(s *Stats) uint64 { return s.IndexErrors }},
	{"BlockSizeMismatches", "block_size_mismatches_total", "block_size_mismatches", "BlockStored events with another block size than the configured or learned one.", func(s *Stats) uint64 { return s.BlockSizeMismatches }},
	{"ParityChecked", "parity_checked_total", "parity_checked", "Blocks whose vLLM hash was recomputed.", func(s *Stats) uint64 { return s.ParityChecked }},
	{"ParityMismatches", "parity_mismatches_total", "parity_mismatches", "Blocks whose vLLM hash differed from the router's (seed/algorithm mismatch).", func(s *Stats) uint64 { return s.ParityMismatches }},
	{"ParitySkipped", "parity_skipped_total", "parity_skipped", "Sampled blocks whose hash could not be recomputed (unmodelled extra keys).", func(s *Stats) uint64 { return s.ParitySkipped }},
}

// CounterSpecs returns every counter's names and help, without values (for metric descriptors).
func CounterSpecs() []Counter {
	out := make([]Counter, len(counterTable))
	for i, c := range counterTable {
		out[i] = Counter{Field: c.field, Metric: c.metric, Key: c.key, Help: c.help, Gauge: gaugeFields[c.field], Drop: dropFields[c.field]}
	}
	return out
}

// Counters returns every counter of s with its value, in CounterSpecs' order.
func (s Stats) Counters() []Counter {
	out := CounterSpecs()
	for i, c := range counterTable {
		out[i].Value = c.get(&s)
	}
	return out
}

// FirstDrops returns the drop counters (Counter.Drop) that grew from prev to cur and are not yet
// in logged, with the increase as Value, and adds them to logged: the router's one WARN per
// kind of drop on a stream. logged belongs to one stream.
func FirstDrops(prev, cur Stats, logged map[string]bool) []Counter {
	var out []Counter
	pc := prev.Counters()
	for i, c := range cur.Counters() {
		if !c.Drop || logged[c.Key] || c.Value <= pc[i].Value {
			continue
		}
		logged[c.Key] = true
		c.Value -= pc[i].Value
		out = append(out, c)
	}
	return out
}
