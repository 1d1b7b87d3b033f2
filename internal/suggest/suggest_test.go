package suggest

import "testing"

func TestDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"abc", "", 3}, {"", "ab", 2}, {"kitten", "sitting", 3}, {"utilisation", "utilization", 1}, {"same", "same", 0}} {
		if got := Distance(c.a, c.b); got != c.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestNearest(t *testing.T) {
	known := []string{"--gpu-memory-utilization", "--max-model-len", "--port"}
	if got := Nearest("--gpu-memory-utilisation", known); got != "--gpu-memory-utilization" {
		t.Errorf("a one-letter misspelling: got %q", got)
	}
	if got := Nearest("--completely-different", known); got != "" {
		t.Errorf("nothing within a third of the length: got %q, want none", got)
	}
	if got := Nearest("--pork", []string{"--park", "--port"}); got != "--park" {
		t.Errorf("ties go to the earliest candidate: got %q", got)
	}
}
