package fleet

import (
	"sync"
	"testing"

	"github.com/kvroute/kvroute/router/kvevents"
)

func TestBlockSizePrecedence(t *testing.T) {
	learned := &View{LearnedBlockSize: 32}
	announced := &View{DiscoveryBlockSize: 16}
	for _, c := range []struct {
		configured int
		views      []*View
		size       int
		from       string
	}{
		{0, nil, 0, BlockSizeUnknown},
		{0, []*View{{}, learned}, 32, BlockSizeFromEvents},
		{0, []*View{learned, announced}, 16, BlockSizeFromDiscovery},
		{64, []*View{learned, announced}, 64, BlockSizeFromConfig},
	} {
		if size, from := BlockSize(c.configured, c.views); size != c.size || from != c.from {
			t.Errorf("configured %d: got %d from %s, want %d from %s", c.configured, size, from, c.size, c.from)
		}
	}
}

// A view is exact only with a stream that is Exact and not demoted; every change publishes a new
// view and leaves the one a reader holds as it was.
func TestViewExactAndImmutable(t *testing.T) {
	r := &Replica{Stream: true}
	r.view.Store(&View{StreamState: kvevents.Approximate})
	held := r.View()
	r.update(func(v *View) { v.StreamState = kvevents.Exact })
	if !r.View().Exact || held.Exact || held.StreamState != kvevents.Approximate {
		t.Fatalf("after exact: now %+v, held %+v", r.View(), held)
	}
	r.update(func(v *View) { v.Demoted = true })
	if r.View().Exact {
		t.Fatal("a demoted replica is not exact")
	}
	noStream := &Replica{}
	noStream.view.Store(&View{})
	noStream.update(func(v *View) { v.StreamState = kvevents.Exact })
	if noStream.View().Exact {
		t.Fatal("a replica without a stream is never exact")
	}
}

// Concurrent writers of different facts (the stream's worker, the /metrics reader, the health
// loop) lose none of them.
func TestViewConcurrentUpdates(t *testing.T) {
	r := &Replica{Stream: true}
	r.view.Store(&View{})
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 1; n <= 500; n++ {
				switch i {
				case 0:
					r.update(func(v *View) { v.LearnedBlockSize = n })
				case 1:
					r.update(func(v *View) { v.Figures.Waiting = n })
				case 2:
					r.update(func(v *View) { v.DiscoveryBlockSize = n })
				}
			}
		}()
	}
	wg.Wait()
	if v := r.View(); v.LearnedBlockSize != 500 || v.Figures.Waiting != 500 || v.DiscoveryBlockSize != 500 {
		t.Fatalf("lost an update: %+v", v)
	}
}
