package index

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
)

// warmIndex builds an Index with replicas replicas, each holding `other` blocks of its own
// plus a share of req: replica r holds the first len(req)*(r+1)/replicas blocks, so the scan
// runs the whole request and replicas drop out along the way.
func warmIndex(b *testing.B, replicas, other int, req []blockkey.Key) *Index {
	b.Helper()
	ix := New(Options{})
	reqHashes := make([]uint64, len(req))
	for i, k := range req {
		reqHashes[i] = engineHash(k)
	}
	for r := range replicas {
		id, err := ix.AddReplica("pod", r)
		if err != nil {
			b.Fatal(err)
		}
		n := len(req) * (r + 1) / replicas
		for lo := 0; lo < n; lo += 16 {
			hi := min(lo+16, n)
			if err := ix.Store(id, reqHashes[lo:hi], req[lo:hi], GPU); err != nil {
				b.Fatal(err)
			}
		}
		keys, hashes := chain(uint64(1000+r), other)
		for lo := 0; lo < other; lo += 16 {
			hi := min(lo+16, other)
			if err := ix.Store(id, hashes[lo:hi], keys[lo:hi], GPU); err != nil {
				b.Fatal(err)
			}
		}
	}
	return ix
}

// reportLatency adds p50/p99 of the per-call samples.
func reportLatency(b *testing.B, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	p := func(q float64) float64 {
		return float64(samples[int(q*float64(len(samples)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(p(0.50), "p50-µs")
	b.ReportMetric(p(0.99), "p99-µs")
	b.ReportMetric(float64(len(samples)), "samples")
}

// BenchmarkMatch: index match only (no key computation, no scoring), one goroutine, 16
// replicas with warm indexes (each also holds 20k unrelated blocks). For a stable p99 run it
// with -benchtime=10000x.
func BenchmarkMatch(b *testing.B) {
	for _, tokens := range []int{32_000, 100_000} {
		b.Run(fmt.Sprintf("tokens=%d/replicas=16", tokens), func(b *testing.B) {
			req, _ := chain(1, tokens/16)
			ix := warmIndex(b, 16, 20_000, req)
			out := make([]Match, 0, ix.Slots())
			samples := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				out = ix.Match(req, out)
				samples = append(samples, time.Since(t0))
			}
			b.StopTimer()
			if out[15].Blocks != uint32(len(req)) {
				b.Fatalf("replica 15 matched %d of %d", out[15].Blocks, len(req))
			}
			reportLatency(b, samples)
		})
	}
}

// BenchmarkApply: index apply only (keys already computed), one goroutine. new: each op
// stores one 16-block BlockStored and removes 16 old blocks, on a replica holding 100k
// blocks (steady state of an engine evicting as it caches). refresh: a full-mode
// re-announcement of 16 held blocks.
func BenchmarkApply(b *testing.B) {
	const batch, held = 16, 100_000
	b.Run("new+evict", func(b *testing.B) {
		ix := New(Options{})
		id, _ := ix.AddReplica("pod", 0)
		keys, hashes := chain(1, held+batch*b.N)
		for lo := 0; lo < held; lo += batch {
			_ = ix.Store(id, hashes[lo:lo+batch], keys[lo:lo+batch], GPU)
		}
		b.ResetTimer()
		for i := range b.N {
			lo := held + i*batch
			if err := ix.StoreNew(id, hashes[lo:lo+batch], keys[lo:lo+batch], GPU); err != nil {
				b.Fatal(err)
			}
			if _, err := ix.Remove(id, hashes[i*batch:(i+1)*batch], GPU); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "blocks/s")
	})
	b.Run("refresh", func(b *testing.B) {
		ix := New(Options{})
		id, _ := ix.AddReplica("pod", 0)
		keys, hashes := chain(1, held)
		for lo := 0; lo < held; lo += batch {
			_ = ix.Store(id, hashes[lo:lo+batch], keys[lo:lo+batch], GPU)
		}
		b.ResetTimer()
		for i := range b.N {
			lo := (i * batch) % held
			if err := ix.Store(id, hashes[lo:lo+batch], keys[lo:lo+batch], GPU); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "blocks/s")
	})
}

// BenchmarkMemory reports HeapInuse growth per (block, replica) entry for n blocks on r
// replicas. shared: every replica holds the same n blocks (a system prompt everyone has);
// disjoint: each replica holds its own n blocks (what cache-aware routing tends towards).
func BenchmarkMemory(b *testing.B) {
	for _, n := range []int{100_000, 300_000} {
		for _, shared := range []bool{true, false} {
			name := fmt.Sprintf("blocks=%d/replicas=16/shared=%v", n, shared)
			b.Run(name, func(b *testing.B) {
				for range b.N {
					b.ReportMetric(memoryPerEntry(b, n, 16, shared), "B/entry")
				}
			})
		}
	}
}

func memoryPerEntry(b *testing.B, n, replicas int, shared bool) float64 {
	b.StopTimer()
	var chains [][]blockkey.Key
	var hs [][]uint64
	for r := range replicas {
		seed := uint64(1)
		if !shared {
			seed = uint64(r + 1)
		}
		k, h := chain(seed*uint64(n), n)
		chains, hs = append(chains, k), append(hs, h)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.StartTimer()
	ix := New(Options{})
	for r := range replicas {
		id, _ := ix.AddReplica("pod", r)
		for lo := 0; lo < n; lo += 16 {
			hi := min(lo+16, n)
			_ = ix.Store(id, hs[r][lo:hi], chains[r][lo:hi], GPU)
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(ix)
	runtime.KeepAlive(chains) // the inputs were in "before"; they must not be freed before "after"
	runtime.KeepAlive(hs)
	return float64(after.HeapInuse-before.HeapInuse) / float64(n*replicas)
}

// BenchmarkPredicted: match a 32k-token request against the predicted index and record the
// decision, one goroutine, at 100 decisions per second of simulated time (1M records live).
func BenchmarkPredicted(b *testing.B) {
	s := NewPredicted(SideOptions{TTL: 5 * time.Second})
	req, _ := chain(1, 2000)
	now := time.Unix(0, 0)
	for r := range 16 {
		s.Predict(ReplicaID(r), req[:100*(r+1)], now)
	}
	out := make([]uint32, 16)
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		now = now.Add(10 * time.Millisecond) // 100 decisions/s of 2000 blocks
		t0 := time.Now()
		out = s.Match(req, now, 16, out)
		s.Predict(ReplicaID(i%16), req, now)
		samples = append(samples, time.Since(t0))
	}
	b.StopTimer()
	if out[(b.N-1)%16] != 2000 && b.N > 16 {
		b.Fatalf("predicted prefix %v", out)
	}
	reportLatency(b, samples)
}
