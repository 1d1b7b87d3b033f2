// Package capture writes the traffic kvrouter serves as a Mooncake-format trace (one JSON line
// per request: timestamp, input_length, output_length, hash_ids), so that `kvbench cache` and
// `kvbench replay` can trial every policy on a fleet's own traffic before it changes policy.
//
// It works under any policy (round-robin in front of today's fleet included): the block ids
// come from the prompt's token ids, not from the router's index. Privacy: ids are keyed hashes
// under a random per-capture salt that is never written out, renumbered densely in first-seen
// order; no text, token id or router key reaches the file. Bounded: a fixed queue between the
// request path and one writer goroutine (a full queue drops the record and counts it, so a slow
// disk never holds a request), a byte limit per file, and a number of files kept.
package capture

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Options configure a Recorder. Dir is required; the rest have defaults.
type Options struct {
	// Dir receives the files kvroute-capture-<start>-<seq>.jsonl.
	Dir string
	// MaxBytes bounds one file (64 MiB); the next record goes to a new file.
	MaxBytes int64
	// Files is how many files are kept, the one being written included (4); older ones are
	// deleted, from this capture or an earlier one.
	Files int
	// Queue is how many records may wait for the writer (4096).
	Queue int
	// MaxIDs bounds the distinct blocks the dense numbering remembers (1<<20, about 40 MB);
	// past it a new block gets a fresh id that is never reused (reuse is then understated, and
	// counted in kvroute_router_capture_ids_unremembered_total).
	MaxIDs int
	// Now is the clock (time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Defaults of Options.
const (
	DefaultMaxBytes = 64 << 20
	DefaultFiles    = 4
	DefaultQueue    = 4096
	DefaultMaxIDs   = 1 << 20
)

// Request is what the router tells the recorder about one finished request.
type Request struct {
	Arrival time.Time
	// Tokens are the prompt's token ids as the engine renders them. The recorder reads them
	// during Observe only.
	Tokens   []uint32
	Identity Identity
	// OutputTokens is the engine's usage.completion_tokens (0 when it sent no usage).
	OutputTokens int
	// Multimodal requests carry media their token ids do not show (vLLM keys its blocks by
	// the media's hashes too): their chunks get ids of their own, shared with no other request.
	Multimodal bool
	// Replicas is how many replicas (engine ranks) the router could route this request to
	// when it decided (its healthy candidates); 0 when unknown. Written as "replicas", so a
	// trial replays the fleet's membership over time: a scale-up, a replica lost.
	Replicas int
}

// Why a record was not written (the reason label of kvroute_router_capture_dropped_total).
const (
	DropQueueFull  = "queue_full"  // the writer is behind (a slow disk)
	DropNoTokens   = "no_tokens"   // the request was never tokenized (tokenization failed, multimodal)
	DropTooLarge   = "too_large"   // one line is over MaxBytes
	DropWriteError = "write_error" // the file could not be written
	DropClosed     = "closed"      // the recorder was closed
)

var dropReasons = []string{DropQueueFull, DropNoTokens, DropTooLarge, DropWriteError, DropClosed}

// Recorder is one capture: its salt, its id numbering and its files. Observe is safe for
// concurrent use; the writer goroutine owns the files and the numbering.
type Recorder struct {
	o      Options
	start  time.Time
	stamp  string // the capture's start in file names
	chain  *chainer
	queue  chan record
	closeM sync.RWMutex
	closed bool
	done   chan struct{}

	// writer-owned
	ids       map[uint64]uint64
	nextID    uint64
	file      *os.File
	buf       *bufio.Writer
	fileBytes int64
	seq       int
	logM      sync.Mutex // loggedErr is written from Observe and the writer
	loggedErr map[string]bool
	// beforeWrite, set by tests before the writer starts, runs before each record is written.
	beforeWrite func()

	records, bytes, unremembered, rotations, multimodal prometheus.Counter
	nonce                                               atomic.Uint64 // multimodal requests' own chains
	dropped                                             *prometheus.CounterVec
	queued                                              prometheus.GaugeFunc
}

type record struct {
	ms       int64
	input    int
	output   int
	replicas int
	hashes   []uint64
}

// New creates Dir, opens the first file and starts the writer. Close flushes and stops it.
func New(o Options) (*Recorder, error) { return newRecorder(o, nil) }

func newRecorder(o Options, beforeWrite func()) (*Recorder, error) {
	if o.Dir == "" {
		return nil, errors.New("capture: a directory is required")
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.Files <= 0 {
		o.Files = DefaultFiles
	}
	if o.Queue <= 0 {
		o.Queue = DefaultQueue
	}
	if o.MaxIDs <= 0 {
		o.MaxIDs = DefaultMaxIDs
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	salt := make([]byte, 32)
	if _, err := rand.Read(salt); err != nil {
		return nil, fmt.Errorf("capture: salt: %w", err)
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	start := o.Now()
	r := &Recorder{o: o, start: start, stamp: start.UTC().Format("20060102T150405.000Z"),
		chain: newChainer(salt), queue: make(chan record, o.Queue), done: make(chan struct{}),
		ids: make(map[uint64]uint64), loggedErr: map[string]bool{}, beforeWrite: beforeWrite}
	clear(salt) // the chainer holds its own copy; nothing else keeps it
	r.records = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "capture_records_total",
		Help: "Requests written to the capture trace."})
	r.bytes = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "capture_bytes_total",
		Help: "Bytes written to the capture trace."})
	r.rotations = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "capture_files_total",
		Help: "Capture files opened (the first one and every rotation)."})
	r.unremembered = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "capture_ids_unremembered_total",
		Help: "Blocks given a fresh id because the capture's id table was full (their reuse is not visible in the trace)."})
	r.multimodal = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "capture_multimodal_total",
		Help: "Multimodal requests captured with block ids of their own (their media are not in the token ids, so their reuse is not shown)."})
	r.dropped = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute_router", Name: "capture_dropped_total",
		Help: "Requests not written to the capture trace, by reason."}, []string{"reason"})
	for _, why := range dropReasons {
		r.dropped.WithLabelValues(why)
	}
	r.queued = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kvroute_router", Name: "capture_queue_length",
		Help: "Captured requests waiting for the writer."}, func() float64 { return float64(len(r.queue)) })
	if err := r.open(); err != nil {
		return nil, err
	}
	go r.write()
	o.Logger.Info("capturing traffic as a Mooncake trace", "dir", o.Dir, "max_bytes", o.MaxBytes, "files", o.Files)
	return r, nil
}

