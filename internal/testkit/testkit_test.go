package testkit

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

// Build builds a command of this module from another working directory, once: the second
// call returns the same binary without building, and the binary runs.
func TestBuildOnceFromAnyDirectory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	t.Chdir(t.TempDir()) // not inside the module
	bin := Build(t, "./cmd/kvroutectl")
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	if again := Build(t, "./cmd/kvroutectl"); again != bin {
		t.Fatalf("second Build gave %s, want %s", again, bin)
	}
	if fi2, _ := os.Stat(bin); !fi2.ModTime().Equal(fi.ModTime()) {
		t.Fatal("second Build rebuilt the binary")
	}
	if out, err := exec.Command(bin, "--help").CombinedOutput(); !strings.Contains(string(out), "kvroutectl") {
		t.Fatalf("%s --help: %v\n%s", bin, err, out)
	}
}

func TestBuildRejectsPathsOutsideTheModule(t *testing.T) {
	for _, pkg := range []string{"cmd/kvrouter", "../x/cmd/y", "github.com/kvroute/kvroute/cmd/kvrouter"} {
		if _, err := entry(pkg); err == nil {
			t.Errorf("entry(%q) accepted", pkg)
		}
	}
}

func TestLockedBufferConcurrentWrites(t *testing.T) {
	var b LockedBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 800 {
		t.Fatalf("%d bytes, want 800", n)
	}
}

func TestEventuallyReturnsOnceNil(t *testing.T) {
	n := 0
	Eventually(t, 5*time.Second, "third try", func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	WaitFor(t, 5*time.Second, "fifth try", func() bool { n++; return n >= 5 })
}

// Until reports a condition that never holds as false once its timeout passes, and one that
// holds on the fourth look as true, having looked soon after the first (it backs off from 1 ms).
func TestUntil(t *testing.T) {
	if Until(30*time.Millisecond, func() bool { return false }) {
		t.Fatal("Until reported a condition that never held")
	}
	n := 0
	t0 := time.Now()
	if !Until(5*time.Second, func() bool { n++; return n >= 4 }) {
		t.Fatal("Until gave up on a condition that held")
	}
	if took := time.Since(t0); took > time.Second {
		t.Fatalf("three looks took %v; want the first few a few milliseconds apart", took)
	}
}

func TestMetric(t *testing.T) {
	const text = `# HELP x_total a counter
# TYPE x_total counter
x_total_more 9
x_total{agree="false",policy="kv"} 3
x_total{agree="true",policy="kv"} 5
y 2.5
`
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
		ok     bool
	}{
		{"x_total", []string{`agree="true"`}, 5, true},
		{"x_total", []string{`policy="kv"`, `agree="false"`}, 3, true},
		{"x_total", []string{`agree="maybe"`}, 0, false},
		{"x_total", nil, 3, true}, // the first series of the name, not x_total_more
		{"y", nil, 2.5, true},
		{"z", nil, 0, false},
	} {
		if got, ok := Metric(text, tc.name, tc.labels...); got != tc.want || ok != tc.ok {
			t.Errorf("Metric(%s, %v) = %v, %v; want %v, %v", tc.name, tc.labels, got, ok, tc.want, tc.ok)
		}
	}
}
