package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/tokens"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// benchServer is a Server over n single-rank engines that are never contacted (events off),
// with the index holding part of the prompt on some replicas so Match and scoring do real work.
func benchServer(b testing.TB, n int, toks []uint32) (*Router, []*replica) {
	cfg := config.Default()
	cfg.BlockSize = 16
	cfg.Events.Enabled = false
	s, err := New(Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), PredictedTTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	var es []discovery.Engine
	for i := range n {
		es = append(es, discovery.Engine{Name: fmt.Sprintf("e%02d", i), URL: "http://127.0.0.1:1", Ready: true})
	}
	s.apply(context.Background(), es)
	reps := s.reps()
	for _, r := range reps {
		r.Eng.Health.Probed(nil) // the URL is dead; mark it healthy for the benchmark
	}
	keys, _ := blockkey.AppendPromptKeys(nil, toks, 16, blockkey.Identity{})
	hashes := make([]uint64, len(keys))
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	// Replica i holds the first i/n of the prompt.
	for i, r := range reps {
		m := len(keys) * i / n
		if err := s.ix.Store(r.ID, hashes[:m], keys[:m], index.GPU); err != nil {
			b.Fatal(err)
		}
	}
	return s, reps
}

func promptTokens(n int, seed uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = 1000 + (seed*7919+uint32(i)*31)%100000
	}
	return t
}

func reportPercentiles(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	if len(d) == 0 {
		return
	}
	p := func(q float64) float64 { return float64(d[min(len(d)-1, int(q*float64(len(d))))].Nanoseconds()) / 1e3 }
	b.ReportMetric(p(0.5), "p50-µs")
	b.ReportMetric(p(0.99), "p99-µs")
}

// BenchmarkDecision is keys + index match + side-index match + scoring from token ids, 16
// replicas, the kv policy, with every stream exact (the normal case) or none (every replica
// also read from the approximate index); the side-index record after the decision is in ns/op,
// not in the percentiles. Each request is done in the ledger right after its decision, so every
// iteration starts from the same load (without it routed prefill piles up over b.N, the picks
// drift to a few replicas and the figures measure that drift; the router/server benchmark
// before the split added no load at all).
func BenchmarkDecision(b *testing.B) {
	for _, c := range []struct {
		n     int
		exact bool
	}{{32_000, true}, {100_000, true}, {32_000, false}, {100_000, false}} {
		streams := "exact"
		if !c.exact {
			streams = "approximate"
		}
		n := c.n
		b.Run(fmt.Sprintf("tokens=%dk/streams=%s", n/1000, streams), func(b *testing.B) {
			toks := promptTokens(n, 1)
			s, reps := benchServer(b, 16, toks)
			if c.exact { // whole streams: the approximate index is neither read nor written
				s.exactHook = func(*replica) bool { return true }
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for b.Loop() {
				d, _, err := s.decide(toks, blockkey.Identity{}, "", "", reps, nil, true)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, d.took)
				if _, err := s.ledger.Done(d.id, nil); err != nil {
					b.Fatal(err)
				}
				d.id = 0 // ended, as forward leaves it
				s.release(d)
			}
			b.StopTimer()
			reportPercentiles(b, lat)
		})
	}
}

// BenchmarkDecisionFromJSON adds decoding the OpenAI body (token-id prompt) to the decision.
func BenchmarkDecisionFromJSON(b *testing.B) {
	toks := promptTokens(32_000, 2)
	s, reps := benchServer(b, 16, toks)
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": toks, "max_tokens": 1})
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		r, err := tokens.Parse(tokens.Completion, body)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := s.decide(r.PromptIDs, blockkey.Identity{}, "", "", reps, nil, true); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

// BenchmarkTokenizeAndDecide is a chat request of about 32k tokens rendered by a vllm-sim
// engine over HTTP (a new conversation each time: a render-cache miss), then decided.
func BenchmarkTokenizeAndDecide(b *testing.B) {
	sim, err := vllmsim.New(vllmsim.Config{})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := sim.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	s, reps := benchServer(b, 16, promptTokens(32_000, 3))
	tk := tokens.New(tokens.Options{})
	text := strings.Repeat("routing keeps caches warm. ", 2400) // ~32k tokens at 2 bytes a token
	lat := make([]time.Duration, 0, b.N)
	i := 0
	b.ResetTimer()
	for b.Loop() {
		i++
		body, _ := json.Marshal(map[string]any{"model": "vllm-sim", "messages": []map[string]string{
			{"role": "user", "content": fmt.Sprintf("conversation %d: %s", i, text)}}})
		t0 := time.Now()
		r, err := tokens.Parse(tokens.Chat, body)
		if err != nil {
			b.Fatal(err)
		}
		toks, _, err := tk.Tokens(ctx, sim.URL(), r, body)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := s.decide(toks, blockkey.Identity{}, "", "", reps, nil, true); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

// BenchmarkProxyOverheadTTFT compares the time to the first streamed chunk through the router
// with the same request sent directly, alternating, on one engine with vLLM-like timing at a
// non-saturating load (one request at a time). Each op is one direct and one routed request
// with a fresh prompt (no cache hits on either path); the ratio of medians is reported.
func BenchmarkProxyOverheadTTFT(b *testing.B) {
	sim, err := vllmsim.New(vllmsim.Config{KVEventsPort: -1, KVReplayPort: -1, PrefillTokensPerS: 20000})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := sim.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	cfg := config.Default()
	s, err := New(Options{Config: cfg, Source: discovery.NewStatic([]discovery.Engine{simEngine("e0", sim)}),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(rctx) }()
	defer func() { rcancel(); <-done }()
	<-s.Synced()
	api := httptest.NewServer(s.APIHandler())
	defer api.Close()
	text := strings.Repeat("measure the first token. ", 160) // ~2k tokens: ~100 ms of prefill
	ttft := func(base string, i int) time.Duration {
		body, _ := json.Marshal(map[string]any{"model": "vllm-sim", "max_tokens": 2, "stream": true,
			"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("%d %s", i, text)}}})
		t0 := time.Now()
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 1)
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		_, _ = io.Copy(io.Discard, resp.Body)
		return d
	}
	var direct, routed []time.Duration
	i := 0
	for b.Loop() {
		i += 2
		direct = append(direct, ttft(sim.URL(), i))
		routed = append(routed, ttft(api.URL, i+1))
	}
	slices.Sort(direct)
	slices.Sort(routed)
	md, mr := direct[len(direct)/2], routed[len(routed)/2]
	b.ReportMetric(float64(md.Microseconds())/1e3, "direct-ttft-ms")
	b.ReportMetric(float64(mr.Microseconds())/1e3, "routed-ttft-ms")
	b.ReportMetric(float64(mr)/float64(md), "ratio")
}
