package kvevents

import (
	"encoding/hex"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

// storedEvent builds a BlockStored by hand, as a hostile or buggy publisher could make the
// decoder produce it, with n hashes starting at first.
func storedEvent(first uint64, n int, blockSize int64, tokens []uint32) kvwire.Event {
	hs := make([]kvwire.Hash, n)
	for i := range hs {
		hs[i] = kvwire.IntHash(first + uint64(i))
	}
	return kvwire.Event{Type: kvwire.EventBlockStored, Stored: kvwire.BlockStored{
		BlockHashes: hs, TokenIDs: tokens, BlockSize: blockSize, Medium: kvwire.Some("GPU")}}
}

// No event with inconsistent sizes is applied, none panics, and none sets the learned block size
// (which would re-key every request routed to the fleet): only an event that validated does.
func TestBlockSizeLearnedOnlyFromValidatedEvents(t *testing.T) {
	bad := []struct {
		name string
		ev   kvwire.Event
	}{
		{"issue 15: 4 x 2^62 with no tokens", storedEvent(1, 4, 1<<62, nil)},
		{"overflow to a small product", storedEvent(1, 4, (1<<62)+4, make([]uint32, 16))},
		{"zero", storedEvent(1, 1, 0, nil)},
		{"negative", storedEvent(1, 2, -16, make([]uint32, 32))},
		{"min int64", storedEvent(1, 1, math.MinInt64, nil)},
		{"oversized", storedEvent(1, 1, blockkey.MaxBlockSize+1, make([]uint32, blockkey.MaxBlockSize+1))},
		{"tokens of another size", storedEvent(1, 2, 32, make([]uint32, 32))},
	}
	g, ix, id := newIngest(t, IngestOptions{})
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			before := g.Stats().RekeyErrors
			g.Apply(&kvwire.Batch{Events: []kvwire.Event{tc.ev}})
			s := g.Stats()
			if s.RekeyErrors != before+1 || s.BlockSize != 0 || s.BlocksStored != 0 {
				t.Fatalf("rekey errors %d -> %d, learned block size %d, blocks %d; want +1, 0, 0",
					before, s.RekeyErrors, s.BlockSize, s.BlocksStored)
			}
		})
	}
	if st, _ := ix.Stats(id); st.Blocks[index.GPU] != 0 {
		t.Fatalf("%d blocks indexed from invalid events", st.Blocks[index.GPU])
	}
	g.Apply(&kvwire.Batch{Events: []kvwire.Event{storedEvent(100, 2, testBS, toks(1, 2*testBS))}})
	if s := g.Stats(); s.BlockSize != testBS || s.BlocksStored != 2 || s.BlockSizeMismatches != 0 {
		t.Fatalf("valid event: learned %d, blocks %d, mismatches %d; want %d, 2, 0", s.BlockSize, s.BlocksStored, s.BlockSizeMismatches, testBS)
	}
	// Once learned, another valid size is a mismatch against it, and does not replace it.
	g.Apply(&kvwire.Batch{Events: []kvwire.Event{storedEvent(200, 1, 32, toks(2, 32))}})
	if s := g.Stats(); s.BlockSize != testBS || s.BlockSizeMismatches != 1 {
		t.Fatalf("other size: learned %d, mismatches %d; want %d, 1", s.BlockSize, s.BlockSizeMismatches, testBS)
	}
}

// group_idx comes from the wire: the ingester remembers at most maxGroups of them.
func TestGroupsAreBounded(t *testing.T) {
	g, _, _ := newIngest(t, IngestOptions{BlockSize: testBS})
	for i := range 10 * maxGroups {
		ev := storedEvent(uint64(i*10+1), 1, testBS, toks(uint32(i), testBS))
		ev.Stored.GroupIdx = kvwire.Some(int64(i))
		g.Apply(&kvwire.Batch{Events: []kvwire.Event{ev}})
	}
	if len(g.groups) != maxGroups {
		t.Fatalf("%d groups remembered, want the bound %d", len(g.groups), maxGroups)
	}
	if s := g.Stats(); s.BlocksStored != 10*maxGroups {
		t.Fatalf("%d blocks stored, want %d: groups past the bound are still indexed", s.BlocksStored, 10*maxGroups)
	}
}

