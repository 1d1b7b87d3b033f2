package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const root = "../.."

// The committed docs are what `make docs` writes: every generated table, the headline and the
// plots. A change to the fleet model, a policy or a result file fails here until `make docs` runs.
func TestDocsAreCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the fleet model over three traces")
	}
	files, err := generate(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "docs/benchmarks.md", "docs/img/fleet-ttft-p90.svg"} {
		if _, ok := files[want]; !ok {
			t.Errorf("the generator wrote no %s (its regions or plot are gone)", want)
		}
	}
	for _, name := range sortedKeys(files) {
		got, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Errorf("%s: %v (run `make docs`)", name, err)
			continue
		}
		if !bytes.Equal(got, files[name]) {
			t.Errorf("%s is not `make docs`'s output; first difference:\n%s", name, firstDiff(string(got), string(files[name])))
		}
	}
}

func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n  committed: " + gl + "\n  generated: " + wl
		}
	}
	return "(none by line)"
}

func TestFillReplacesRegionsAndRejectsUnknownOnes(t *testing.T) {
	doc := "a\n<!-- BEGIN GENERATED: x -->\nold\n<!-- END GENERATED: x -->\nb\n<!-- BEGIN GENERATED: y -->\n<!-- END GENERATED: y -->\n"
	got, err := fill(doc, func(name string) (string, error) { return "new " + name + "\n", nil })
	if err != nil {
		t.Fatal(err)
	}
	want := "a\n<!-- BEGIN GENERATED: x -->\nnew x\n<!-- END GENERATED: x -->\nb\n<!-- BEGIN GENERATED: y -->\nnew y\n<!-- END GENERATED: y -->\n"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := fill("<!-- BEGIN GENERATED: x -->\nold\n", func(string) (string, error) { return "", nil }); err == nil {
		t.Error("a region without its END was accepted")
	}
}

// A bar far beyond the others is clipped so the rest stay readable, and says so.
func TestPlotClipsAnOutlier(t *testing.T) {
	svg := string(barsSVG("t", "n", []panel{{title: "p", bars: []bar{{label: "a", v: 1}, {label: "b", v: 2}, {label: "c", v: 6388}}}}))
	if !strings.Contains(svg, "6388.00 (off scale)") || strings.Contains(svg, "2.00 (off scale)") {
		t.Fatalf("outlier not clipped as expected:\n%s", svg)
	}
}
