// Package fleet is the deterministic fleet model behind `kvbench cache`: a trace of requests is
// routed over N simulated replicas, each with its own LRU block cache and a simple service model,
// and every decision goes through the same score.Policy interface the live router uses.
package fleet

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
)

// TraceBlockTokens is the block size of Mooncake traces: each hash id stands for 512 tokens.
const TraceBlockTokens = 512

// Request is one line of a Mooncake JSONL trace.
type Request struct {
	TimestampMs  int64    `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
	// Replicas, when above 0, is how many replicas the router could route this request to (a
	// kvrouter capture records it; Mooncake's traces do not have it): the fleet model routes it
	// over that many, so a trial replays a scale-up as it happened.
	Replicas int `json:"replicas,omitempty"`
	// Session is filled by the loader (first block id shared by fewer than 1% of requests).
	Session uint64 `json:"-"`
}

// Trace is a loaded trace, in file order (which is timestamp order for the shipped traces).
type Trace struct {
	Name     string
	Requests []Request
}

// LoadTrace reads a Mooncake JSONL trace from a file, or from a directory kvrouter's capture
// wrote (router/capture): its kvroute-capture-*.jsonl files, in name order, as one trace.
func LoadTrace(path string) (*Trace, error) {
	var r io.Reader
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		names, err := filepath.Glob(filepath.Join(path, "kvroute-capture-*.jsonl"))
		if err != nil {
			return nil, err
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("%s: a directory without kvroute-capture-*.jsonl files", path)
		}
		sort.Strings(names)
		var rs []io.Reader
		for _, n := range names {
			f, err := os.Open(n)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			rs = append(rs, f)
		}
		r = io.MultiReader(rs...)
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	t, err := ReadTrace(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	t.Name = path
	return t, nil
}

// ReadTrace parses Mooncake JSONL. Blank lines are skipped; a malformed line is an error naming it.
func ReadTrace(r io.Reader) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	t := &Trace{}
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(trimSpace(b)) == 0 {
			continue
		}
		var q Request
		if err := json.Unmarshal(b, &q); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if q.InputLength < 0 || q.OutputLength < 0 || q.TimestampMs < 0 {
			return nil, fmt.Errorf("line %d: negative timestamp or length", line)
		}
		if len(q.HashIDs) == 0 {
			return nil, fmt.Errorf("line %d: no hash_ids", line)
		}
		if q.InputLength > len(q.HashIDs)*TraceBlockTokens {
			return nil, fmt.Errorf("line %d: input_length %d exceeds %d blocks of %d tokens",
				line, q.InputLength, len(q.HashIDs), TraceBlockTokens)
		}
		t.Requests = append(t.Requests, q)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(t.Requests) == 0 {
		return nil, fmt.Errorf("empty trace")
	}
	// Arrival order must be by time; a stable sort keeps file order among equal timestamps.
	sort.SliceStable(t.Requests, func(i, j int) bool {
		return t.Requests[i].TimestampMs < t.Requests[j].TimestampMs
	})
	assignSessions(t.Requests)
	return t, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// NewTrace makes a trace of generated requests (in timestamp order), with session keys assigned
// as the loader does.
func NewTrace(name string, reqs []Request) *Trace {
	t := &Trace{Name: name, Requests: reqs}
	assignSessions(t.Requests)
	return t
}

// assignSessions sets each request's session key to its first block id that fewer than 1% of
// requests share: shared system prompts are skipped, the conversation's own first block is kept.
// A request whose every block is common falls back to its last block.
func assignSessions(reqs []Request) {
	count := make(map[uint64]int)
	for i := range reqs {
		for _, h := range reqs[i].HashIDs {
			count[h]++
		}
	}
	limit := float64(len(reqs)) * 0.01
	for i := range reqs {
		ids := reqs[i].HashIDs
		reqs[i].Session = ids[len(ids)-1]
		for _, h := range ids {
			if float64(count[h]) < limit {
				reqs[i].Session = h
				break
			}
		}
	}
}

// uncachedTokens is the prompt tokens not covered by the first hit leading blocks: the last block
// of a trace request may be partial.
func uncachedTokens(q *Request, hitBlocks int) int {
	cached := hitBlocks * TraceBlockTokens
	if cached > q.InputLength {
		cached = q.InputLength
	}
	return q.InputLength - cached
}
