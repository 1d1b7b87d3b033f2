package main

import (
	"fmt"
	"strings"
)

// Generated regions are delimited in Markdown by
//
//	<!-- BEGIN GENERATED: name -->
//	...
//	<!-- END GENERATED: name -->
//
// and everything between the two lines is the generator's.
const (
	beginMark = "<!-- BEGIN GENERATED: "
	endMark   = "<!-- END GENERATED: "
	markClose = " -->"
)

// fill replaces the body of every generated region in doc with render(name). A region whose END
// is missing, or whose name render does not know, is an error: a typo must not leave a stale
// table in place.
func fill(doc string, render func(name string) (string, error)) (string, error) {
	var out strings.Builder
	rest := doc
	for {
		i := strings.Index(rest, beginMark)
		if i < 0 {
			out.WriteString(rest)
			return out.String(), nil
		}
		j := strings.Index(rest[i:], markClose)
		if j < 0 {
			return "", fmt.Errorf("unterminated %q", beginMark)
		}
		name := strings.TrimSpace(rest[i+len(beginMark) : i+j])
		headEnd := i + j + len(markClose)
		end := endMark + name + markClose
		k := strings.Index(rest[headEnd:], end)
		if k < 0 {
			return "", fmt.Errorf("region %q has no %q", name, end)
		}
		body, err := render(name)
		if err != nil {
			return "", fmt.Errorf("region %q: %w", name, err)
		}
		out.WriteString(rest[:headEnd])
		out.WriteString("\n")
		out.WriteString(strings.TrimRight(body, "\n"))
		out.WriteString("\n")
		out.WriteString(end)
		rest = rest[headEnd+k+len(end):]
	}
}
