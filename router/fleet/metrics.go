// Package fleet holds what the router learns about its engines from the engines themselves.
// Reader is the one reader of their Prometheus /metrics: every figure the router takes from
// there (queue, running, KV-cache use per DP rank, the GPU block count) comes from one scrape
// per engine per interval, pushed to whoever subscribed, never fetched per request.
package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/router/engine"
)

// DefaultInterval is how often the Reader scrapes every engine. vLLM updates its gauges once
// per engine step; a second keeps the queue signal fresh at a cost the benchmark measures
// (docs/router.md: under 0.05 of a core for 100 engines).
const DefaultInterval = time.Second

// maxPage bounds one /metrics answer: a vLLM page is tens of kilobytes; anything far past that
// is not read.
const maxPage = 8 << 20

// Rank is one DP rank's figures (vLLM labels them engine="<rank>").
type Rank struct {
	// Waiting and Running are vllm:num_requests_waiting and vllm:num_requests_running.
	Waiting, Running int
	// KVUsage is vllm:kv_cache_usage_perc (0..1), or the deprecated vllm:gpu_cache_usage_perc
	// from engines that only export that.
	KVUsage float64
}

// Sample is one engine's page, read at At.
type Sample struct {
	At time.Time
	// Ranks is indexed by DP rank; a rank the page did not mention is zero.
	Ranks []Rank
	// GPUBlocks is num_gpu_blocks from vllm:cache_config_info (0: not shown).
	GPUBlocks int
	// BlockSize is block_size from vllm:cache_config_info (0: not shown). vLLM exports every
	// CacheConfig field as a label of that gauge (vllm/v1/metrics/loggers.py,
	// log_metrics_info("cache_config", ...)), so an engine says its block size without events.
	BlockSize int
}

// Rank returns rank r's figures and whether the page had them.
func (s *Sample) Rank(r int) (Rank, bool) {
	if s == nil || r < 0 || r >= len(s.Ranks) {
		return Rank{}, false
	}
	return s.Ranks[r], true
}

// maxBlockSize bounds the block size this reader accepts from a page (vLLM's largest choices are
// a few hundred tokens; a larger figure is not a block size the router should key with).
const maxBlockSize = 1 << 16

// maxRanks bounds the engine label this reader accepts (a DP size far beyond any deployment).
const maxRanks = 1024

// Parse reads the figures the router uses from a vLLM Prometheus text page (ParseFor vLLM).
func Parse(page []byte) (Sample, error) { return ParseFor(engine.VLLM, page) }

// ParseFor reads the figures the router uses from a Prometheus text page of a kind engine, by
// that engine's names (engine.Metrics). It looks at the lines of the metrics it knows and skips
// the rest by their first bytes, so a page of histograms costs little more than reading it.
func ParseFor(kind engine.Kind, page []byte) (Sample, error) {
	m := kind.Profile().Metrics
	// vLLM engines that only export the deprecated usage gauge still report their usage.
	oldUsage := ""
	if kind.Or(engine.VLLM) == engine.VLLM {
		oldUsage = "vllm:gpu_cache_usage_perc"
	}
	prefix := commonPrefix(m.Waiting, m.Running, m.KVUsage, m.ConfigInfo, oldUsage)
	var s Sample
	var usageNew, usageOld []float64
	var seenNew, seenOld []bool
	for len(page) > 0 {
		line := page
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i], page[i+1:]
		} else {
			page = nil
		}
		if len(line) <= len(prefix) || !bytes.HasPrefix(line, prefix) {
			continue
		}
		name, labels, value, ok := splitSample(line)
		if !ok || len(name) == 0 {
			continue
		}
		switch string(name) {
		case m.Waiting, m.Running, m.KVUsage, oldUsage:
		case m.ConfigInfo:
			configInfo(&s, m, labels)
			continue
		default:
			continue
		}
		rank := 0
		if v, ok := label(labels, m.RankLabel); ok && m.RankLabel != "" {
			n, err := strconv.Atoi(string(v))
			if err != nil || n < 0 || n >= maxRanks {
				return s, fmt.Errorf("fleet: %s has %s=%q, not a DP rank", name, m.RankLabel, v)
			}
			rank = n
		}
		f, err := strconv.ParseFloat(string(value), 64)
		if err != nil {
			return s, fmt.Errorf("fleet: %s: %w", name, err)
		}
		for len(s.Ranks) <= rank {
			s.Ranks = append(s.Ranks, Rank{})
			usageNew, usageOld = append(usageNew, 0), append(usageOld, 0)
			seenNew, seenOld = append(seenNew, false), append(seenOld, false)
		}
		switch string(name) {
		case m.Waiting:
			s.Ranks[rank].Waiting = int(f)
		case m.Running:
			s.Ranks[rank].Running = int(f)
		case m.KVUsage:
			usageNew[rank], seenNew[rank] = f, true
		case oldUsage:
			usageOld[rank], seenOld[rank] = f, true
		}
	}
	for r := range s.Ranks {
		switch {
		case seenNew[r]:
			s.Ranks[r].KVUsage = usageNew[r]
		case seenOld[r]:
			s.Ranks[r].KVUsage = usageOld[r]
		}
	}
	return s, nil
}

