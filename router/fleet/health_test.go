package fleet

import (
	"testing"

	"github.com/kvroute/kvroute/router/kvevents"
)

// The trail keeps each change once, the first trailMax states and a count of the rest, and the
// next trail starts from the latest state.
func TestStateTrail(t *testing.T) {
	var tr stateTrail
	if s, more := tr.drain(); len(s) != 0 || more != 0 {
		t.Fatalf("empty trail drained %v +%d", s, more)
	}
	tr.push(kvevents.Exact)
	tr.push(kvevents.Exact) // no change
	tr.push(kvevents.Replaying)
	tr.push(kvevents.Exact)
	s, more := tr.drain()
	if got := trailPath(s, more); got != "exact>replaying>exact" {
		t.Fatalf("path %q", got)
	}
	if s, more := tr.drain(); trailPath(s, more) != "exact" {
		t.Fatalf("after a drain the trail holds %q, want the latest state only", trailPath(s, more))
	}
	for i := range 20 { // a flapping stream
		tr.push([]kvevents.StreamState{kvevents.Inexact, kvevents.Exact}[i%2])
	}
	s, more = tr.drain()
	if len(s) != trailMax || more != 20-(trailMax-1) {
		t.Fatalf("flapping: %d states +%d, want %d +%d", len(s), more, trailMax, 20-(trailMax-1))
	}
	if got := trailPath(s, more); got != "exact>inexact>exact>inexact>exact>inexact>exact>inexact +13 more" {
		t.Fatalf("path %q", got)
	}
}

func TestMustStoreBlock(t *testing.T) {
	for _, c := range []struct {
		prompt, cached, bs int
		want               bool
	}{
		{64, 0, 16, true},       // nothing cached: four fresh blocks
		{64, 48, 16, false},     // a full hit capped at prompt-1 recomputes one stored block
		{70, 48, 16, true},      // the cap allowed a fourth block, so the fourth is fresh
		{70, 64, 16, false},     // every full block hit; the partial tail is never stored
		{31, 0, 16, true},       // the cap allowed the one full block; it missed, so it is fresh
		{16, 0, 16, false},      // a one-block prompt never hits: its block may be stored already
		{32, 0, 16, true},       // of two blocks the first could have hit and did not
		{64, 0, 0, false},       // block size unknown
		{4096, 4080, 16, false}, // capped full hit of a long prompt
	} {
		if got := MustStoreBlock(c.prompt, c.cached, c.bs); got != c.want {
			t.Errorf("MustStoreBlock(%d, %d, %d) = %v, want %v", c.prompt, c.cached, c.bs, got, c.want)
		}
	}
}
