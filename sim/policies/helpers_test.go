package policies

import (
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/score"
)

const sec = int64(1e9)

func keys(ids ...uint64) []blockkey.Key {
	out := make([]blockkey.Key, len(ids))
	for i, id := range ids {
		out[i] = blockkey.Key(id)
	}
	return out
}

func seq(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

func fleetOf(n int) []score.Candidate {
	c := make([]score.Candidate, n)
	for i := range c {
		c[i] = score.Candidate{ID: string(rune('a' + i)), Healthy: true}
	}
	return c
}

func mustNew(t *testing.T, name string) score.Policy {
	t.Helper()
	p, err := Registry().New(name, score.Options{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
