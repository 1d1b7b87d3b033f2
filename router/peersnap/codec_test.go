package peersnap

import (
	"errors"
	"reflect"
	"testing"

	"github.com/kvroute/kvroute/router/index"
)

func sample() *Snapshot {
	return &Snapshot{
		Taken: 1_700_000_000_000_000_000, Router: "kvrouter-a", KeyScheme: KeyScheme,
		Streams: []Stream{{
			Engine: "e0", Rank: 1, Incarnation: "uid-1/0", Exact: true, HaveSeq: true, LastSeq: 12345,
			Identity: 0xdeadbeefcafef00d, BlockSize: 16, Groups: []Group{{0, true}, {-1, false}},
			Tiers: [index.NumTiers][]index.Entry{
				{{Hash: 1, Key: 11}, {Hash: 2, Key: 22, Extra: 3}},
				{{Hash: 9, Key: 99}},
				nil,
			},
		}, {Engine: "e1"}},
		Approx: []Approx{{Engine: "e2", Rank: 0, Entries: []index.SideEntry{{Key: 7, Exp: 5}, {Key: 8, Exp: -1}}}},
	}
}

func TestRoundTrip(t *testing.T) {
	s := sample()
	got, err := Decode(Encode(nil, s), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, s)
	}
	if got.Blocks() != 5 {
		t.Fatalf("Blocks() = %d, want 5", got.Blocks())
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := Encode(nil, sample())
	bumped := append([]byte(nil), good...)
	bumped[4] = Version + 1
	cases := map[string][]byte{
		"empty":          nil,
		"magic":          append([]byte("XXXX"), good[4:]...),
		"version":        bumped,
		"truncated":      good[:len(good)-3],
		"trailing bytes": append(append([]byte(nil), good...), 0),
	}
	for name, b := range cases {
		if _, err := Decode(b, Limits{}); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: err %v, want ErrFormat", name, err)
		}
	}
	// Over the limits: one stream with two GPU entries, refused under a one-entry cap.
	if _, err := Decode(good, Limits{MaxEntries: 1}); !errors.Is(err, ErrFormat) {
		t.Errorf("entries over the limit: err %v", err)
	}
	if _, err := Decode(good, Limits{MaxStreams: 1}); !errors.Is(err, ErrFormat) {
		t.Errorf("streams over the limit: err %v", err)
	}
	// A count claiming more entries than the bytes left is refused before allocating.
	huge := Encode(nil, &Snapshot{})
	huge = huge[:len(huge)-2] // drop the two zero counts
	huge = append(huge, 0xff, 0xff, 0xff, 0x01)
	if _, err := Decode(huge, Limits{MaxStreams: 1 << 30}); !errors.Is(err, ErrFormat) {
		t.Errorf("huge count: err %v", err)
	}
}

// FuzzDecode: nothing a peer sends crashes the decoder; what decodes re-encodes to the same
// bytes' meaning.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(nil, sample()))
	f.Add(Encode(nil, &Snapshot{}))
	f.Add([]byte("KVRS\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b, Limits{MaxEntries: 1 << 12, MaxStreams: 64})
		if err != nil {
			return
		}
		again, err := Decode(Encode(nil, s), Limits{MaxEntries: 1 << 12, MaxStreams: 64})
		if err != nil {
			t.Fatalf("re-encoded snapshot does not decode: %v", err)
		}
		if !reflect.DeepEqual(s, again) {
			t.Fatalf("re-encoding changed the snapshot")
		}
	})
}
