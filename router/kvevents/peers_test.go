package kvevents

import (
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
)

func TestPeerTable(t *testing.T) {
	p := NewPeerTable()
	k1, k2 := blockkey.Key(1), blockkey.Key(2)
	p.Observe(k1, 100, 0)
	p.Observe(k1, 100, 1) // agree
	p.Observe(k1, 100, 0) // itself again
	if _, _, ok := p.Mismatches(0); ok {
		t.Fatal("agreeing replicas counted")
	}
	p.Observe(k1, 999, 2)
	if n, peer, ok := p.Mismatches(2); !ok || n != 1 || peer != 0 {
		t.Fatalf("replica 2: %d %d %v", n, peer, ok)
	}
	if n, peer, _ := p.Mismatches(0); n != 1 || peer != 2 {
		t.Fatalf("replica 0: %d %d", n, peer)
	}
	p.Forget(0)
	if _, _, ok := p.Mismatches(0); ok {
		t.Fatal("forgotten replica kept")
	}
	p.MaxKeys = 1
	p.Observe(k2, 1, 3) // full: starts again
	if len(p.first) != 1 {
		t.Fatalf("%d keys kept, bound 1", len(p.first))
	}
}
