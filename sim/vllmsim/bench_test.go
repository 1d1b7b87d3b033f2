package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// benchConfig is the "fast timing model": steps take no simulated time, so the figure is the
// sim's own CPU cost per request (hashing, scheduling, bookkeeping, HTTP).
func benchConfig() Config {
	cfg := fastConfig()
	cfg.TimeScale = 1e12
	return cfg
}

// benchPrompt shares its first half with every other prompt of the same group.
func benchPrompt(i, n int) []uint32 {
	p := seqTokens(1000*(i%8), n/2)
	for j := range n - n/2 {
		x := uint64(i)<<32 | uint64(j)
		x ^= x >> 31
		x *= 0xbf58476d1ce4e5b9
		x ^= x >> 29
		p = append(p, uint32(10000+x%140000))
	}
	return p
}

// BenchmarkSchedulerRequests: one rank stepped by hand, 1,024-token prompts (half shared,
// sha256 hashing included), 16 output tokens each, 64 in flight.
func BenchmarkSchedulerRequests(b *testing.B) {
	cfg := benchConfig().Defaults()
	h, _ := newBlockHasher(cfg.HashAlgo, cfg.HashSeed)
	rk := newRank(0, &cfg, h, nil)
	b.ReportAllocs()
	b.ResetTimer()
	done := 0
	for i := 0; i < b.N; {
		for ; i < b.N && len(rk.waiting)+len(rk.running) < 64; i++ {
			r := newEngineRequest("r", benchPrompt(i, 1024), 16, uint64(i), simIdentity{})
			_ = r.extendHashes(h, cfg.BlockSize)
			rk.submit(r)
		}
		rk.update(rk.schedule())
		rk.pool.takeEvents()
	}
	for len(rk.waiting)+len(rk.running) > 0 {
		rk.update(rk.schedule())
		rk.pool.takeEvents()
	}
	done = b.N
	b.ReportMetric(float64(done)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkHTTPCompletions: the whole sim over loopback HTTP, non-streaming completions of
// 1,024 token ids (half shared), 16 output tokens, events published on a bound PUB socket.
func BenchmarkHTTPCompletions(b *testing.B) {
	cfg := benchConfig()
	cfg.KVEventsPort = -1
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: time.Minute}
	var next atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(next.Add(1))
			body, _ := json.Marshal(map[string]any{"model": "m", "prompt": benchPrompt(i, 1024), "max_tokens": 16})
			resp, err := client.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}
