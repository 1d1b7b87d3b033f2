package score

import (
	"sync"
	"time"
)

// Window is one replica's routed prefill inside the balance window at a decision's time, as the
// ledger (router/load) keeps it: the kv policy's token and request bounds read it.
type Window struct {
	// Tokens is the uncached prompt tokens routed to the replica inside the window; Requests
	// the requests routed there inside it (a retracted one keeps its place, with no tokens).
	Tokens   float64
	Requests int
	// Seen is whether the replica has been a healthy candidate of a routed decision; Since
	// (unix ns, the decisions' clock) is when it first was. A younger replica's window is
	// stretched to the oldest one's span.
	Seen  bool
	Since int64
}

// Windows holds every replica's sliding window of routed uncached prompt tokens. The ledger
// owns the one instance of a router (or of a fleet-model run) and records each routed request
// in it; decisions read it into Candidate.Window. Its own lock makes reads safe beside the
// ledger's writes. Reads change nothing: expired entries are dropped when the window is written
// (Routed) and by Expire.
type Windows struct {
	mu   sync.Mutex
	span int64
	m    map[string]*tokenWindow
}

// DefaultWindow is the balance window's length when a policy does not name one.
const DefaultWindow = 60 * time.Second

// NewWindows returns empty windows of the given length (DefaultWindow when not positive).
func NewWindows(span time.Duration) *Windows {
	if span <= 0 {
		span = DefaultWindow
	}
	return &Windows{span: int64(span), m: map[string]*tokenWindow{}}
}

// Span is the windows' length.
func (w *Windows) Span() time.Duration { return time.Duration(w.span) }

// Routed records a request routed to cands[chosen] at nowNs with tokens of uncached prefill: the
// chosen replica's window gets the entry, and every healthy candidate's clock starts if it had
// not (an unhealthy pick, a caller's override, starts its own too).
func (w *Windows) Routed(nowNs int64, cands []Candidate, chosen int, tokens float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for j := range cands {
		if cands[j].Healthy {
			w.startLocked(cands[j].ID, nowNs)
		}
	}
	tw := w.startLocked(cands[chosen].ID, nowNs)
	tw.prune(nowNs, w.span)
	tw.add(nowNs, tokens)
}

// Add records a request another router replica routed to the replica id, seen here at nowNs
// with tokens of uncached prefill (router/peersync): the windows count the fleet's routed work,
// not only this router's, so the bounds compare what every router sent. The replica's clock
// starts if it had not.
func (w *Windows) Add(id string, nowNs int64, tokens float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.startLocked(id, nowNs)
	tw.prune(nowNs, w.span)
	tw.add(nowNs, tokens)
}

func (w *Windows) startLocked(id string, nowNs int64) *tokenWindow {
	tw := w.m[id]
	if tw == nil {
		tw = &tokenWindow{since: nowNs}
		w.m[id] = tw
	}
	return tw
}

// Retract takes back the tokens of a request Routed recorded at atNs on the replica id (its
// attempt failed before the engine took it).
func (w *Windows) Retract(id string, atNs int64, tokens float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if tw := w.m[id]; tw != nil {
		tw.remove(atNs, tokens)
	}
}

// Forget drops a replica's window (it left the fleet).
func (w *Windows) Forget(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, id)
}

// Read is the replica's window at nowNs. It changes nothing.
func (w *Windows) Read(id string, nowNs int64) Window {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.m[id]
	if tw == nil {
		return Window{}
	}
	tokens, n := tw.read(nowNs, w.span)
	return Window{Tokens: tokens, Requests: n, Seen: true, Since: tw.since}
}

// Expire drops the entries that left every window by nowNs, so a replica no longer routed to
// does not keep them (reads skip them either way).
func (w *Windows) Expire(nowNs int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, tw := range w.m {
		tw.prune(nowNs, w.span)
	}
}

// tokenWindow is an exact sliding-window sum: a ring of (time, tokens) entries, oldest first.
// Written by hand: it is a few lines, and the generic ring buffers would box every entry.
type tokenWindow struct {
	at    []int64
	tok   []float64
	head  int // index of the oldest live entry
	n     int // live entries
	total float64
	since int64 // when the replica was first a candidate (unix ns)
}

// read is the total and count of the entries inside the window ending at now, without dropping
// the expired ones: it subtracts the expired head (the entries since the last prune).
func (w *tokenWindow) read(now, span int64) (float64, int) {
	total, n := w.total, w.n
	for j := 0; j < w.n; j++ {
		x := (w.head + j) % len(w.at)
		if w.at[x] > now-span {
			break
		}
		total -= w.tok[x]
		n--
	}
	if n == 0 {
		total = 0 // no float drift survives an empty window
	}
	return total, n
}

// prune drops entries older than now-span.
func (w *tokenWindow) prune(now, span int64) {
	for w.n > 0 && w.at[w.head] <= now-span {
		w.total -= w.tok[w.head]
		w.head = (w.head + 1) % len(w.at)
		w.n--
	}
	if w.n == 0 {
		w.total = 0
	}
}

// remove zeroes the newest live entry (t, tok), if the window still holds it.
func (w *tokenWindow) remove(t int64, tok float64) {
	for j := w.n - 1; j >= 0; j-- {
		x := (w.head + j) % len(w.at)
		if w.at[x] < t {
			return
		}
		if w.at[x] == t && w.tok[x] == tok {
			w.total -= tok
			w.tok[x] = 0
			return
		}
	}
}

// add appends an entry at time t (callers add in non-decreasing time).
func (w *tokenWindow) add(t int64, tok float64) {
	if w.n == len(w.at) {
		// Full: unroll into a ring twice the size.
		size := max(2*len(w.at), 16)
		at, tk := make([]int64, size), make([]float64, size)
		for j := 0; j < w.n; j++ {
			at[j], tk[j] = w.at[(w.head+j)%len(w.at)], w.tok[(w.head+j)%len(w.at)]
		}
		w.at, w.tok, w.head = at, tk, 0
	}
	j := (w.head + w.n) % len(w.at)
	w.at[j], w.tok[j] = t, tok
	w.n++
	w.total += tok
}
