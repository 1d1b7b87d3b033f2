// Command printversion prints version.Get for version_test.go, which links it with -X flags.
package main

import (
	"os"

	"github.com/kvroute/kvroute/internal/version"
)

func main() { version.Print(os.Stdout, "printversion") }
