// Package audit finds prompts that the prefix cache cannot match from their start: prompts whose
// first block varies (a timestamp, a request id stamped at the start of a system prompt) while
// the blocks after it repeat. No router fixes that; the prompt's author can, once told where.
//
// The router's block keys are chained (a block's key depends on every block before it), so a
// change in block 0 changes every key and hides that the rest repeats. The audit therefore
// hashes each sampled prompt's leading blocks unchained, by content and position: a block that
// recurs at the same position under a different lead is the signature. The varying span is
// localised by comparing the lead's tokens across variants, and reported by shape (e.g.
// <timestamp>, <digits:10>); the text itself is shown only when configured (ShowText).
//
// The same finder runs offline (kvroutectl audit) on request bodies, with characters for
// tokens.
package audit

import (
	"context"
	"encoding/binary"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"
)

// Options configure an Auditor. Zero values take the defaults.
type Options struct {
	// SampleEvery audits one prompt in this many (8).
	SampleEvery int
	// BlockUnits is the unchained block size, in tokens (16, vLLM's default block) or, offline,
	// in characters.
	BlockUnits int
	// LeadBlocks is how far a varying lead may reach: a prompt is matched to earlier ones on
	// its blocks 1..LeadBlocks (8).
	LeadBlocks int
	// MinVariants is how many distinct leads before the same repeated block make a pattern (3).
	MinVariants int
	// MaxAnchors bounds the (position, block) table (4096 entries; least recently seen go).
	MaxAnchors int
	// MaxPatterns bounds the patterns kept (64).
	MaxPatterns int
	// Decode turns a span's units into text for its shape (the engine's /detokenize online;
	// the characters themselves offline). Nil: shapes are <tokens:N>.
	Decode func(ctx context.Context, units []uint32) (string, error)
	// ShowText keeps the varying spans' text in Pattern.Examples (admin port only).
	ShowText bool
	Logger   *slog.Logger
	Now      func() time.Time
}

func (o *Options) defaults() {
	if o.SampleEvery <= 0 {
		o.SampleEvery = 8
	}
	if o.BlockUnits <= 0 {
		o.BlockUnits = 16
	}
	if o.LeadBlocks <= 0 {
		o.LeadBlocks = 8
	}
	if o.MinVariants <= 1 {
		o.MinVariants = 3
	}
	if o.MaxAnchors <= 0 {
		o.MaxAnchors = 4096
	}
	if o.MaxPatterns <= 0 {
		o.MaxPatterns = 64
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// maxVariants bounds the distinct leads kept per anchor.
const maxVariants = 8

// Pattern is one varying lead found before a repeated block.
type Pattern struct {
	ID int `json:"id"`
	// Shape is the varying span's kind: <timestamp>, <date>, <time>, <uuid>, <hex:N>,
	// <digits:N>, <text:N> (N characters), or <tokens:N> without a decoder.
	Shape string `json:"shape"`
	// SpanStart and SpanUnits locate the varying span in the prompt (tokens online, characters
	// offline); the span starts in block SpanStart/BlockUnits.
	SpanStart int `json:"span_start"`
	SpanUnits int `json:"span_units"`
	Block     int `json:"block"`
	// RepeatsFrom is the first block that repeats across the variants (in units, where the
	// chained match could resume if the span were moved after the shared text).
	RepeatsFrom int `json:"repeats_from"`
	// Prompts is how many sampled prompts matched this anchor; Variants how many distinct leads.
	Prompts  int       `json:"prompts"`
	Variants int       `json:"variants"`
	FirstAt  time.Time `json:"first_seen"`
	// Examples are the varying spans' text (ShowText only).
	Examples []string `json:"examples,omitempty"`
	// DecodeError says why the shape could not be read (the engine's /detokenize failed).
	DecodeError string `json:"decode_error,omitempty"`
}

type anchorKey struct {
	pos  int
	hash uint64
}

type anchor struct {
	key      anchorKey
	leads    []lead // distinct leads before this block, first seen first
	prompts  int
	lastSeen uint64 // sample counter, for eviction
	pattern  *Pattern
}

type lead struct {
	hash  uint64
	units []uint32
}

// Auditor is the online finder: Observe from many goroutines, one lock around its tables.
type Auditor struct {
	o       Options
	counter atomic.Uint64

	mu       sync.Mutex
	anchors  map[anchorKey]*anchor
	patterns []*Pattern
	seq      uint64

	work   chan *shapeJob // patterns waiting for their shape (Decode)
	closed bool
	wg     sync.WaitGroup

	sampled prometheus.Counter
	found   prometheus.GaugeFunc
}

// New starts an Auditor; Close stops its shape worker.
func New(o Options) *Auditor {
	o.defaults()
	a := &Auditor{o: o, anchors: map[anchorKey]*anchor{}, work: make(chan *shapeJob, o.MaxPatterns)}
	a.sampled = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "audit_sampled_total",
		Help: "Prompts the prompt audit sampled."})
	a.found = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kvroute_router", Name: "audit_patterns",
		Help: "Varying prompt leads the audit found (a span at the start of prompts whose following blocks repeat)."},
		func() float64 { a.mu.Lock(); defer a.mu.Unlock(); return float64(len(a.patterns)) })
	a.wg.Add(1)
	go a.shapes()
	return a
}

