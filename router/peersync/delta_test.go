package peersync

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
)

func sampleBatch() *Batch {
	return &Batch{Peer: "kvrouter-0", Epoch: 42, Seq: 7, Sent: 1e18, SnapshotURL: "http://10.0.0.1:9090/peer/snapshot", Ready: true,
		Deltas: []Delta{
			{Kind: Routed, Request: 1, Replica: "e0/0", Prefill: 900, Tokens: 1000, Keys: []blockkey.Key{1, 2, 3}},
			{Kind: FirstToken, Request: 1, Replica: "e0/0", Tokens: 1000},
			{Kind: Failed, Request: 2, Replica: "e1/0"},
		},
		Totals: []Total{{Replica: "e0/0", Load: Load{0, 1000, 1}}, {Replica: "e1/0"}}}
}

func TestBatchRoundTrip(t *testing.T) {
	b := sampleBatch()
	got, err := DecodeBatch(EncodeBatch(nil, b))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, b) {
		t.Fatalf("got %+v\nwant %+v", got, b)
	}
	enc := EncodeBatch(nil, b)
	for _, bad := range [][]byte{nil, enc[:len(enc)-1], append(append([]byte(nil), enc...), 0), {2}} {
		if _, err := DecodeBatch(bad); !errors.Is(err, ErrFormat) {
			t.Errorf("decode %x: err %v, want ErrFormat", bad, err)
		}
	}
}

func TestShareTakesTotalsAndExpires(t *testing.T) {
	s := NewShare()
	now := time.Unix(100, 0)
	b := sampleBatch()
	s.ApplyPeer(b, now)
	c := *b
	c.Peer, c.Totals = "kvrouter-1", []Total{{Replica: "e0/0", Load: Load{500, 0, 1}}}
	s.ApplyPeer(&c, now.Add(time.Second))
	if got := s.Of("e0/0"); got != (Load{500, 1000, 2}) {
		t.Fatalf("sum of two peers: %+v", got)
	}
	// A later batch replaces the peer's share; an older one is ignored.
	d := *b
	d.Seq, d.Totals = 8, []Total{{Replica: "e0/0", Load: Load{1, 1, 1}}}
	if !s.Apply(&d, now) {
		t.Fatal("a newer batch not taken")
	}
	if s.Apply(b, now) {
		t.Fatal("a stale batch taken") // peers' routed changes would be applied twice (router/app's window)
	}
	if got := s.Of("e0/0"); got != (Load{501, 1, 2}) {
		t.Fatalf("after a newer batch and a stale one: %+v", got)
	}
	if gone := s.Expire(now.Add(500 * time.Millisecond)); len(gone) != 1 || gone[0] != "kvrouter-0" {
		t.Fatalf("expired %v", gone)
	}
	if got := s.Of("e0/0"); got != (Load{500, 0, 1}) {
		t.Fatalf("after kvrouter-0 expired: %+v", got)
	}
	// A restarted peer (new epoch) starts over even with a lower seq.
	e := c
	e.Epoch, e.Seq, e.Totals = c.Epoch+1, 1, nil
	s.ApplyPeer(&e, now.Add(2*time.Second))
	if got := s.Of("e0/0"); got != (Load{}) {
		t.Fatalf("after kvrouter-1 restarted with nothing in flight: %+v", got)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(EncodeBatch(nil, sampleBatch()))
	f.Add(EncodeBatch(nil, &Batch{}))
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := DecodeBatch(p)
		if err != nil {
			return
		}
		again, err := DecodeBatch(EncodeBatch(nil, b))
		if err != nil || !reflect.DeepEqual(b, again) {
			t.Fatalf("re-encoding changed the batch: %v", err)
		}
	})
}