// The batch that crashed kvrouter, published over a real PUB socket: it is counted as a decode
// error, and the stream applies the batches around it.
func TestOversizedBlockSizeBatchIsSkipped(t *testing.T) {
	var logBuf testkit.LockedBuffer
	r := newRig(t, Options{Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
	p := newPub(t, kvtest.Options{})
	c := newCache(t)
	r.add("e", p, 0)
	st := must[kvwire.Event](t)
	publish(t, p, st(c.Store(toks(1, 2*testBS), 0)))
	poisonSeq, err := p.PublishPayload(kvtest.OversizedBlockSizeBatch())
	if err != nil {
		t.Fatal(err)
	}
	publish(t, p, st(c.Store(toks(2, 3*testBS), 0)))
	s := r.waitMirror("e", 0, c, Exact)
	if s.DecodeErrors != 1 || s.Panics != 0 || s.Applied != 2 || s.BlockSize != testBS || s.LastSeq != poisonSeq+1 {
		t.Fatalf("decode errors %d, panics %d, applied %d, block size %d, last seq %d; want 1, 0, 2, %d, %d",
			s.DecodeErrors, s.Panics, s.Applied, s.BlockSize, s.LastSeq, testBS, poisonSeq+1)
	}
	log := logBuf.String()
	if !strings.Contains(log, "does not decode") || !strings.Contains(log, "block_size") || strings.Count(log, "event batch skipped") != 1 {
		t.Fatalf("want one WARN naming the block size, got:\n%s", log)
	}
	// A second such batch is counted, not logged again.
	if _, err := p.PublishPayload(kvtest.OversizedBlockSizeBatch()); err != nil {
		t.Fatal(err)
	}
	r.waitStats("e", 0, "second decode error", func(s Stats) bool { return s.DecodeErrors == 2 })
	if n := strings.Count(logBuf.String(), "event batch skipped"); n != 1 {
		t.Fatalf("%d log lines for two undecodable batches, want 1", n)
	}
}

// panicky applies batches through the real ingester but panics on the batch with index panicAt
// (counting from 0) of those it is given.
type panicky struct {
	g       *Ingester
	calls   atomic.Int64
	panicAt int64
}

func (p *panicky) Apply(b *kvwire.Batch) bool {
	if p.calls.Add(1)-1 == p.panicAt {
		var s []uint32
		_ = s[len(b.Events)+5] // an index out of range, as the issue-15 slice was
	}
	return p.g.Apply(b)
}

// A panic in the ingest path is recovered per batch: the batch is skipped and counted, logged
// once with its seq and the start of its payload, and later batches are applied.
func TestPanickingIngesterIsRecovered(t *testing.T) {
	var logBuf testkit.LockedBuffer
	var pk *panicky
	opts := Options{Logger: slog.New(slog.NewTextHandler(&logBuf, nil))}
	opts.wrapApplier = func(g *Ingester) batchApplier { pk = &panicky{g: g, panicAt: 1}; return pk }
	r := newRig(t, opts)
	p := newPub(t, kvtest.Options{NoReplay: true})
	r.add("e", p, 0)
	c := newCache(t)
	st := must[kvwire.Event](t)
	publish(t, p, st(c.Store(toks(1, 2*testBS), 0)))
	skip := newCache(t) // the panicking batch's blocks never reach the index
	ev := st(skip.Store(toks(2, 2*testBS), 0))
	panicSeq := publish(t, p, ev)
	publish(t, p, st(c.Store(toks(3, 3*testBS), 0)))
	s := r.waitMirror("e", 0, c, Exact)
	if s.Panics != 1 || s.Applied != 3 || s.LastSeq != panicSeq+1 {
		t.Fatalf("panics %d, applied %d, last seq %d; want 1, 3, %d", s.Panics, s.Applied, s.LastSeq, panicSeq+1)
	}
	payload, err := kvwire.NewEncoder().AppendBatch(nil, &kvwire.Batch{Events: []kvwire.Event{ev}}, kvwire.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	log := logBuf.String()
	head := hex.EncodeToString(payload[10:40]) // past the array header and ts, which differs
	if strings.Count(log, "panicked the ingest path") != 1 || !strings.Contains(log, "seq="+strconv.FormatUint(panicSeq, 10)) ||
		!strings.Contains(log, head) || !strings.Contains(log, "index out of range") {
		t.Fatalf("want one ERROR with seq %d, payload hex containing %s and the panic; got:\n%s", panicSeq, head, log)
	}
}