// Collectors are the recorder's metrics, for the router's registry.
func (r *Recorder) Collectors() []prometheus.Collector {
	return []prometheus.Collector{r.records, r.bytes, r.rotations, r.unremembered, r.multimodal, r.dropped, r.queued}
}

// Stats is what the capture has written and dropped, for /debug/engines (the same counts as
// its metrics, read from them).
type Stats struct {
	Dir          string            `json:"dir"`
	Records      uint64            `json:"records"`
	Bytes        uint64            `json:"bytes"`
	Files        uint64            `json:"files"`
	Queued       int               `json:"queued"`
	Multimodal   uint64            `json:"multimodal"`
	Unremembered uint64            `json:"ids_unremembered"`
	Dropped      map[string]uint64 `json:"dropped"`
}

// Stats reads the recorder's counters.
func (r *Recorder) Stats() Stats {
	st := Stats{Dir: r.o.Dir, Records: counterValue(r.records), Bytes: counterValue(r.bytes), Files: counterValue(r.rotations),
		Queued: len(r.queue), Multimodal: counterValue(r.multimodal), Unremembered: counterValue(r.unremembered),
		Dropped: make(map[string]uint64, len(dropReasons))}
	for _, why := range dropReasons {
		st.Dropped[why] = counterValue(r.dropped.WithLabelValues(why))
	}
	return st
}

// counterValue reads a counter through its own Write (the metric is the one count kept).
func counterValue(c prometheus.Counter) uint64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil || m.Counter == nil {
		return 0
	}
	return uint64(m.Counter.GetValue())
}

// Observe hashes one finished request's prompt and queues it for the writer; it never blocks
// on the writer.
func (r *Recorder) Observe(q Request) {
	if len(q.Tokens) == 0 {
		r.dropped.WithLabelValues(DropNoTokens).Inc()
		return
	}
	if q.Multimodal {
		// A chain no other request has: the cache salt gets this capture's counter after a NUL
		// (its reuse is unknown, so none is claimed).
		q.Identity.CacheSalt = q.Identity.CacheSalt + "\x00multimodal\x00" + strconv.FormatUint(r.nonce.Add(1), 10)
		r.multimodal.Inc()
	}
	ms := max(q.Arrival.Sub(r.start).Milliseconds(), 0)
	rec := record{ms: ms, input: len(q.Tokens), output: max(q.OutputTokens, 0), replicas: max(q.Replicas, 0),
		hashes: r.chain.appendChain(make([]uint64, 0, (len(q.Tokens)+BlockTokens-1)/BlockTokens), q.Tokens, q.Identity)}
	r.closeM.RLock()
	defer r.closeM.RUnlock()
	if r.closed {
		r.dropped.WithLabelValues(DropClosed).Inc()
		return
	}
	select {
	case r.queue <- rec:
	default:
		r.dropped.WithLabelValues(DropQueueFull).Inc()
		r.logOnce(DropQueueFull, "capture writer is behind; records dropped, counted in kvroute_router_capture_dropped_total")
	}
}

// Close writes what is queued, closes the file and stops the writer.
func (r *Recorder) Close() error {
	r.closeM.Lock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
	r.closeM.Unlock()
	<-r.done
	return nil
}

