package vllmcli

import (
	"sort"

	"github.com/kvroute/kvroute/internal/suggest"
)

// nearest is the known long flag closest to name, when it is close enough to be a misspelling.
func nearest(name string) string {
	s := spellings()
	sort.Strings(s)
	return suggest.Nearest(name, s)
}
