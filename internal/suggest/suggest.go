// Package suggest names the known word nearest a misspelt one (a command-line flag, say), so an
// error can say "did you mean ...". The operator's engine-argument check and vllm-sim's vLLM
// command line share it.
package suggest

// Nearest is the candidate closest to word by edit distance when it is within a third of word's
// length (further away it would be a guess, not a spelling fix), or "". Ties go to the earliest
// candidate, so a sorted list gives a stable answer.
func Nearest(word string, candidates []string) string {
	best, bestD := "", len(word)/3+1
	for _, c := range candidates {
		if d := Distance(word, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// Distance is the Levenshtein distance between a and b, in bytes (meant for ASCII words).
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