// Collectors are the audit's metrics.
func (a *Auditor) Collectors() []prometheus.Collector {
	return []prometheus.Collector{a.sampled, a.found}
}

// Close stops the shape worker after the queued patterns are shaped.
func (a *Auditor) Close() {
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		close(a.work)
	}
	a.mu.Unlock()
	a.wg.Wait()
}

// Observe samples one prompt (1 in SampleEvery). The units are read during the call only.
func (a *Auditor) Observe(units []uint32) {
	if a.counter.Add(1)%uint64(a.o.SampleEvery) != 0 {
		return
	}
	a.Add(units)
}

// Add audits one prompt unconditionally (the offline audit adds every body).
func (a *Auditor) Add(units []uint32) {
	b := a.o.BlockUnits
	if len(units) < 2*b {
		return // no block after block 0
	}
	a.sampled.Inc()
	n := min(len(units)/b, a.o.LeadBlocks+1)
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = hashUnits(units[i*b : (i+1)*b])
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	// The first block position at which an earlier prompt had the same content: blocks before
	// it are this prompt's lead.
	for pos := 1; pos < n; pos++ {
		an := a.anchors[anchorKey{pos, hashes[pos]}]
		if an == nil {
			continue
		}
		an.prompts++
		an.lastSeen = a.seq
		lh := hashUnits(units[:pos*b])
		known := false
		for _, l := range an.leads {
			known = known || l.hash == lh
		}
		if !known && len(an.leads) < maxVariants {
			an.leads = append(an.leads, lead{hash: lh, units: append([]uint32(nil), units[:pos*b]...)})
		}
		a.update(an)
		return
	}
	// Nothing recurs yet: remember this prompt's blocks as anchors for later ones.
	for pos := 1; pos < n; pos++ {
		k := anchorKey{pos, hashes[pos]}
		a.anchors[k] = &anchor{key: k, prompts: 1, lastSeen: a.seq,
			leads: []lead{{hash: hashUnits(units[:pos*b]), units: append([]uint32(nil), units[:pos*b]...)}}}
	}
	a.evict()
}

// update turns an anchor with enough distinct leads into a pattern (once) or refreshes it.
func (a *Auditor) update(an *anchor) {
	if an.pattern != nil {
		an.pattern.Prompts, an.pattern.Variants = an.prompts, len(an.leads)
		return
	}
	if len(an.leads) < a.o.MinVariants || len(a.patterns) >= a.o.MaxPatterns {
		return
	}
	start, end := varyingSpan(an.leads)
	p := &Pattern{ID: len(a.patterns) + 1, SpanStart: start, SpanUnits: end - start, Block: start / a.o.BlockUnits,
		RepeatsFrom: an.key.pos * a.o.BlockUnits, Prompts: an.prompts, Variants: len(an.leads), FirstAt: a.o.Now(),
		Shape: "<pending>"}
	an.pattern = p
	a.patterns = append(a.patterns, p)
	spans := make([][]uint32, 0, len(an.leads))
	ctx := max(contextUnits, a.o.BlockUnits/2)
	for _, l := range an.leads {
		// The span with a few units of context each side: a shape needs the whole field, and
		// the common prefix may cut into it (two timestamps share their leading digits).
		spans = append(spans, l.units[max(start-ctx, 0):min(end+ctx, len(l.units))])
	}
	if !a.closed {
		a.work <- &shapeJob{p: p, spans: spans} // capacity MaxPatterns: never blocks
	}
}

