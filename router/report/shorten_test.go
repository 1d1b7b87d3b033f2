package report

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A long detail is cut to maxDetail bytes with "...", never inside a character: an engine's
// error text in any script stays valid UTF-8 on the KVRoutedModel.
func TestShortenKeepsWholeCharacters(t *testing.T) {
	if got := shorten("short"); got != "short" {
		t.Fatalf("shorten(short) = %q", got)
	}
	for _, unit := range []string{"a", "é", "日本", "🙂"} {
		long := strings.Repeat(unit, maxDetail+1)
		got := shorten(long)
		if len(got) > maxDetail || !strings.HasSuffix(got, "...") || !utf8.ValidString(got) {
			t.Errorf("%q x %d: %d bytes, valid %v, suffix ... %v", unit, maxDetail, len(got), utf8.ValidString(got), strings.HasSuffix(got, "..."))
		}
		if len(got) < maxDetail-3-utf8.UTFMax+1 {
			t.Errorf("%q: cut to %d bytes, more than one character short of %d", unit, len(got), maxDetail)
		}
	}
}
