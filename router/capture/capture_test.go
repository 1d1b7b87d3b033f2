package capture

import (
	"bytes"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/sim/fleet"
)

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func concat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func newTest(t *testing.T, o Options) *Recorder {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	clock := time.Unix(1000, 0)
	o.Now = func() time.Time { return clock }
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func readAll(t *testing.T, dir string) (*fleet.Trace, []string) {
	t.Helper()
	names, err := Files(dir)
	if err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	tr, err := fleet.ReadTrace(&all)
	if err != nil {
		t.Fatalf("the capture is not a trace kvbench reads: %v", err)
	}
	return tr, names
}

// The block rule: chained ids per 512-token chunk, the partial last chunk included; a shared
// prefix shares ids, a different adapter or cache salt shares none; ids are dense from 0.
func TestCaptureIsMooncakeWithChainedDenseIDs(t *testing.T) {
	dir := t.TempDir()
	r := newTest(t, Options{Dir: dir})
	sys := seq(1000, 1024) // two full blocks
	at := time.Unix(1000, 0)
	r.Observe(Request{Arrival: at, Tokens: concat(sys, seq(50000, 100)), OutputTokens: 7})
	r.Observe(Request{Arrival: at.Add(1500 * time.Millisecond), Tokens: concat(sys, seq(60000, 512)), OutputTokens: 3})
	r.Observe(Request{Arrival: at.Add(2 * time.Second), Tokens: concat(sys, seq(50000, 100)), Identity: Identity{CacheSalt: "t1"}})
	r.Observe(Request{Arrival: at.Add(3 * time.Second), Tokens: concat(sys, seq(50000, 100))})
	r.Observe(Request{Arrival: at.Add(4 * time.Second), Tokens: concat(sys, seq(50000, 512))}) // the partial chunk grown full
	r.Observe(Request{Arrival: at.Add(5 * time.Second), Tokens: concat(sys, seq(50000, 100)), Multimodal: true})
	r.Observe(Request{Arrival: at.Add(6 * time.Second), Tokens: concat(sys, seq(50000, 100)), Multimodal: true})
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	tr, _ := readAll(t, dir)
	want := []struct {
		ms   int64
		in   int
		out  int
		hash []uint64
	}{
		{0, 1124, 7, []uint64{0, 1, 2}},
		{1500, 1536, 3, []uint64{0, 1, 3}},
		{2000, 1124, 0, []uint64{4, 5, 6}},
		{3000, 1124, 0, []uint64{0, 1, 2}},
		{4000, 1536, 0, []uint64{0, 1, 7}},
		{5000, 1124, 0, []uint64{8, 9, 10}}, // media not in the ids: shared with nothing
		{6000, 1124, 0, []uint64{11, 12, 13}},
	}
	if len(tr.Requests) != len(want) {
		t.Fatalf("%d requests, want %d", len(tr.Requests), len(want))
	}
	for i, w := range want {
		q := tr.Requests[i]
		if q.TimestampMs != w.ms || q.InputLength != w.in || q.OutputLength != w.out || !equal(q.HashIDs, w.hash) {
			t.Errorf("line %d = %+v, want %+v", i, q, w)
		}
	}
	if got := testutil.ToFloat64(r.records); got != 7 {
		t.Fatalf("records_total %v, want 7", got)
	}
}

// Each line says how many replicas the router could route the request to, so a trial replays
// the fleet's membership (a scale-up); a request without it writes no field.
func TestCaptureRecordsFleetSize(t *testing.T) {
	dir := t.TempDir()
	r := newTest(t, Options{Dir: dir})
	at := time.Unix(1000, 0)
	r.Observe(Request{Arrival: at, Tokens: seq(1, 600), Replicas: 2})
	r.Observe(Request{Arrival: at.Add(time.Second), Tokens: seq(1, 600), Replicas: 4})
	r.Observe(Request{Arrival: at.Add(2 * time.Second), Tokens: seq(1, 600)})
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	tr, names := readAll(t, dir)
	var got []int
	for _, q := range tr.Requests {
		got = append(got, q.Replicas)
	}
	if !reflect.DeepEqual(got, []int{2, 4, 0}) {
		t.Errorf("replicas per line %v, want [2 4 0]", got)
	}
	b, err := os.ReadFile(names[0])
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `"replicas"`); n != 2 {
		t.Errorf("%d lines carry \"replicas\", want 2:\n%s", n, b)
	}
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Two captures of the same traffic have unrelated keyed hashes (the salt is per capture) and
// the file holds neither token ids nor the keyed hashes.
func TestCaptureSaltIsPerCaptureAndNothingRawIsWritten(t *testing.T) {
	toks := seq(123456, 600)
	a, b := newChainer([]byte("salt-a")), newChainer([]byte("salt-b"))
	ha, hb := a.appendChain(nil, toks, Identity{}), b.appendChain(nil, toks, Identity{})
	if len(ha) != 2 || ha[0] == hb[0] || ha[1] == hb[1] {
		t.Fatalf("hashes under two salts: %v, %v", ha, hb)
	}
	dir := t.TempDir()
	r := newTest(t, Options{Dir: dir})
	r.Observe(Request{Arrival: time.Unix(1000, 0), Tokens: toks})
	_ = r.Close()
	names, _ := Files(dir)
	raw, _ := os.ReadFile(names[0])
	for _, tok := range toks[:20] {
		if strings.Contains(string(raw), strconv.Itoa(int(tok))) {
			t.Fatalf("token id %d is in the capture: %s", tok, raw)
		}
	}
	if fi, _ := os.Stat(names[0]); fi.Mode().Perm() != 0o600 {
		t.Fatalf("capture file mode %v, want 0600", fi.Mode().Perm())
	}
}

// Rotation keeps every file under MaxBytes, keeps Files files, and the ids stay one space
// across the files of a capture.
func TestCaptureRotatesAndKeepsNFiles(t *testing.T) {
	dir := t.TempDir()
	r := newTest(t, Options{Dir: dir, MaxBytes: 300, Files: 3})
	sys := seq(1, 512)
	for i := 0; i < 40; i++ {
		r.Observe(Request{Arrival: time.Unix(1000, int64(i)*int64(time.Millisecond)), Tokens: concat(sys, seq(10000+i*600, 600))})
	}
	_ = r.Close()
	tr, names := readAll(t, dir)
	if len(names) != 3 {
		t.Fatalf("%d files kept, want 3: %v", len(names), names)
	}
	for _, n := range names {
		if fi, _ := os.Stat(n); fi.Size() > 300 {
			t.Fatalf("%s is %d bytes, over 300", n, fi.Size())
		}
	}
	// Each line is about 85 bytes: 3 lines a file, so 13 or 14 files were opened.
	if got := testutil.ToFloat64(r.rotations); got < 10 {
		t.Fatalf("%v files opened, want rotation", got)
	}
	for _, q := range tr.Requests {
		if q.HashIDs[0] != 0 {
			t.Fatalf("the shared first block has id %d in a later file, want 0 (one id space per capture)", q.HashIDs[0])
		}
	}
}

// A writer that is behind (a slow disk) never blocks Observe: the record is dropped and counted.
func TestCaptureDropsWhenTheWriterIsBehind(t *testing.T) {
	gate := make(chan struct{})
	o := Options{Dir: t.TempDir(), Queue: 2, Now: func() time.Time { return time.Unix(1000, 0) }}
	r, err := newRecorder(o, func() { <-gate })
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		for i := 0; i < 10; i++ {
			r.Observe(Request{Arrival: time.Unix(1000, 0), Tokens: seq(i, 10)})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Observe blocked on a stuck writer")
	}
	// The writer holds one record at its gate, two wait in the queue: at least 7 dropped.
	if got := testutil.ToFloat64(r.dropped.WithLabelValues(DropQueueFull)); got < 7 {
		t.Fatalf("dropped{queue_full} = %v, want >= 7", got)
	}
	close(gate)
	_ = r.Close()
	r.Observe(Request{Arrival: time.Unix(1000, 0), Tokens: seq(1, 10)})
	if got := testutil.ToFloat64(r.dropped.WithLabelValues(DropClosed)); got != 1 {
		t.Fatalf("dropped{closed} = %v after Close, want 1", got)
	}
	if got := testutil.ToFloat64(r.records); got < 1 || got > 3 {
		t.Fatalf("records_total %v, want the 1..3 that were queued", got)
	}
}

func TestCaptureCountsRequestsWithoutTokensAndBoundsIDs(t *testing.T) {
	dir := t.TempDir()
	r := newTest(t, Options{Dir: dir, MaxIDs: 2})
	r.Observe(Request{Arrival: time.Unix(1000, 0)})
	r.Observe(Request{Arrival: time.Unix(1000, 0), Tokens: seq(1, 1536)}) // 3 blocks, 2 remembered
	r.Observe(Request{Arrival: time.Unix(1000, 0), Tokens: seq(1, 1536)})
	_ = r.Close()
	if got := testutil.ToFloat64(r.dropped.WithLabelValues(DropNoTokens)); got != 1 {
		t.Fatalf("dropped{no_tokens} = %v, want 1", got)
	}
	tr, _ := readAll(t, dir)
	if !equal(tr.Requests[0].HashIDs, []uint64{0, 1, 2}) || !equal(tr.Requests[1].HashIDs, []uint64{0, 1, 3}) {
		t.Fatalf("ids %v, %v: the third block should not be remembered past MaxIDs", tr.Requests[0].HashIDs, tr.Requests[1].HashIDs)
	}
	if got := testutil.ToFloat64(r.unremembered); got != 2 {
		t.Fatalf("ids_unremembered = %v, want 2", got)
	}
	// /debug/engines' capture section reads the same counts.
	st := r.Stats()
	if st.Records != 2 || st.Dropped[DropNoTokens] != 1 || st.Unremembered != 2 || st.Files != 1 || st.Bytes == 0 ||
		st.Dir != dir || len(st.Dropped) != len(dropReasons) {
		t.Fatalf("stats %+v; want 2 records, 1 no_tokens drop, 2 unremembered ids, 1 file, bytes, every reason listed", st)
	}
}

func BenchmarkObserve8kTokens(b *testing.B) {
	r, err := New(Options{Dir: b.TempDir(), Queue: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	toks := seq(1000, 8192)
	b.SetBytes(int64(len(toks) * 4))
	for i := 0; i < b.N; i++ {
		r.Observe(Request{Arrival: time.Now(), Tokens: toks})
	}
}

// The operator sizes the capture volume from the config package's copy of the defaults.
func TestDefaultsMatchTheConfigPackage(t *testing.T) {
	if DefaultMaxBytes != config.DefaultCaptureMaxBytes || DefaultFiles != config.DefaultCaptureFiles {
		t.Fatal("router/config's capture defaults differ from router/capture's")
	}
}
