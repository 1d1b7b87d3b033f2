// Command gendocs rewrites the generated parts of the docs: the fleet-model tables (it runs
// sim/fleet in-process, the code `kvbench cache` runs, on the committed traces), the live-replay
// tables (read from the committed result files docs/results/*.json, each with the commit, command
// and seeds it was measured with), the README's headline, and the SVG plots under docs/img.
// `make docs` runs it; its test fails when the committed docs are not its output.
//
//	go run ./hack/gendocs            # from the repository root
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

func main() {
	root := flag.String("root", ".", "repository root")
	check := flag.Bool("check", false, "write nothing; exit 1 if a file would change")
	flag.Parse()
	files, err := generate(*root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gendocs:", err)
		os.Exit(1)
	}
	stale := 0
	for _, name := range sortedKeys(files) {
		path := filepath.Join(*root, name)
		old, err := os.ReadFile(path)
		if err == nil && bytes.Equal(old, files[name]) {
			continue
		}
		stale++
		if *check {
			fmt.Fprintf(os.Stderr, "gendocs: %s is not current\n", name)
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "gendocs:", err)
			os.Exit(1)
		}
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "gendocs:", err)
			os.Exit(1)
		}
		fmt.Printf("gendocs: wrote %s\n", name)
	}
	if *check && stale > 0 {
		os.Exit(1)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