// write is the writer goroutine: the only owner of the id table and the files.
func (r *Recorder) write() {
	defer close(r.done)
	line := make([]byte, 0, 4096)
	for rec := range r.queue {
		if r.beforeWrite != nil {
			r.beforeWrite()
		}
		line = r.appendLine(line[:0], &rec)
		r.emit(line)
		if len(r.queue) == 0 && r.buf != nil {
			if err := r.buf.Flush(); err != nil {
				r.fail(err)
			}
		}
	}
	if r.buf != nil {
		_ = r.buf.Flush()
		_ = r.file.Close()
	}
}

// appendLine renders one Mooncake line, mapping keyed hashes to dense ids.
func (r *Recorder) appendLine(b []byte, rec *record) []byte {
	b = append(b, `{"timestamp": `...)
	b = strconv.AppendInt(b, rec.ms, 10)
	b = append(b, `, "input_length": `...)
	b = strconv.AppendInt(b, int64(rec.input), 10)
	b = append(b, `, "output_length": `...)
	b = strconv.AppendInt(b, int64(rec.output), 10)
	// An extra field Mooncake's readers ignore.
	if rec.replicas > 0 {
		b = append(b, `, "replicas": `...)
		b = strconv.AppendInt(b, int64(rec.replicas), 10)
	}
	b = append(b, `, "hash_ids": [`...)
	for i, h := range rec.hashes {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendUint(b, r.denseID(h), 10)
	}
	return append(b, "]}\n"...)
}

func (r *Recorder) denseID(h uint64) uint64 {
	if id, ok := r.ids[h]; ok {
		return id
	}
	id := r.nextID
	r.nextID++
	if len(r.ids) < r.o.MaxIDs {
		r.ids[h] = id
	} else {
		r.unremembered.Inc()
		r.logOnce("ids_full", "capture id table full; new blocks get ids that are never reused, counted in kvroute_router_capture_ids_unremembered_total",
			"max_ids", r.o.MaxIDs)
	}
	return id
}

func (r *Recorder) emit(line []byte) {
	n := int64(len(line))
	if n > r.o.MaxBytes {
		r.dropped.WithLabelValues(DropTooLarge).Inc()
		r.logOnce(DropTooLarge, "a captured request's line is over capture.maxBytes; dropped", "bytes", n)
		return
	}
	if r.buf == nil || r.fileBytes+n > r.o.MaxBytes {
		if err := r.rotate(); err != nil {
			r.fail(err)
			return
		}
	}
	if _, err := r.buf.Write(line); err != nil {
		r.fail(err)
		return
	}
	r.fileBytes += n
	r.records.Inc()
	r.bytes.Add(float64(n))
}

// fail counts a write error and drops the file: the next record opens a new one.
func (r *Recorder) fail(err error) {
	r.dropped.WithLabelValues(DropWriteError).Inc()
	r.logOnce(DropWriteError, "capture file could not be written; records dropped until a new file opens", "err", err)
	if r.file != nil {
		_ = r.file.Close()
	}
	r.file, r.buf = nil, nil
}

func (r *Recorder) rotate() error {
	if r.buf != nil {
		if err := r.buf.Flush(); err != nil {
			return err
		}
		if err := r.file.Close(); err != nil {
			return err
		}
		r.file, r.buf = nil, nil
	}
	return r.open()
}

// FilePrefix starts every capture file's name.
const FilePrefix = "kvroute-capture-"

func (r *Recorder) open() error {
	r.seq++
	name := filepath.Join(r.o.Dir, fmt.Sprintf("%s%s-%04d.jsonl", FilePrefix, r.stamp, r.seq))
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	r.file, r.buf, r.fileBytes = f, bufio.NewWriterSize(f, 64<<10), 0
	r.rotations.Inc()
	r.prune()
	return nil
}

// prune keeps the newest Files capture files (names sort by start time, then sequence).
func (r *Recorder) prune() {
	names, err := Files(r.o.Dir)
	if err != nil {
		r.logOnce("prune", "capture directory could not be listed; old files not pruned", "err", err)
		return
	}
	for len(names) > r.o.Files {
		if err := os.Remove(names[0]); err != nil {
			r.logOnce("prune", "old capture file could not be removed", "file", names[0], "err", err)
		}
		names = names[1:]
	}
}

// Files lists the capture files in dir, oldest first. Files of one capture (one start stamp)
// share an id space and may be concatenated in this order; files of different captures do not.
func Files(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if n := e.Name(); !e.IsDir() && strings.HasPrefix(n, FilePrefix) && strings.HasSuffix(n, ".jsonl") {
			out = append(out, filepath.Join(dir, n))
		}
	}
	sort.Strings(out)
	return out, nil
}

func (r *Recorder) logOnce(key, msg string, args ...any) {
	r.logM.Lock()
	seen := r.loggedErr[key]
	r.loggedErr[key] = true
	r.logM.Unlock()
	if !seen {
		r.o.Logger.Warn(msg, append(args, "logged", "once")...)
	}
}
