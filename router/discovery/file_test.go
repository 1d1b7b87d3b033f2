package discovery

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// writeAtomically replaces the file the way a careful writer (or kubelet) does.
func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// recorder collects what a source reports; wait* helpers block for a bounded time.
type recorder struct {
	snaps chan []Engine
	errs  chan error
	last  []Engine // the newest snapshot a wait has seen, for failure messages
}

func newRecorder() *recorder {
	return &recorder{snaps: make(chan []Engine, 64), errs: make(chan error, 64)}
}

func (r *recorder) update(es []Engine) { r.snaps <- es }

func (r *recorder) waitSnapshot(t *testing.T, desc string, ok func([]Engine) bool) []Engine {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case s := <-r.snaps:
			r.last = s
			if ok(s) {
				return s
			}
		case <-deadline:
			t.Fatalf("no snapshot with %s within 30s; last: %s", desc, show(r.last...))
		}
	}
}

func (r *recorder) waitErr(t *testing.T, want string) {
	t.Helper()
	select {
	case err := <-r.errs:
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("reported error %q, want it to mention %q", err, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no error mentioning %q reported within 30s", want)
	}
}

// show prints every field (Engine's String is the flag syntax, which has no Ready or
// Incarnation).
func show(es ...Engine) string {
	var b strings.Builder
	b.WriteString("[")
	for i, e := range es {
		if i > 0 {
			b.WriteString(" | ")
		}
		fmt.Fprintf(&b, "%s ready=%v incarnation=%q", e.String(), e.Ready, e.Incarnation)
	}
	b.WriteString("]")
	return b.String()
}

func names(es []Engine) string {
	var n []string
	for _, e := range es {
		n = append(n, e.Name)
	}
	return strings.Join(n, ",")
}

// The source polls every 10 ms: in a synctest bubble its ticker and the waits' 30 s bounds run on
// the bubble's clock, so each poll comes as soon as the test waits for one and a lost change
// fails at once instead of after 30 s.
func TestFileSourceReload(t *testing.T) { synctest.Test(t, testFileSourceReload) }

func testFileSourceReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engines")
	writeAtomically(t, path, `# two engines
b=http://10.0.0.2:8000;events=tcp://10.0.0.2:5557

a=http://10.0.0.1:8000 # trailing comment
`)
	rec := newRecorder()
	src := NewFile(path, 10*time.Millisecond, WithErrorHandler(func(err error) { rec.errs <- err }))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = src.Run(ctx, rec.update) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if runErr != nil {
			t.Errorf("Run: %v", runErr)
		}
	})

	first := rec.waitSnapshot(t, "a,b", func(es []Engine) bool { return names(es) == "a,b" })
	if got := first[1].Events; len(got) != 1 || got[0] != "tcp://10.0.0.2:5557" {
		t.Fatalf("b's events = %v", got)
	}

	// Add one, remove one.
	writeAtomically(t, path, "c=http://10.0.0.3:8000\nb=http://10.0.0.2:8000;events=tcp://10.0.0.2:5557\n")
	rec.waitSnapshot(t, "b,c", func(es []Engine) bool { return names(es) == "b,c" })

	// A bad file keeps the last good set and reports the line.
	writeAtomically(t, path, "c=http://10.0.0.3:8000\nd=10.0.0.4:8000\n")
	rec.waitErr(t, "line 2")
	// Only comments: no engines is refused too, never an empty set.
	writeAtomically(t, path, "# nothing\n")
	rec.waitErr(t, "lists no engine")
	// A missing file is reported once and the set kept.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	rec.waitErr(t, "no such file")
	select {
	case s := <-rec.snaps:
		t.Fatalf("a bad, empty or missing file produced a snapshot: %s", show(s...))
	default:
	}

	// Fixing it applies the new set; a change in a field (not the names) is a change too.
	writeAtomically(t, path, "c=http://10.0.0.3:8000;block-size=32\n")
	got := rec.waitSnapshot(t, "c with block size 32", func(es []Engine) bool {
		return names(es) == "c" && es[0].BlockSize == 32
	})
	if !got[0].Ready {
		t.Fatal("a file engine is not Ready")
	}
}

func TestFileSourceStartErrors(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	never := func([]Engine) { t.Error("update called for a file that does not load") }
	if err := NewFile(filepath.Join(dir, "missing"), time.Second).Run(ctx, never); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad")
	writeAtomically(t, bad, "a=http://h:1\na=http://h:2\n")
	if err := NewFile(bad, time.Second).Run(ctx, never); err == nil || !strings.Contains(err.Error(), `line 2: engine "a" is already listed on line 1`) {
		t.Errorf("duplicate: %v", err)
	}
	empty := filepath.Join(dir, "empty")
	writeAtomically(t, empty, "\n# only a comment\n")
	if err := NewFile(empty, time.Second).Run(ctx, never); err == nil || !strings.Contains(err.Error(), "lists no engine") {
		t.Errorf("empty: %v", err)
	}
}

func TestParseEngineListReportsEveryBadLine(t *testing.T) {
	_, err := ParseEngineList([]byte("a=http://h:1\nb=nope\n  # fine\nc=http://h:3;events=\n"))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"line 2:", "line 4:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestStaticSource(t *testing.T) {
	in := []Engine{{Name: "b", URL: "http://h:2", Ready: true, Events: []string{"tcp://h:5"}}, {Name: "a", URL: "http://h:1", Ready: true}}
	src := NewStatic(in)
	in[0].Events[0] = "caller changed its slice"
	for run := range 2 {
		rec := newRecorder()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- src.Run(ctx, rec.update) }()
		got := rec.waitSnapshot(t, "a,b", func(es []Engine) bool { return names(es) == "a,b" })
		if got[1].Events[0] != "tcp://h:5" {
			t.Errorf("run %d: b's events = %v; the source must keep its own copy", run, got[1].Events)
		}
		got[1].Events[0] = "consumer changed its snapshot"
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := CheckSnapshot([]Engine{{Name: "x"}, {Name: "y"}, {Name: "x"}}); err == nil || !strings.Contains(err.Error(), `"x" is listed twice`) {
		t.Errorf("CheckSnapshot on a duplicate: %v", err)
	}
}

// An engines-file line takes snapshot= as --engine does, and a snapshot endpoint alone
// changing is a change of the engine.
func TestParseEngineListSnapshot(t *testing.T) {
	es, err := ParseEngineList([]byte("a=http://h:1;events=tcp://h:5557,tcp://h:5558;snapshot=tcp://h:5700,tcp://h:5701\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || strings.Join(es[0].Snapshot, " ") != "tcp://h:5700 tcp://h:5701" {
		t.Fatalf("got %s", show(es...))
	}
	other := cloneSnapshot(es)
	other[0].Snapshot[1] = "tcp://h:5799"
	if es[0].Snapshot[1] != "tcp://h:5701" || equalSnapshots(es, other) {
		t.Fatalf("clone or Equal ignores the snapshot endpoints: %s vs %s", show(es...), show(other...))
	}
}
