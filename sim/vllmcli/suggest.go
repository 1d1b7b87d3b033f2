package vllmcli

import "sort"

// nearest is the known long flag closest to name by edit distance, when it is close enough to
// be a misspelling (a third of the name's length at most).
func nearest(name string) string {
	best, bestD := "", len(name)/3+1
	for _, s := range sortStrings(spellings()) {
		if d := distance(name, s); d < bestD {
			best, bestD = s, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func sortStrings(s []string) []string {
	sort.Strings(s)
	return s
}
