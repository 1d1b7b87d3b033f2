package main

import (
	"fmt"
	"io"
)

// runHash is replaced by the router-core issue's implementation.
func runHash(args []string, _ io.Reader, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "kvroutectl hash: not implemented yet")
	return 1
}
