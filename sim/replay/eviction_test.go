package replay

import (
	"math"
	"testing"
	"time"
)

// The eviction regime's shape: its documents' prefixes exceed one replica's cache and fit the
// fleet's once but not twice; popularity follows the Zipf law it claims; and reuse distances
// straddle one replica's cache, so LRU eviction decides which reuses hit.
func TestEvictionRegimeShape(t *testing.T) {
	const replicas = 4
	groups := EvictionGroups(replicas)
	ws := groups * evictionPrefixBlocks
	fleetKV := replicas * ReplicaCacheTraceBlocks
	if ws <= ReplicaCacheTraceBlocks || ws > fleetKV || 2*ws <= fleetKV {
		t.Fatalf("working set %d trace blocks: want over one replica's %d, within the fleet's %d, and two copies over it",
			ws, ReplicaCacheTraceBlocks, fleetKV)
	}

	const n = 40000
	w, err := Regime("eviction", RegimeOptions{Requests: n, Rate: 10, Replicas: replicas, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	count := make([]int, groups)
	last := map[uint64]int{}       // document -> index of its last request
	blocksBefore := make([]int, n) // trace blocks requested before request i
	var far, near, late, reuses int
	for i, r := range w.Requests {
		if len(r.HashIDs) != evictionPrefixBlocks+evictionSuffixBlocks {
			t.Fatalf("request %d has %d blocks", i, len(r.HashIDs))
		}
		doc := r.HashIDs[0] >> 16
		if r.HashIDs[evictionPrefixBlocks-1] != doc<<16+evictionPrefixBlocks-1 || doc >= uint64(groups) {
			t.Fatalf("request %d: prefix %v is not one of the %d documents", i, r.HashIDs[:evictionPrefixBlocks], groups)
		}
		count[doc]++
		if i > 0 {
			blocksBefore[i] = blocksBefore[i-1] + len(w.Requests[i-1].HashIDs)
		}
		if j, ok := last[doc]; ok {
			reuses++
			// New blocks requested fleet-wide since the document's last use, spread over the
			// replicas: past one replica's cache, an LRU there has turned over.
			d := float64(blocksBefore[i]-blocksBefore[j]) / replicas
			switch {
			case d > ReplicaCacheTraceBlocks:
				far++
			case d < ReplicaCacheTraceBlocks/4:
				near++
			}
			if r.At-w.Requests[j].At > 5*time.Second { // the predicted index's TTL
				late++
			}
		}
		last[doc] = i
	}
	// Zipf: count[k] proportional to (k+1)^-s.
	cdf := zipfCDF(groups, EvictionZipfS)
	for _, k := range []int{0, 9, groups - 1} {
		want := cdf[k]
		if k > 0 {
			want -= cdf[k-1]
		}
		got := float64(count[k]) / n
		// 4 binomial standard deviations.
		if tol := 4 * math.Sqrt(want*(1-want)/n); math.Abs(got-want) > tol {
			t.Errorf("rank %d drawn %.4f of requests, Zipf(s=%.1f) gives %.4f (tolerance %.4f)", k, got, EvictionZipfS, want, tol)
		}
	}
	if count[0] < 5*count[9] || count[9] < 3*count[groups-1] {
		t.Errorf("popularity not skewed: rank 0 %d, rank 9 %d, rank %d %d", count[0], count[9], groups-1, count[groups-1])
	}
	t.Logf("%d documents (%d trace blocks); reuses %d: %.2f within a quarter of a replica's cache, %.2f beyond a whole one; %.2f more than 5 s apart at 10 req/s",
		groups, ws, reuses, float64(near)/float64(reuses), float64(far)/float64(reuses), float64(late)/float64(reuses))
	if float64(near)/float64(reuses) < 0.4 || float64(far)/float64(reuses) < 0.15 {
		t.Errorf("reuse distances do not straddle one replica's cache: %.2f near, %.2f beyond", float64(near)/float64(reuses), float64(far)/float64(reuses))
	}
	if float64(late)/float64(reuses) < 0.2 {
		t.Errorf("only %.2f of reuses come after the 5 s a peer's prediction lives", float64(late)/float64(reuses))
	}
}
