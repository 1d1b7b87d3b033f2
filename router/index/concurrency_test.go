package index

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConcurrentWritersAndReaders runs one writer per replica stream and several readers, as
// the router does; run with -race. Every writer ends holding a known prefix, which the readers'
// results must never exceed while running and must equal at the end.
func TestConcurrentWritersAndReaders(t *testing.T) {
	ix := New(Options{})
	side := NewPredicted(SideOptions{TTL: time.Second})
	const replicas, blocks, rounds = 4, 64, 200
	keys, hashes := chain(3, blocks)
	ids := make([]ReplicaID, replicas)
	for i := range ids {
		ids[i] = mustAdd(t, ix, "pod", i)
	}
	var writers, readers sync.WaitGroup
	stop := make(chan struct{})
	var clock atomic.Int64 // the readers' shared clock, in nanoseconds
	errs := make(chan string, 16)
	for r, id := range ids {
		writers.Add(1)
		go func() {
			defer writers.Done()
			final := blocks / (r + 1)
			for round := range rounds {
				if err := ix.Store(id, hashes, keys, GPU); err != nil {
					errs <- err.Error()
					return
				}
				if _, err := ix.Remove(id, hashes[final:], GPU); err != nil {
					errs <- err.Error()
					return
				}
				if round%50 == 0 {
					if err := ix.Clear(id); err != nil {
						errs <- err.Error()
						return
					}
				}
			}
			if err := ix.Store(id, hashes[:final], keys[:final], GPU); err != nil {
				errs <- err.Error()
			}
		}()
	}
	for range 3 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			var out []Match
			var pout []uint32
			for {
				select {
				case <-stop:
					return
				default:
				}
				out = ix.Match(keys, out)
				for _, m := range out {
					if m.Blocks > blocks || m.GPU > m.Blocks {
						errs <- "impossible match"
						return
					}
				}
				// One clock for every reader, as the router has: readers that each kept their own
				// drifted apart by more than the TTL, and a prediction at a reader's older time
				// set the expiry back under a newer reader's clock (a flake, not a fault).
				now := time.Unix(0, clock.Add(int64(time.Millisecond)))
				side.Predict(ids[0], keys[:8], now)
				pout = side.Match(keys, now, len(ids), pout)
				if pout[ids[0]] != 8 {
					errs <- "predicted prefix lost"
					return
				}
				if _, ok := ix.ParentKey(ids[1], hashes[0]); ok {
					_, _ = ix.Stats(ids[1])
				}
			}
		}()
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	got := ix.Match(keys, nil)
	for r, id := range ids {
		if want := uint32(blocks / (r + 1)); got[id].Blocks != want {
			t.Errorf("replica %d ends with %d blocks, want %d", r, got[id].Blocks, want)
		}
	}
}