// contextUnits (or half a block, if more) around a varying span are decoded with it, so that
// the shape sees the whole field even where the variants share its first characters (a 24-unit
// timestamp whose seconds alone differ).
const contextUnits = 12

type shapeJob struct {
	p     *Pattern
	spans [][]uint32
}

// shapes is the worker that decodes spans (an engine call online) off the request path.
func (a *Auditor) shapes() {
	defer a.wg.Done()
	for job := range a.work {
		p := job.p
		shape, examples, derr := a.shape(job)
		a.mu.Lock()
		p.Shape = shape
		if a.o.ShowText {
			p.Examples = examples
		}
		if derr != nil {
			p.DecodeError = derr.Error()
		}
		out := *p
		a.mu.Unlock()
		a.o.Logger.Warn("prompt audit: prompts vary at their start while the rest repeats; the prefix cache cannot match them past the span (move it after the shared text)",
			"pattern", out.ID, "shape", out.Shape, "span_start", out.SpanStart, "span_units", out.SpanUnits,
			"block", out.Block, "repeats_from", out.RepeatsFrom, "variants", out.Variants)
	}
}

func (a *Auditor) shape(job *shapeJob) (string, []string, error) {
	if a.o.Decode == nil {
		return "<tokens:" + itoa(job.p.SpanUnits) + ">", nil, nil
	}
	texts := make([]string, 0, len(job.spans))
	for _, s := range job.spans {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		t, err := a.o.Decode(ctx, s)
		cancel()
		if err != nil {
			return "<tokens:" + itoa(job.p.SpanUnits) + ">", nil, err
		}
		texts = append(texts, t)
	}
	shape, fields := Shape(texts)
	return shape, fields, nil
}

// Patterns returns a copy of the patterns found, first found first.
func (a *Auditor) Patterns() []Pattern {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Pattern, len(a.patterns))
	for i, p := range a.patterns {
		out[i] = *p
		out[i].Examples = append([]string(nil), p.Examples...)
	}
	return out
}

// Sampled is how many prompts were audited.
func (a *Auditor) Sampled() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.seq
}

// evict drops the least recently seen anchors over MaxAnchors (patterns stay).
func (a *Auditor) evict() {
	over := len(a.anchors) - a.o.MaxAnchors
	if over <= 0 {
		return
	}
	all := make([]*anchor, 0, len(a.anchors))
	for _, an := range a.anchors {
		all = append(all, an)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].lastSeen < all[j].lastSeen })
	// Evict a tenth at once so the sort is paid rarely.
	for _, an := range all[:min(len(all), over+a.o.MaxAnchors/10)] {
		delete(a.anchors, an.key)
	}
}

// varyingSpan is the units where the leads differ: after their common prefix and before their
// common suffix (leads before one anchor all have the same length).
func varyingSpan(leads []lead) (start, end int) {
	n := len(leads[0].units)
	start, end = n, 0
	for _, l := range leads[1:] {
		p := 0
		for p < n && l.units[p] == leads[0].units[p] {
			p++
		}
		s := 0
		for s < n-p && l.units[n-1-s] == leads[0].units[n-1-s] {
			s++
		}
		start, end = min(start, p), max(end, n-s)
	}
	if end < start {
		end = start
	}
	return start, end
}

func hashUnits(u []uint32) uint64 {
	b := make([]byte, 4*len(u))
	for i, x := range u {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return xxh3.Hash(b)
}
