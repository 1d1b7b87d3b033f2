// Package simproctest starts vllm-sim processes for tests (package simproc): a start that fails
// fails the test with the process's output, the process stops when the test ends, and its output
// is logged when the test failed.
package simproctest

import (
	"cmp"
	"context"
	"testing"

	"github.com/kvroute/kvroute/sim/simproc"
)

// Start runs the vllm-sim binary bin with args on kernel-picked ports (simproc.Start) and
// returns it serving.
func Start(t testing.TB, bin string, opts simproc.Options, args ...string) *simproc.Sim {
	t.Helper()
	s, err := simproc.Start(context.Background(), bin, args, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("%s (%s) output:\n%s", cmp.Or(opts.Name, "vllm-sim"), s.URL, s.Output())
		}
	})
	return s
}
