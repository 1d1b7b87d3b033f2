package audit

import (
	"context"
	"regexp"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// shapes are tried in order; the first whose match in the first text overlaps the characters
// where the texts differ names the span.
var shapes = []struct {
	name  string
	re    *regexp.Regexp
	sized bool // the name carries the field's length
}{
	{"<uuid>", regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`), false},
	{"<timestamp>", regexp.MustCompile(`\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2}| ?UTC| ?GMT)?`), false},
	{"<timestamp>", regexp.MustCompile(`(?i)(mon|tue|wed|thu|fri|sat|sun)[a-z]*,? +(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]* +\d{1,2},? +\d{4},? +\d{1,2}:\d{2}(:\d{2})?`), false},
	{"<timestamp>", regexp.MustCompile(`(?i)(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]* +\d{1,2},? +\d{4},? +\d{1,2}:\d{2}(:\d{2})?`), false},
	{"<date>", regexp.MustCompile(`\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}/\d{2,4}|(?i)(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]* +\d{1,2},? +\d{4}`), false},
	{"<time>", regexp.MustCompile(`\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?`), false},
	{"<hex:", regexp.MustCompile(`\b[0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*[0-9][0-9a-fA-F]*\b|\b[0-9a-fA-F]*[0-9][0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*\b`), true},
	{"<digits:", regexp.MustCompile(`\d+`), true},
}

// Shape names the varying field of texts (the same span decoded from each variant, with some
// context): the characters where they differ are found, and the first shape whose match covers
// them wins; otherwise <text:N> for N differing characters. fields are the matched fields.
func Shape(texts []string) (string, []string) {
	if len(texts) == 0 {
		return "<text:0>", nil
	}
	first := texts[0]
	start, end := len(first), 0
	for _, t := range texts[1:] {
		p := commonPrefix(first, t)
		s := commonSuffix(first[p:], t[p:])
		start, end = min(start, p), max(end, len(first)-s)
	}
	if end <= start {
		return "<text:0>", nil
	}
	for _, sh := range shapes {
		for _, m := range sh.re.FindAllStringIndex(first, -1) {
			if m[0] <= start && m[1] >= end || m[0] < end && m[1] > start && m[1]-m[0] >= end-start {
				name := sh.name
				if sh.sized {
					name += strconv.Itoa(utf8.RuneCountInString(first[m[0]:m[1]])) + ">"
				}
				return name, fieldsOf(texts, sh.re)
			}
		}
	}
	n := utf8.RuneCountInString(first[start:end])
	fields := make([]string, 0, len(texts))
	for _, t := range texts {
		fields = append(fields, trimSpace(t))
	}
	return "<text:" + strconv.Itoa(n) + ">", fields
}

func fieldsOf(texts []string, re *regexp.Regexp) []string {
	out := make([]string, 0, len(texts))
	for _, t := range texts {
		out = append(out, re.FindString(t))
	}
	return out
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	for n > 0 && n < len(a) && !utf8.RuneStart(a[n]) {
		n--
	}
	return n
}

func commonSuffix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[len(a)-1-n] == b[len(b)-1-n] {
		n++
	}
	return n
}

func trimSpace(s string) string {
	for len(s) > 0 && unicode.IsSpace(rune(s[0])) {
		s = s[1:]
	}
	return s
}

func itoa(n int) string { return strconv.Itoa(n) }

// ToRunes is a text's characters as audit units (the offline audit's "tokens").
func ToRunes(s string) []uint32 {
	out := make([]uint32, 0, len(s))
	for _, r := range s {
		out = append(out, uint32(r))
	}
	return out
}

// Runes decodes character units (Options.Decode for the offline audit).
func Runes(_ context.Context, units []uint32) (string, error) {
	rs := make([]rune, len(units))
	for i, u := range units {
		rs[i] = rune(u)
	}
	return string(rs), nil
}
