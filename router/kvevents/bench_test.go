package kvevents

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
)

const (
	benchPrompts = 256
	benchBlocks  = 32 // blocks per BlockStored (512 tokens of block size 16)
)

// benchPayloads returns encoded batches in steady state: for each prompt one BlockStored of
// benchBlocks blocks (parent nil) and one batch evicting them one BlockRemoved per block, as
// vLLM's pool does, so the index stays small and every stored block is also removed.
func benchPayloads(b *testing.B) [][]byte {
	c, err := kvtest.NewCache(blockkey.AlgoSHA256, "0", testBS)
	if err != nil {
		b.Fatal(err)
	}
	enc := kvwire.NewEncoder()
	var out [][]byte
	for i := range benchPrompts {
		tk := toks(uint32(i), benchBlocks*testBS)
		ev, err := c.Store(tk, 0)
		if err != nil {
			b.Fatal(err)
		}
		var rm []kvwire.Event
		for _, h := range c.Hashes(tk) {
			e, err := c.Evict(h)
			if err != nil {
				b.Fatal(err)
			}
			rm = append(rm, e)
		}
		for _, evs := range [][]kvwire.Event{{ev}, rm} {
			p, err := enc.AppendBatch(nil, &kvwire.Batch{TS: 1, Events: evs, DataParallelRank: kvwire.Some(int64(0))}, kvwire.LayoutMap)
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, p)
		}
	}
	return out
}

// BenchmarkIngest: decode + re-key + index apply, no sockets, one goroutine. blocks/s counts
// stored blocks; each is also removed within the measured work.
func BenchmarkIngest(b *testing.B) {
	for _, bc := range []struct {
		name   string
		parity *Parity
	}{{"parity-off", nil}, {"parity-sampled", &Parity{Algo: blockkey.AlgoSHA256, Seed: "0"}}} {
		b.Run(bc.name, func(b *testing.B) {
			payloads := benchPayloads(b)
			ix := index.New(index.Options{})
			id, _ := ix.AddReplica("e", 0)
			g, err := NewIngester(ix, id, IngestOptions{BlockSize: testBS, Parity: bc.parity})
			if err != nil {
				b.Fatal(err)
			}
			dec := kvwire.NewDecoder()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				for _, p := range payloads[(2*i)%len(payloads) : (2*i)%len(payloads)+2] {
					batch, err := dec.DecodeBatch(p)
					if err != nil {
						b.Fatal(err)
					}
					g.Apply(batch)
				}
			}
			b.StopTimer()
			s := g.Stats()
			if s.ParityMismatches != 0 || s.UnknownRemoves != 0 {
				b.Fatalf("stats %+v", s)
			}
			b.ReportMetric(float64(b.N*benchBlocks)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// BenchmarkEndToEnd: the same batches published on a loopback PUB, received by a Subscriber and
// applied; the clock stops when the last batch is applied. Publisher and subscriber share the
// machine's cores.
func BenchmarkEndToEnd(b *testing.B) {
	payloads := benchPayloads(b)
	ix := index.New(index.Options{})
	sub, err := New(Options{Index: ix, QueueLen: 1 << 16, Ingest: IngestOptions{BlockSize: testBS}})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	p, err := kvtest.NewPublisher(kvtest.Options{Topic: "kv@127.0.0.1@m", Ring: 2*b.N + 2})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	if err := sub.Add(StreamConfig{Engine: "e", Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Topic: p.Topic()}); err != nil {
		b.Fatal(err)
	}
	if err := p.WaitSubscribers(1, 10*time.Second); err != nil {
		b.Fatal(err)
	}
	testkit.WaitFor(b, 10*time.Second, "the ring replayed and the stream exact", func() bool {
		s, _ := sub.Stats("e", 0)
		return s.Replays > 0 && s.State == Exact
	})
	b.ResetTimer()
	for i := range b.N {
		for _, pl := range payloads[(2*i)%len(payloads) : (2*i)%len(payloads)+2] {
			if _, err := p.PublishPayload(pl); err != nil {
				b.Fatal(err)
			}
		}
	}
	want := uint64(2 * b.N)
	deadline := time.Now().Add(60 * time.Second)
	var s Stats
	for {
		s, _ = sub.Stats("e", 0)
		if s.HaveSeq && s.LastSeq+1 >= want {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d batches after 60s: %+v", s.LastSeq+1, want, s)
		}
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*benchBlocks)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(s.Gaps), "gaps")
}