// configInfo reads the block size and GPU block count from the cache configuration gauge's
// labels (vLLM exports every CacheConfig field as a label of vllm:cache_config_info,
// vllm/v1/metrics/loggers.py; SGLang its page_size).
func configInfo(s *Sample, m engine.Metrics, labels []byte) {
	if v, ok := label(labels, m.GPUBlocksLabel); ok && m.GPUBlocksLabel != "" {
		if n, err := strconv.Atoi(string(v)); err == nil && n > 0 {
			s.GPUBlocks = n
		}
	}
	if v, ok := label(labels, m.BlockSizeLabel); ok && m.BlockSizeLabel != "" {
		if n, err := strconv.Atoi(string(v)); err == nil && n > 0 && n <= maxBlockSize {
			s.BlockSize = n
		}
	}
}

// commonPrefix is the longest prefix the non-empty names share: a line without it names none of
// them.
func commonPrefix(names ...string) []byte {
	var p string
	first := true
	for _, n := range names {
		if n == "" {
			continue
		}
		if first {
			p, first = n, false
			continue
		}
		i := 0
		for i < len(p) && i < len(n) && p[i] == n[i] {
			i++
		}
		p = p[:i]
	}
	return []byte(p)
}

// splitSample cuts `name{labels} value [timestamp]` into its parts.
func splitSample(line []byte) (name, labels, value []byte, ok bool) {
	end := bytes.IndexAny(line, "{ ")
	if end < 0 {
		return nil, nil, nil, false
	}
	name, rest := line[:end], line[end:]
	if rest[0] == '{' {
		c := bytes.LastIndexByte(rest, '}')
		if c < 0 {
			return nil, nil, nil, false
		}
		labels, rest = rest[1:c], rest[c+1:]
	}
	rest = bytes.TrimLeft(rest, " ")
	if sp := bytes.IndexByte(rest, ' '); sp >= 0 {
		rest = rest[:sp]
	}
	return name, labels, rest, len(rest) > 0
}

// label finds key="value" among a sample's labels (vLLM's label values carry no escaped quotes
// in the labels read here).
func label(labels []byte, key string) ([]byte, bool) {
	for len(labels) > 0 {
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return nil, false
		}
		k := bytes.TrimLeft(labels[:eq], " ,")
		rest := labels[eq+2:]
		q := bytes.IndexByte(rest, '"')
		for q > 0 && rest[q-1] == '\\' {
			n := bytes.IndexByte(rest[q+1:], '"')
			if n < 0 {
				return nil, false
			}
			q += n + 1
		}
		if q < 0 {
			return nil, false
		}
		if string(k) == key {
			return rest[:q], true
		}
		labels = rest[q+1:]
	}
	return nil, false
}

// Target is one engine the Reader scrapes.
type Target struct {
	Name string
	URL  string // base URL; the page is URL + "/metrics"
}

// ReaderOptions configure a Reader.
type ReaderOptions struct {
	// Client makes the requests (the router's engine client, which carries its credentials).
	Client *http.Client
	// Interval between rounds (DefaultInterval); Timeout per page (the interval).
	Interval, Timeout time.Duration
	// Parallel bounds the pages read at once (16).
	Parallel int
	// OnSample receives every engine's page as it is read (from the round's goroutines);
	// OnError every failed read. Either may be nil.
	OnSample func(engine string, s *Sample)
	OnError  func(engine string, err error)
	Now      func() time.Time
	// Kind is the engines' kind: the page's path and names (vLLM when unset).
	Kind engine.Kind
}

// Reader scrapes a changing set of engines every interval.
type Reader struct {
	o       ReaderOptions
	mu      sync.Mutex
	targets []Target
	bufs    sync.Pool
}

// NewReader returns a Reader with no targets.
func NewReader(o ReaderOptions) *Reader {
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 2}}
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = o.Interval
	}
	if o.Parallel <= 0 {
		o.Parallel = 16
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Reader{o: o, bufs: sync.Pool{New: func() any { return new(bytes.Buffer) }}}
}

// SetTargets replaces the engines scraped from the next round on.
func (r *Reader) SetTargets(ts []Target) {
	r.mu.Lock()
	r.targets = append([]Target(nil), ts...)
	r.mu.Unlock()
}

// Run scrapes every interval until ctx ends.
func (r *Reader) Run(ctx context.Context) {
	t := time.NewTicker(r.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Round(ctx)
		}
	}
}

// Round scrapes every target once, at most Parallel at a time, and returns when all are done.
func (r *Reader) Round(ctx context.Context) {
	r.mu.Lock()
	ts := r.targets
	r.mu.Unlock()
	sem := make(chan struct{}, r.o.Parallel)
	var wg sync.WaitGroup
	for _, t := range ts {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			s, err := r.Read(ctx, t.URL)
			switch {
			case err != nil && r.o.OnError != nil:
				r.o.OnError(t.Name, err)
			case err == nil && r.o.OnSample != nil:
				r.o.OnSample(t.Name, &s)
			}
		}()
	}
	wg.Wait()
}

// ErrStatus is returned for an engine that answered /metrics with a status other than 200.
var ErrStatus = errors.New("fleet: /metrics answered")

// Read fetches and parses one engine's page.
func (r *Reader) Read(ctx context.Context, base string) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+r.o.Kind.Profile().Metrics.Path, nil)
	if err != nil {
		return Sample{}, err
	}
	resp, err := r.o.Client.Do(req)
	if err != nil {
		return Sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Drained so the connection is kept for the next round.
		_, derr := io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return Sample{}, errors.Join(fmt.Errorf("%w %d", ErrStatus, resp.StatusCode), derr)
	}
	buf := r.bufs.Get().(*bytes.Buffer)
	defer r.bufs.Put(buf)
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, maxPage)); err != nil {
		return Sample{}, err
	}
	s, err := ParseFor(r.o.Kind, buf.Bytes())
	s.At = r.o.Now()
	return s, err
}
