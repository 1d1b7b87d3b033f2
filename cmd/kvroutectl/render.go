package main

import (
	"fmt"
	"io"
)

// runRender is replaced by the foundation issue's implementation.
func runRender(args []string, _ io.Reader, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "kvroutectl render: not implemented yet")
	return 1
}
