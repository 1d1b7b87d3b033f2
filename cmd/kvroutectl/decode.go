package main

import (
	"fmt"
	"io"
)

// runDecode is replaced by the router-core issue's implementation.
func runDecode(args []string, _ io.Reader, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "kvroutectl decode: not implemented yet")
	return 1
}
