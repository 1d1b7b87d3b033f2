package index_test

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
)

// An ingester applies BlockStored with parent == nil through Store and with a parent through
// StoreNew; a scorer takes, per replica, the larger of the exact and the predicted prefix.
func Example() {
	ix := index.New(index.Options{})
	predicted := index.NewPredicted(index.SideOptions{TTL: 5 * time.Second})
	a, _ := ix.AddReplica("engine-0", 0)
	b, _ := ix.AddReplica("engine-0", 1)

	keys := []blockkey.Key{11, 12, 13, 14}
	tier, _ := index.ParseMedium("GPU")
	_ = ix.Store(a, []uint64{901, 902}, keys[:2], tier) // parent nil
	_ = ix.StoreNew(a, []uint64{903}, keys[2:3], tier)  // parent 902
	predicted.Predict(b, keys, time.Unix(100, 0))       // a decision not yet in events
	_, _ = ix.Remove(a, []uint64{903}, index.GPU)       // evicted

	exact := ix.Match(keys, nil)
	side := predicted.Match(keys, time.Unix(101, 0), ix.Slots(), nil)
	for _, id := range []index.ReplicaID{a, b} {
		fmt.Printf("replica %d: exact %d blocks, predicted %d\n", id, exact[id].Blocks, side[id])
	}
	// Output:
	// replica 0: exact 2 blocks, predicted 0
	// replica 1: exact 0 blocks, predicted 4
}
